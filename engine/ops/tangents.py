"""Whether a derivative flows through a tensor, in reverse mode or in forward mode.

A forward-mode dual tensor under `torch.no_grad` (how engine/forward runs a plan) has
`requires_grad` False: an op that takes a fast path for a constant on `requires_grad` alone
(a Python-number exponent, a fused kernel that treats an input as constant) would drop its
tangent, and J·v would come out silently wrong. Such a test asks `differentiated` instead.
"""
from __future__ import annotations

import torch
import torch.autograd.forward_ad as fwAD


def differentiated(t: torch.Tensor) -> bool:
    """Autograd records t, or t carries a tangent at the current forward-AD level."""
    if t.requires_grad:
        return True
    # _current_level is -1 outside a dual level: the common case costs an attribute read
    return fwAD._current_level >= 0 and fwAD.unpack_dual(t).tangent is not None

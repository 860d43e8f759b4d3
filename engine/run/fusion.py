"""Plan-level fusion: op-by-op spellings of GELU and attention run as the one kernel eager torch calls.

The torch exporters write `F.gelu` as Div(x, sqrt 2) / Erf / Add 1 / Mul x / Mul 0.5 and
`F.scaled_dot_product_attention` as MatMul / Softmax / MatMul with constant scales; torch's fused
kernels compute (and differentiate) the same functions in fewer passes over memory. A match is
replaced by one step that calls the fused kernel, and that step falls back to the original steps,
replayed in order, whenever a run-time condition fails (dtype, shapes, a scale that needs a
gradient), so a fallback's values are the unfused plan's bit for bit.

What may fuse (checked here; the caller decides when to fuse at all, see `Plan`): every tensor
inside a match is read only by the match's own steps and is none of `protected` (the plan's
sources, targets and the graph's outputs); constants match by value to a few units in the last
place (`_Index.near`), commutative operands in either order, and attention's scales are any
one-element values fixed once the shapes are (constants, shape arithmetic), multiplied at run
time. Fused float results differ from the chain by round-off.
`ONNXGRAD_FUSE=0` (or `Plan(..., fuse=False)`) turns fusion off.
"""
from __future__ import annotations

import math
from typing import Callable, Sequence

import torch
import torch.nn.functional as F

from ..ops import elementwise, nn, reduce
from ..ops.tangents import differentiated
from .fxplan import RANDOM, SHAPE_OPS

FLOATS = (torch.float32, torch.float64)
RAW_FN, RAW_IN, RAW_OUT, RAW_KW = 3, 4, 5, 6  # fields of the raw step lists Plan builds


def slot_readers(steps: list) -> dict[int, list[int]]:
    """slot -> the steps of a raw step list reading it, in order (twice for a step reading it twice)."""
    readers: dict[int, list[int]] = {}
    for k, st in enumerate(steps):
        for s in st[RAW_IN]:
            if s is not None:
                readers.setdefault(s, []).append(k)
    return readers


class _Index:
    """Who produces and who reads each slot of a raw step list, and which slots are constant."""

    def __init__(self, steps: list, protected: set[int], template: dict):
        self.steps, self.protected = steps, protected
        self.producer: dict[int, int] = {}
        self.readers = slot_readers(steps)
        self.values = dict(template)  # slot -> constant tensor (initializers, Constant nodes)
        self.static = set(template)  # slots fixed once the input shapes are (constants, shape arithmetic)
        for k, st in enumerate(steps):
            outs = [s for s in st[RAW_OUT] if s is not None]
            for s in outs:
                self.producer[s] = k
            if st[2] in SHAPE_OPS or (st[2] not in RANDOM and st[2] != "Constant" and st[RAW_IN]
                                      and all(s is None or s in self.static for s in st[RAW_IN])
                                      and not getattr(st[RAW_FN], "no_fold", False)):
                self.static.update(outs)
            elif st[2] == "Constant" and len(outs) == 1:
                try:
                    value = st[RAW_FN](**st[RAW_KW])
                except Exception:  # noqa: BLE001 - an odd Constant simply matches nothing
                    continue
                if isinstance(value, torch.Tensor):
                    self.values[outs[0]] = value
                    self.static.add(outs[0])

    def made_by(self, slot, fn: Callable) -> int | None:
        """The step computing `slot` when it calls `fn` and has that one output."""
        k = self.producer.get(slot)
        if k is not None and self.steps[k][RAW_FN] is fn and len(self.steps[k][RAW_OUT]) == 1:
            return k
        return None

    def only_reader(self, slot) -> int | None:
        readers = self.readers.get(slot, [])
        return readers[0] if len(readers) == 1 and slot not in self.protected else None

    def near(self, slot, want: float) -> bool:
        """`slot` is a one-element float constant equal to `want` within 4 units in the last place
        of its own type: a float32 sqrt 2 promoted to float64 is not float64's sqrt 2, so a float64
        plan of a float32 export keeps its chain (the fused kernel would differ in the 8th digit)."""
        v = self.values.get(slot)
        return (isinstance(v, torch.Tensor) and v.is_floating_point() and v.numel() == 1
                and math.isclose(float(v), want, rel_tol=4 * torch.finfo(v.dtype).eps))

    def pair(self, k: int) -> tuple:
        """The first two input slots of step k (None where it has fewer)."""
        return (tuple(self.steps[k][RAW_IN]) + (None, None))[:2]

    def other(self, k: int, slot) -> int | None:
        """The operand of binary step k that is not `slot` (None unless `slot` is one of the two)."""
        a, b = self.pair(k)
        return b if a == slot else a if b == slot else None


def fuse(steps: list, protected: set[int], template: dict) -> list:
    """`steps` (raw lists: node index, name, op, fn, in slots, out slots, kwargs) with every GELU and
    attention chain replaced by one fused step; the same list when nothing matched."""
    index = _Index(steps, protected, template)
    taken: set[int] = set()
    fused: dict[int, list] = {}  # position of a match's last step -> the fused step
    for k, st in enumerate(steps):
        match = None
        if st[RAW_FN] is elementwise.erf:
            match = _gelu(index, k)
        elif st[RAW_FN] is reduce.softmax:
            match = _attention(index, k)
        if match is None or taken.intersection(match[0]):
            continue
        members, step = match
        if any(s in protected or not set(index.readers.get(s, ())) <= members
               for m in members if m != max(members) for s in steps[m][RAW_OUT]):
            continue
        taken.update(members)
        fused[max(members)] = step
    if not fused:
        return steps
    return [fused[k] if k in fused else st for k, st in enumerate(steps) if k not in taken or k in fused]


def _gelu(index: _Index, k: int):
    """0.5 * x * (1 + erf(x / sqrt 2)) (or x * 1/sqrt 2), the product in any association and order."""
    d = index.pair(k)[0]
    pre = index.made_by(d, elementwise.div)
    if pre is not None:
        x, c = index.pair(pre)
        if not index.near(c, math.sqrt(2)):
            return None
    else:
        pre = index.made_by(d, elementwise.mul)
        if pre is None:
            return None
        x = next((s for s in index.pair(pre) if index.near(index.other(pre, s), math.sqrt(0.5))), None)
    if x is None or x in index.static:
        return None
    erf_out = index.steps[k][RAW_OUT][0]
    add = index.only_reader(erf_out)
    if add is None or index.steps[add][RAW_FN] is not elementwise.add or not index.near(index.other(add, erf_out), 1):
        return None
    u = index.steps[add][RAW_OUT][0]
    m1 = index.only_reader(u)
    if m1 is None or index.steps[m1][RAW_FN] is not elementwise.mul:
        return None
    w = index.other(m1, u)
    members = {pre, k, add, m1}
    if w == x or index.near(w, 0.5):  # (u * x) * 0.5 or (u * 0.5) * x
        last = index.only_reader(index.steps[m1][RAW_OUT][0])
        if last is None or index.steps[last][RAW_FN] is not elementwise.mul:
            return None
        rest = index.other(last, index.steps[m1][RAW_OUT][0])
        if not ((w == x and index.near(rest, 0.5)) or (rest == x and index.near(w, 0.5))):
            return None
        members.add(last)
    else:  # u * (x * 0.5)
        half = index.made_by(w, elementwise.mul)
        if half is None or index.only_reader(w) != m1:
            return None
        if index.other(half, x) is None or not index.near(index.other(half, x), 0.5):
            return None
        members.add(half)
    return members, _fused_step(index, members, "FusedGelu", [x], _gelu_kernel)


def _gelu_kernel(x, *consts):
    return F.gelu(x) if x.dtype in FLOATS and all(
        c.dtype == x.dtype and c.dim() <= x.dim() for c in consts) else None


def _attention(index: _Index, k: int):
    """softmax((q * a) @ (kt * b) [* c | / c]) @ v over the last axis, a, b, c optional constant scalars:
    scaled_dot_product_attention(q, kt^T, v, scale=a*b*c)."""
    if index.steps[k][RAW_KW].get("axis", -1) != -1:
        return None
    scores, members, scales = index.steps[k][RAW_IN][0], {k}, []
    post = index.made_by(scores, elementwise.mul)
    post = index.made_by(scores, elementwise.div) if post is None else post
    if post is not None:
        ins = index.steps[post][RAW_IN]
        role = "mul" if index.steps[post][RAW_FN] is elementwise.mul else "div"
        c = next((s for s in (ins[1:] if role == "div" else ins) if s in index.static), None)
        if c is not None and index.other(post, c) not in index.static:
            members.add(post)
            scales.append((c, role))
            scores = index.other(post, c)
    mm = index.made_by(scores, nn.matmul)
    after = index.only_reader(index.steps[k][RAW_OUT][0])
    if mm is None or after is None or index.steps[after][RAW_FN] is not nn.matmul:
        return None
    if index.steps[after][RAW_IN][0] != index.steps[k][RAW_OUT][0]:
        return None
    members.update((mm, after))
    operands = []
    for s in index.steps[mm][RAW_IN][:2]:
        pre = index.made_by(s, elementwise.mul)
        c = None if pre is None else next((t for t in index.steps[pre][RAW_IN] if t in index.static), None)
        if c is not None and index.other(pre, c) not in index.static:
            members.add(pre)
            scales.append((c, "mul"))
            s = index.other(pre, c)
        operands.append(s)
    if len(operands) != 2 or len(index.steps[after][RAW_IN]) != 2:
        return None
    (q, kt), v = operands, index.steps[after][RAW_IN][1]
    roles = tuple(role for _, role in scales)

    def kernel(q, kt, v, *values):
        return _attention_kernel(q, kt, v, values[:len(roles)], roles)

    return members, _fused_step(index, members, "FusedAttention", [q, kt, v] + [c for c, _ in scales], kernel)


def _attention_kernel(q, kt, v, scales: Sequence[torch.Tensor], roles: Sequence[str]):
    n = q.dim()
    if not (q.dtype in FLOATS and kt.dtype == v.dtype == q.dtype and n >= 3 and kt.dim() == v.dim() == n
            and q.shape[:-2] == kt.shape[:-2] == v.shape[:-2] and q.shape[-1] == kt.shape[-2]
            and kt.shape[-1] == v.shape[-2] and q.numel() and kt.numel() and v.numel()):
        return None
    scale = 1.0
    for c, role in zip(scales, roles):
        if c.numel() != 1 or c.dtype != q.dtype or c.dim() > n or differentiated(c):
            return None
        scale = scale * float(c) if role == "mul" else scale / float(c)
    return F.scaled_dot_product_attention(q, kt.transpose(-2, -1), v, scale=scale)


def _fused_step(index: _Index, members: set[int], op_type: str, inputs: list, kernel: Callable) -> list:
    """One raw step for `members`: `kernel(*inputs)`, or when it declines (None), the members replayed."""
    order = sorted(members)
    last = index.steps[order[-1]]
    const = [s for k in order for s in index.steps[k][RAW_IN]
             if s is not None and s not in inputs and s in index.values]
    in_slots = tuple(inputs) + tuple(dict.fromkeys(const))
    chain = [(index.steps[k][RAW_FN], index.steps[k][RAW_IN], index.steps[k][RAW_OUT][0], index.steps[k][RAW_KW])
             for k in order]

    def replay(values):
        env = dict(zip(in_slots, values))
        for fn, ins, out, kwargs in chain:
            env[out] = fn(*[None if s is None else env[s] for s in ins], **kwargs)
        return env[chain[-1][2]]

    def step(*values):
        try:
            out = kernel(*values)
        except RuntimeError:  # a case the kernel does not take that the checks let through: the chain decides
            out = None
        return replay(values) if out is None else out

    step.fused = tuple(index.steps[k][0] for k in order)  # the node indices it stands for
    return [last[0], last[1], op_type, step, in_slots, last[RAW_OUT], {}]

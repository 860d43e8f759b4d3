"""engine/ops/signal.py's ops have no lowering yet: the adjoint of a DFT is a DFT, but the onesided,
inverse and real/complex layouts (and STFT's windows and frames) each need their own mapping."""
from __future__ import annotations

from .registry import refuse

refuse("the adjoint of a DFT or STFT (onesided, inverse and real/complex layouts) is not lowered", "DFT", "STFT")

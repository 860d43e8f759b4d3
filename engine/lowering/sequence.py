"""engine/ops/sequence.py's ops have no lowering: the engine differentiates through sequences and
optionals, but the gradient of a sequence is a sequence, which no backward rule here builds.
OptionalGetElement of a plain tensor is an Identity (engine/lowering/elementwise.py)."""
from __future__ import annotations

from .registry import refuse

refuse("sequence values are not lowered: their gradients would be sequences too", "SequenceConstruct",
       "SequenceAt", "SequenceInsert", "SequenceErase", "ConcatFromSequence", "SplitToSequence")
refuse("an optional's gradient is not lowered (OptionalGetElement of a plain tensor is)", "Optional")

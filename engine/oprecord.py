"""One op type's gradient knowledge, read in one place: `engine.registry.record(op_type, domain)`.

Where each piece is written:
- `forwards`: the `@register(...)` lines of engine/ops/<family>.py (or a user's --ops file);
- `rule`, `needs`, `no_gradient`: the `@describe(...)` line right above the same forward;
- `validate`: the `@validates(...)` function beside the forward (engine/ops/inputs.py has its helpers);
  every plan runs it before the forward of each step of the op;
- `lowering`: engine/lowering/<family>.py (it builds ONNX and never imports torch, so it stays there),
  linked by (domain, op type) and looked up the first time it is read, so that reading a rule text
  never imports the lowering package.

Conventions of the rule text (PyTorch's derivatives.yaml, written for people): one line per input in
schema order, the last repeating for variadic inputs, None for an input that gets no gradient (shapes,
axes, indices). Each line names its own symbols (Gemm: A, B, C; Conv: X, W, B); the output is Y, `dY`
the gradient arriving there, `dA` the one sent to input A. `{attr}` is filled from the node's attributes
(`{alpha·}` reads "0.5·", or nothing when alpha is 1); `unbroadcast(g)` sums g over the axes its input
was broadcast along.

`needs` lists the forward values the VJP reads besides the incoming gradient: "in0", "out1" by
position, "in" / "out" for all of them; () for shapes only.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING, Callable, Mapping, Union

if TYPE_CHECKING:
    from .registry import OpImpl

RuleLines = tuple[Union[str, None], ...]
RuleText = Union[RuleLines, Mapping[tuple, RuleLines]]  # the second: variants keyed by attribute values (`rule_by`)


@dataclass(frozen=True)
class Lowering:
    """How `engine.lower` writes the op's gradient in plain ONNX.

    kind: "rule" (a backward rule of its own), "expansion" (the op is first written out in ops that have
    rules), "function body" (its ONNX schema's body, differentiated op by op), "refused" (`detail` says
    why, in the words lowering stops with) or "missing" (nothing: lowering stops with a generic line)."""

    kind: str
    detail: str = ""
    fn: Callable | None = None


@dataclass(frozen=True)
class OpRecord:
    domain: str
    op_type: str
    forwards: tuple[OpImpl, ...] = ()  # one per registered opset range
    rule: RuleText | None = None  # the step mode's and inspector's text (module docstring); None: not written
    rule_by: tuple[str, ...] = ()  # the attributes whose values key `rule`'s variants (Gemm: transA, transB)
    needs: tuple[str, ...] | None = None  # what the VJP reads; None: not written (every input assumed)
    no_gradient: str = ""  # why no gradient flows through the op at all ("" for a differentiable op)
    validate: Callable | None = None  # `fn(inputs, **attributes)`: raises InputShapeError before the forward runs
    jvp: Callable | None = None  # the forward-mode (JVP) rule: filled by a later issue

    @property
    def qualified(self) -> str:
        return f"{self.domain}::{self.op_type}" if self.domain else self.op_type

    @property
    def differentiable(self) -> bool:
        return not self.no_gradient

    @cached_property
    def lowering(self) -> Lowering:
        from .lowering.registry import lowering_of  # lazy cycle: it builds Lowering; onnx, read only when asked

        return lowering_of(self.domain, self.op_type)

    def rule_lines(self, attributes: Mapping[str, object] | None = None) -> RuleLines | None:
        """The rule's template lines for a node with these attributes (they pick Gemm's variant)."""
        if self.rule is None or not self.rule_by:
            return self.rule
        attributes = attributes or {}
        return self.rule.get(tuple(int(attributes.get(a, 0) or 0) for a in self.rule_by))

    def gaps(self) -> tuple[str, ...]:
        """What a differentiable op lacks of forward, VJP needs, rule text, lowering (or refusal reason)."""
        missing = [] if self.forwards else ["forward"]
        if self.no_gradient:
            return tuple(missing)
        if self.needs is None:
            missing.append("VJP needs")
        if self.rule is None:
            missing.append("rule text")
        if self.lowering.kind == "missing":
            missing.append("lowering or a reason it is refused")
        return tuple(missing)

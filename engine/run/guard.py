"""A plan's memory guard (engine/run/memory.py says what it promises): the live total of a run's
values step by step, sized before the run from the graph's inferred shapes, and the steps whose
output size depends on their inputs' values, sized right before they run."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Sequence

import torch

from ..modelfile.dim_expr import evaluate
from .memory import refusal, room, value_dtype
from .validation import precheck

# Ops whose output shares its input's storage (torch views): they keep their input alive, allocate nothing.
VIEWS = frozenset({"Reshape", "Squeeze", "Unsqueeze", "Flatten", "Identity", "Expand", "Transpose"})


@dataclass(frozen=True)
class Profile:
    """One signature of input shapes: the live total right after each step's outputs exist."""

    live: tuple[int, ...]
    added: tuple[tuple, ...]  # per step: its biggest output's bytes, name, shape, dtype; its cast weights' bytes
    peak: int

    def refusal(self, steps: Sequence, can_give: int):
        i = next(i for i, total in enumerate(self.live) if total > can_give)
        nbytes, output, shape, dtype, cast = self.added[i]
        return refusal(steps[i].name, steps[i].op_type, output, shape, dtype, nbytes, can_give,
                       self.live[i] - nbytes - cast, cast)


NO_PROFILE = Profile((), (), 0)


class MemoryGuard:
    """What `plan`'s runs may hold at most, per step list, free policy and input shapes (computed once
    each; only the peak is kept, the step-by-step profile is computed again for a refusal)."""

    def __init__(self, plan):
        self.plan = plan
        self._peaks: dict[tuple, int] = {}

    @property
    def symbols(self) -> frozenset:
        """The named dims of the plan's sources: what a run's feeds size."""
        types = self.plan.graph.types
        return frozenset(d for s in self.plan.sources if s in types and types[s].shape
                         for d in types[s].shape if isinstance(d, str))

    def check(self, steps: Sequence, inputs: Sequence, free: bool) -> None:
        """MemoryLimitError, naming the step that crosses it, when a run on `inputs` would hold more than
        the machine can still give."""
        key = (id(steps), free, *[v.shape if isinstance(v, torch.Tensor) else None for v in inputs])
        peak = self._peaks.get(key)
        if peak is None:
            if len(self._peaks) >= 64:
                self._peaks.clear()
            peak = self._peaks[key] = self._profile(steps, inputs, free).peak
        if peak:
            can_give = room(peak)
            if can_give is not None and peak > can_give:
                self._attributes_first(steps, inputs)
                raise self._profile(steps, inputs, free).refusal(steps, can_give)

    def _attributes_first(self, steps: Sequence, inputs: Sequence) -> None:
        """An attribute out of range asked for the size: BadAttributeError names it (engine/run/validation.py)."""
        dims, names = self._dims(inputs) or {}, self.plan.names
        for step in steps:
            precheck(step, [(None, None) if k is None else self._shape(names[k], dims) for k in step.in_slots])

    def _profile(self, steps: Sequence, inputs: Sequence, free: bool) -> Profile:
        plan = self.plan
        dims = self._dims(inputs)
        if dims is None:
            return NO_PROFILE
        owner: dict[int, int] = {}  # slot -> the step whose allocation it holds (views share their input's)
        holders: dict[int, int] = {}  # allocation -> how many live slots hold it
        sizes: dict[int, int] = {}
        live, total, added = [], 0, []
        for step in steps:
            biggest = (0, "", (), None)
            view_of = owner.get(step.in_slots[0]) if step.op_type in VIEWS and step.in_slots and \
                step.in_slots[0] is not None else None
            for k in step.out_slots:
                if k is None:
                    continue
                if step.op_type in VIEWS:
                    if view_of is not None:
                        owner[k] = view_of
                        holders[view_of] += 1
                    continue
                name = plan.names[k]
                shape, dtype = self._shape(name, dims)
                nbytes = 0 if shape is None or dtype is None else math.prod(shape) * dtype.itemsize
                alloc = len(sizes) + len(steps)  # distinct from any step index
                sizes[alloc], owner[k], holders[alloc] = nbytes, alloc, 1
                total += nbytes
                biggest = max(biggest, (nbytes, name, shape or (), dtype), key=lambda b: b[0])
            cast = self._cast_bytes(step)
            live.append(total + cast)
            added.append((*biggest, cast))
            for k in step.free if free else ():
                alloc = owner.pop(k, None)
                if alloc is not None:
                    holders[alloc] -= 1
                    if not holders[alloc]:
                        total -= sizes[alloc]
        return Profile(tuple(live), tuple(added), max(live, default=0))

    def _cast_bytes(self, step) -> int:
        """The weights `step` reads cast to the plan's float dtype (engine/run/cast_at_use.py): alive while it runs."""
        positions = getattr(step, "cast", ())
        template, itemsize = self.plan._template, self.plan.float_dtype.itemsize if self.plan.float_dtype else 0
        blocked = 0
        if getattr(step.fn, "cast_in_blocks", False) and len(step.in_slots) > 1:  # B cast a block at a time
            from .cast_blocks import BLOCK_BYTES

            b = template[step.in_slots[1]]
            blocked = min(b.numel() * itemsize, BLOCK_BYTES) if b is not None else 0
        if not positions:
            return blocked
        return blocked + sum(template[step.in_slots[j]].numel() for j in positions) * itemsize

    def _dims(self, inputs: Sequence) -> dict[str, int] | None:
        """Symbolic dim -> size, read from the values fed; None when a value contradicts its declared
        shape (then the inferred shapes downstream cannot be trusted either)."""
        dims: dict[str, int] = {}
        types = self.plan.graph.types
        for name, value in zip(self.plan.sources, inputs):
            info = types.get(name)
            if info is None or info.shape is None or not isinstance(value, torch.Tensor):
                continue
            if len(info.shape) != value.dim():
                return None
            for declared, actual in zip(info.shape, value.shape):
                if isinstance(declared, str):
                    if dims.setdefault(declared, actual) != actual:
                        return None
                elif declared is not None and declared != actual:
                    return None
        return dims

    def _shape(self, name: str, dims: dict[str, int]) -> tuple[tuple[int, ...] | None, torch.dtype | None]:
        info = self.plan.graph.types.get(name)
        if info is None or info.shape is None:
            return None, None
        shape = []
        for d in info.shape:
            size = d if isinstance(d, int) else evaluate(d, dims)
            if size is None or size < 0:
                return None, None
            shape.append(size)
        return tuple(shape), value_dtype(info.elem_type, self.plan.float_dtype)


# Output shape from the inputs' values, for ops whose size the graph cannot say ahead of the run.
def _constant_of_shape(shape, *_, **__):
    return tuple(int(d) for d in shape.reshape(-1).tolist()) if shape.numel() < 64 else None


def _tile(x, repeats=None, *_, **__):
    reps = repeats.reshape(-1).tolist() if isinstance(repeats, torch.Tensor) and repeats.numel() < 64 else None
    return tuple(int(d) * int(r) for d, r in zip(x.shape, reps)) if reps and len(reps) == x.dim() else None


def _range(start, limit, delta, *_, **__):
    if any(not isinstance(t, torch.Tensor) or t.numel() != 1 for t in (start, limit, delta)):
        return None
    lo, hi, step = (float(t.reshape(())) for t in (start, limit, delta))
    count = (hi - lo) / step if step else math.inf
    return (max(0, math.ceil(count)),) if math.isfinite(count) else None


def _resize(x, roi=None, scales=None, sizes=None, *_, **__):
    if isinstance(sizes, torch.Tensor) and sizes.numel() == x.dim():
        return tuple(int(v) for v in sizes.tolist())
    if isinstance(scales, torch.Tensor) and scales.numel() == x.dim():
        return tuple(math.floor(d * float(s)) for d, s in zip(x.shape, scales.tolist()))
    return None


def _pad(x, pads=None, *_, **attributes):
    pads = attributes.get("pads", attributes.get("paddings")) if pads is None else pads  # before opset 11
    pads = torch.tensor(pads) if isinstance(pads, (list, tuple)) else pads
    if not isinstance(pads, torch.Tensor) or pads.numel() != 2 * x.dim():
        return None  # pads of some axes only (opset 18's axes input): left to the allocator
    p = pads.tolist()
    return tuple(d + int(p[i]) + int(p[i + x.dim()]) for i, d in enumerate(x.shape))


def _one_hot(indices, depth, *_, **__):
    if not isinstance(depth, torch.Tensor) or depth.numel() != 1:
        return None
    return (*indices.shape, int(depth.reshape(()).item()))  # where the new axis goes does not change the size


def _broadcast(*args, **__):
    """The broadcast of the tensors' shapes (torch.broadcast_shapes costs tens of µs; a clash is the op's to say)."""
    shapes = [a.shape for a in args if isinstance(a, torch.Tensor)]
    if len(shapes) < 2:
        return tuple(shapes[0]) if shapes else None
    rank = max(map(len, shapes))
    out = [1] * rank
    for shape in shapes:
        for i, d in enumerate(shape, rank - len(shape)):
            if d != 1:
                out[i] = d
    return tuple(out)


VALUE_SIZED: dict[str, Callable] = {"ConstantOfShape": _constant_of_shape, "Tile": _tile, "Range": _range,
                                    "Resize": _resize, "Pad": _pad, "OneHot": _one_hot}
# Their output is their inputs broadcast: sized from the inputs' shapes when the graph cannot say it
# and an input is an Expand (a view, however large its shape; the Add that reads it allocates the
# whole). Other steps of unknown size are left to the allocator: sizing each costs a few µs a run.
ELEMENTWISE = frozenset({
    "Add", "Sub", "Mul", "Div", "Pow", "Mod", "Max", "Min", "Sum", "Mean", "Where", "And", "Or", "Xor", "Not",
    "Equal", "Less", "Greater", "LessOrEqual", "GreaterOrEqual", "BitShift", "PRelu", "Relu", "Tanh", "Sigmoid",
    "Exp", "Log", "Sqrt", "Neg", "Abs", "Erf", "Cast", "Clip", "Sin", "Cos", "Floor", "Ceil", "Round", "Sign",
    "Reciprocal", "LeakyRelu", "Elu", "Selu", "Softplus", "HardSigmoid", "IsNaN", "IsInf", "Gelu"})


def value_sized(graph, float_dtype, raw: list, symbols: frozenset = frozenset()) -> list:
    """A raw step ([node index, name, op type, fn, in slots, out slots, kwargs]) whose fn, for an op
    in VALUE_SIZED (or an elementwise op reading an Expand, whose output shape the graph cannot give
    from `symbols`, the dims fed), first sizes its output from its inputs and refuses one the machine
    cannot give."""
    node = graph.nodes[raw[0]]
    shape_of = VALUE_SIZED.get(raw[2])
    if shape_of is None and raw[2] in ELEMENTWISE and node.output and _reads_an_expand(graph, node) \
            and not _resolvable(graph, node.output[0], symbols):
        shape_of = _broadcast
    if shape_of is None or raw[2] != node.op_type:
        return raw
    fn, name, op_type, output = raw[3], raw[1], raw[2], graph.nodes[raw[0]].output[0]
    info = graph.types.get(output)
    dtype = value_dtype(info.elem_type if info else None, float_dtype) or torch.float32
    attribute_check = getattr(fn, "attribute_check", None)

    def step(*args, **kwargs):
        try:
            shape = shape_of(*args, **kwargs)
        except (TypeError, ValueError, RuntimeError, OverflowError):
            shape = None  # the op's own checks say what is wrong
        if shape is not None and min(shape, default=0) >= 0:
            nbytes = math.prod(shape) * dtype.itemsize
            can_give = room(nbytes) if nbytes > 1 << 20 else None
            if can_give is not None and nbytes > can_give:
                if attribute_check is not None:  # an attribute out of range asked for the size: name it
                    attribute_check(args)
                raise refusal(name, op_type, output, shape, dtype, nbytes, can_give)
        return fn(*args, **kwargs)

    step.__dict__.update(getattr(fn, "__dict__", {}))
    step.__wrapped__ = fn
    step.__qualname__ = step.__name__ = f"sized_{getattr(fn, '__name__', 'op')}"
    return [*raw[:3], step, *raw[4:]]


def _resolvable(graph, name: str, symbols: frozenset) -> bool:
    """Whether `name`'s declared shape is sized once the dims in `symbols` are known."""
    info = graph.types.get(name)
    if info is None or info.shape is None:
        return False
    ones = dict.fromkeys(symbols, 1)
    return all(isinstance(d, int) or evaluate(d, ones) is not None for d in info.shape)


def _reads_an_expand(graph, node) -> bool:
    """Whether an input of `node` is an Expand's output, through views."""
    for name in node.input:
        for _ in range(8):
            producer = graph.nodes[graph.producer[name]] if name in graph.producer else None
            if producer is None or producer.op_type not in VIEWS or not producer.input:
                break
            if producer.op_type == "Expand":
                return True
            name = producer.input[0]
    return False

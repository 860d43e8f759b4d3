"""The rules engine/ops/attribute_ranges.py's table applies to integer attributes: each is
`rule(value, args, attributes) -> str | None`, what the attribute may be (the end of the one line
"attribute 'axis' is 5, expected in [-3, 2] (input 0 has rank 3)"), or None when `value` is in range or
its range depends on an input this node does not hold as a tensor. `args` are the node's inputs.
"""
from __future__ import annotations

from typing import Callable, Sequence

import torch
from onnx import TensorProto

Rule = Callable[[object, Sequence, dict], "str | None"]
ELEMENT_TYPES = frozenset(v for v in TensorProto.DataType.values() if v != TensorProto.UNDEFINED)
FLOAT_TYPES = frozenset((TensorProto.FLOAT, TensorProto.DOUBLE, TensorProto.FLOAT16, TensorProto.BFLOAT16))


def _rank(args: Sequence, i: int = 0) -> int | None:
    t = args[i] if i < len(args) else None
    return t.dim() if isinstance(t, torch.Tensor) else None


def _dim(args: Sequence, i: int, axis: int) -> int | None:
    t = args[i] if i < len(args) else None
    return int(t.shape[axis]) if isinstance(t, torch.Tensor) and -t.dim() <= axis < t.dim() else None


def axis(of: int = 0, extra: int = 0, what: str = "", negative: int | None = None) -> Rule:
    """An axis of input `of` (negative from the end); `extra` more for an axis the output inserts (`negative`
    more below 0, when not as many)."""
    below = extra if negative is None else negative

    def rule(value, args, _):
        r = _rank(args, of)
        if r is None or -(r + below) <= value < r + extra:
            return None
        return f"in [{-(r + below)}, {r + extra - 1}] ({what or f'input {of} has rank {r}'})"

    return rule


def axes(of: int = 0, inserted: bool = False) -> Rule:
    """Distinct axes of input `of`; `inserted`: axes of the output, which has one more dim per entry (Unsqueeze)."""

    def rule(value, args, _):
        r = _rank(args, of)
        if r is None:
            return None
        r += len(value) if inserted else 0
        normal = [v + r if v < 0 else v for v in value]
        if all(0 <= v < r for v in normal) and len(set(normal)) == len(normal):
            return None
        return f"distinct axes in [{-r}, {r - 1}] ({'the output' if inserted else f'input {of}'} has rank {r})"

    return rule


def perm(value, args, _):
    r = _rank(args)
    if r is None or sorted(value) == list(range(r)):
        return None
    return f"a permutation of 0..{r - 1} (input 0 has rank {r})"


def at_least(low: int, high: int | None = None, why: str = "") -> Rule:
    """An int, or each entry of a list, in [low, high]."""

    def rule(value, args, _):
        items = value if isinstance(value, (list, tuple)) else [value]
        if all(low <= v and (high is None or v <= high) for v in items):
            return None
        span = f"at least {low}" if high is None else f"in [{low}, {high}]"
        return f"{'each ' if isinstance(value, (list, tuple)) else ''}{span}{f' ({why})' if why else ''}"

    return rule


INT32_MAX = 2**31 - 1  # torch's convolution and pooling kernels take int32 sizes: 2^31 wraps to a negative one


def spatial(low: int, per_dim: int = 1) -> Rule:
    """kernel_shape, strides, dilations (per_dim 1) and pads (per_dim 2): one entry per spatial dim of input 0."""
    bounds = at_least(low, INT32_MAX, "torch's kernels take 32-bit sizes")

    def rule(value, args, _):
        r = _rank(args)
        if r is not None and r >= 2 and len(value) != per_dim * (r - 2):
            return f"{per_dim * (r - 2)} values ({'2 × ' if per_dim == 2 else ''}{r - 2} spatial dims of input 0)"
        return bounds(value, args, _)

    return rule


def element_type(value, args, _):
    return None if value in ELEMENT_TYPES else "an ONNX element type (TensorProto.DataType: 1 to 26)"


def float_type(value, args, _):
    return None if value in FLOAT_TYPES else "a float element type (1, 10, 11 or 16)"


def divides(of: int, axis_of: int, what: str, low: int = 1) -> Rule:
    """At least `low` and a divisor of input `of`'s dim `axis_of` (group of the channels, num_heads of the hidden dim)."""

    def rule(value, args, _):
        if value < low:
            return f"at least {low}"
        n = _dim(args, of, axis_of)
        if n is None or value == 0 or n % value == 0:
            return None
        return f"a divisor of {n} ({what})"

    return rule


def group(value, args, attributes):
    """Conv's group: divides X's channels and W's output channels (onnxruntime: 'Invalid number of groups')."""
    if value < 1:
        return "at least 1"
    c, m = _dim(args, 0, 1), _dim(args, 1, 0)
    if c is not None and c % value:
        return f"a divisor of X's {c} channels"
    if m is not None and m % value:
        return f"a divisor of W's {m} output channels"
    return None


def blocksize_depth(value, args, attributes):
    c = _dim(args, 0, 1)
    if value < 1:
        return "at least 1"
    if c is not None and c % (value * value):
        return f"a block whose square divides the {c} channels"
    return None


def blocksize_space(value, args, attributes):
    if value < 1:
        return "at least 1"
    h, w = _dim(args, 0, 2), _dim(args, 0, 3)
    if h is not None and w is not None and (h % value or w % value):
        return f"a divisor of the height {h} and width {w}"
    return None


def lrn_size(value, args, attributes):
    c = _dim(args, 0, 1)
    if value < 1 or (c is not None and value > 2 * c + 1):
        return f"in [1, {2 * c + 1}] (a window wider than twice the {c} channels sees only padding)" \
            if c is not None else "at least 1"
    return None


def batch_dims(value, args, _):
    r = min(r for r in (_rank(args, 0), _rank(args, 1)) if r is not None) if _rank(args, 0) is not None \
        and _rank(args, 1) is not None else None
    if r is None or 0 <= value < r:
        return None
    return f"in [0, {r - 1}] (below the ranks of data and indices)"


def ngram_counts(value, args, attributes):
    n = len(attributes.get("pool_int64s") or attributes.get("pool_strings") or ())
    bounds = list(value) + [n]
    grams = sum((stop - start) // size for size, (start, stop) in enumerate(zip(bounds, bounds[1:]), 1))
    indexes = len(attributes.get("ngram_indexes") or ())
    if all(0 <= v <= n for v in value) and list(value) == sorted(value) and grams == indexes:
        return None
    return f"ascending starts in [0, {n}] that cut the pool into the {indexes} n-grams ngram_indexes numbers"


def ngram_indexes(value, args, attributes):
    n = len(value)
    return None if all(0 <= v < n for v in value) else f"each in [0, {n - 1}] (one output column per n-gram)"


def sequence_axis(value, args, attributes):
    return None if value in (0, 1) else "0 or 1 (batch and time are the first two dims)"


def pool_pads(value, args, attributes):
    """onnxruntime's pool attributes: 'Pad should be smaller than kernel'."""
    kernel = attributes.get("kernel_shape")
    shaped = spatial(0, per_dim=2)(value, args, attributes)
    if shaped is not None or not kernel or len(value) != 2 * len(kernel):
        return shaped
    n = len(kernel)
    if all(value[i] < kernel[i % n] for i in range(2 * n)):
        return None
    return f"each below its kernel_shape entry {list(kernel)}, as onnxruntime's pooling requires"


def conv_pads(value, args, attributes):
    """Pads beyond the input and the kernel are valid (outputs that see only zeros: NNSmith's torch
    modules write them); what no output dim can hold is refused before anything allocates."""
    shaped = spatial(0, per_dim=2)(value, args, attributes)
    if shaped is not None:
        return shaped
    if all(v <= PAD_LIMIT for v in value):
        return None
    return f"each at most {PAD_LIMIT} (an output dim beyond it is no tensor torch can index)"


# Pads past this give an output dim over 2**31: the memory guard names the size below it.
PAD_LIMIT = 2**30


def _kernel(args, attributes) -> list:
    """The kernel's spatial dims: W's (a convolution's second input), else the kernel_shape attribute."""
    t, w = (args[0] if args else None), (args[1] if len(args) > 1 else None)
    if isinstance(t, torch.Tensor) and isinstance(w, torch.Tensor) and w.dim() == t.dim():
        return list(w.shape[2:])
    return list(attributes.get("kernel_shape") or [])


def window_fits(value, args, attributes):
    """kernel_shape and dilations: the dilated window fits the padded input (else there is no output)."""
    shaped = spatial(1)(value, args, attributes)
    t = args[0] if args else None
    kernel, dilations = _kernel(args, attributes), attributes.get("dilations")
    if shaped is not None or not isinstance(t, torch.Tensor) or t.dim() < 3 or not kernel:
        return shaped
    n = t.dim() - 2
    dilations = dilations or [1] * n
    pads = attributes.get("pads") or [0] * (2 * n)
    if len(kernel) != n or len(dilations) != n or len(pads) != 2 * n or attributes.get("auto_pad", "NOTSET") != "NOTSET" \
            or min(pads, default=0) < 0:
        return None  # the pads' own rule says what is wrong with them
    room = [int(t.shape[2 + i]) + pads[i] + pads[i + n] for i in range(n)]
    if all((kernel[i] - 1) * dilations[i] + 1 <= room[i] for i in range(n)):
        return None
    return f"a dilated window (kernel_shape {list(kernel)}, dilations {list(dilations)}) within the padded input {room}"


def output_padding(value, args, attributes):
    shaped = spatial(0)(value, args, attributes)
    if shaped is not None:
        return shaped
    strides = attributes.get("strides") or [1] * len(value)
    dilations = attributes.get("dilations") or [1] * len(value)
    if len(strides) == len(dilations) == len(value) and any(
            v >= max(s, d) for v, s, d in zip(value, strides, dilations)):
        return "each below its stride or dilation"
    return None


def quant_axis(value, args, attributes):
    """Quantize/DequantizeLinear read the axis only for a per-axis or blocked scale (onnxruntime ignores it otherwise)."""
    scale = args[1] if len(args) > 1 else None
    if not isinstance(scale, torch.Tensor) or scale.dim() == 0 or scale.numel() == 1 and scale.dim() == 1:
        return None
    return axis()(value, args, attributes)


def pad_pads(value, args, attributes):
    """Pad before opset 11: a begin and an end per dim; a negative one crops, at most the whole dim."""
    t = args[0] if args else None
    if not isinstance(t, torch.Tensor):
        return None
    r = t.dim()
    if len(value) != 2 * r:
        return f"{2 * r} values (a begin and an end for each of the {r} dims of input 0)"
    if any(value[i] < -int(t.shape[i % r]) for i in range(2 * r)):
        return f"each at least minus its dim {list(t.shape)} (a negative pad crops)"
    if any(v > PAD_LIMIT for v in value):
        return f"each at most {PAD_LIMIT} (an output dim beyond it is no tensor torch can index)"
    return None


def power_of_two(low: int, span: Callable[[Sequence, dict], int | None] = lambda args, attributes: None) -> Rule:
    """A block size: a power of 2 of at least `low` (onnxruntime's check), and no longer than the `span` it
    splits into blocks rounded up (a longer block is the same single block, asking for more)."""

    def rule(value, args, attributes):
        n = span(args, attributes)
        high = None if n is None else max(low, 1 << max(0, n - 1).bit_length())
        if value >= low and value & (value - 1) == 0 and (high is None or value <= high):
            return None
        return f"a power of 2 in [{low}, {high}] (the span it splits is {n})" if high else f"a power of 2 of at least {low}"

    return rule


def data_values(args, attributes) -> int | None:
    """How many values GatherBlockQuantized's packed data holds at most (4 per byte at 2 bits)."""
    t = args[0] if args else None
    return int(t.numel()) * 4 if isinstance(t, torch.Tensor) else None


def rotary_heads(value, args, attributes):
    """RotaryEmbedding's num_heads (3-D input only): 0 (the input is 4-D) or a divisor of the hidden size."""
    if value < 0:
        return "at least 0"
    r, n = _rank(args), _dim(args, 0, -1)
    if r != 3 or n is None or value == 0 or n % value == 0:
        return None
    return f"0 or a divisor of the hidden size {n}"


def one_of(*allowed: int) -> Rule:
    return lambda value, args, attributes: None if value in allowed else f"one of {', '.join(map(str, allowed))}"


def kv_heads(value, args, attributes):
    q = attributes.get("q_num_heads")
    if value < 1:
        return "at least 1"
    return None if q is None or q % value == 0 else f"a divisor of q_num_heads {q}"


def gemm_trans(value, args, attributes):
    """Gemm's flags are any int (nonzero: transpose), but A and B must multiply under them."""
    a, b = (args[0] if args else None), (args[1] if len(args) > 1 else None)
    if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.dim() == b.dim() == 2):
        return None
    ta, tb = attributes.get("transA", 0), attributes.get("transB", 0)
    if a.shape[0 if ta else 1] == b.shape[1 if tb else 0]:
        return None
    return (f"flags under which A {list(a.shape)} (transA={ta}) and B {list(b.shape)} (transB={tb}) share "
            "their inner dim")


def conv_kernel(value, args, attributes):
    """A convolution's kernel_shape, when given, is W's spatial shape."""
    shaped = spatial(1)(value, args, attributes)
    t, w = (args[0] if args else None), (args[1] if len(args) > 1 else None)
    if shaped is not None or not isinstance(w, torch.Tensor) or not isinstance(t, torch.Tensor) or w.dim() != t.dim():
        return shaped
    return None if list(value) == list(w.shape[2:]) else f"W's spatial shape {list(w.shape[2:])}"


def untrimmed_output(t: torch.Tensor, w: torch.Tensor, attributes) -> tuple[list[int], list[int]] | None:
    """ConvTranspose's (strides, output size per spatial dim before pads trim it); None where the
    strides, dilations or output_padding are themselves out of shape (their own rules say so)."""
    n = t.dim() - 2
    strides = list(attributes.get("strides") or [1] * n)
    dilations = list(attributes.get("dilations") or [1] * n)
    extra = list(attributes.get("output_padding") or [0] * n)
    if not len(strides) == len(dilations) == len(extra) == n or min(strides + dilations) < 1:
        return None
    return strides, [strides[i] * (int(t.shape[2 + i]) - 1) + extra[i] + (int(w.shape[2 + i]) - 1) * dilations[i] + 1
                     for i in range(n)]


def conv_transpose_pads(value, args, attributes):
    """ConvTranspose's pads trim its output: they leave at least one output per spatial dim."""
    shaped = spatial(0, per_dim=2)(value, args, attributes)
    t, w = (args[0] if args else None), (args[1] if len(args) > 1 else None)
    if shaped is not None or not isinstance(t, torch.Tensor) or not isinstance(w, torch.Tensor) or w.dim() != t.dim():
        return shaped
    untrimmed = untrimmed_output(t, w, attributes)
    if untrimmed is None:
        return None  # the strides' and dilations' own rules say what is wrong with them
    n, full = t.dim() - 2, untrimmed[1]
    if all(value[i] + value[i + n] < full[i] for i in range(n)):
        return None
    return f"a begin and end per dim that sum below the untrimmed output {full}"


def heads(of: int = 0, axis_of: int = -1) -> Rule:
    return divides(of, axis_of, "the hidden size of input 0")


def rotary_dim(value, args, attributes):
    return None if value >= 0 and value % 2 == 0 else "an even size of at least 0 (0: the whole head)"

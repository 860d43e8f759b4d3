"""The range of every integer attribute an op turns into shapes, loops or element types (issue 35), as one
table keyed by attribute name (`BY_NAME`) with the few ops that read a name differently (`BY_OP`).

A step checks its node's attributes against its inputs before its forward runs (engine/run/validation.py,
once per signature of input shapes), so an attribute out of range is one line naming it, its value and
what it may be, like onnxruntime's own checks, and never an allocation, a loop over 2³¹ items or a hang:
`node 'ln2' (LayerNormalization): attribute 'axis' is -2147483648, expected in [-3, 2] (X has rank 3)`.

A rule is `rule(value, args, attributes) -> str | None`: what the attribute may be, None when `value` is
in range (or when it depends on an input this node does not have as a tensor). What onnxruntime runs must
pass: flags (any nonzero int is true there) and values it clamps (Slice's starts) are not checked.
"""
from __future__ import annotations

from typing import Sequence

from ..errors import BadAttributeError
from . import attribute_rules as rules
from . import attribute_rules_ops as op_rules
from .attribute_rules import Rule

SPATIAL = {"kernel_shape": op_rules.pool_window(), "strides": rules.spatial(1), "dilations": op_rules.pool_window()}
POOLS = ("MaxPool", "AveragePool", "LpPool")
CONVS = ("Conv", "ConvInteger", "QLinearConv", "DeformConv", "FusedConv")

# attribute name -> its rule, for every op with an attribute of that name (unless BY_OP says otherwise)
BY_NAME: dict[str, Rule] = {
    "axis": rules.axis(), "axes": rules.axes(), "perm": rules.perm,
    "batch_axis": rules.sequence_axis, "time_axis": rules.sequence_axis, "batch_dims": rules.batch_dims,
    "kernel_shape": rules.spatial(1), "strides": rules.spatial(1), "dilations": rules.spatial(1),
    "pads": rules.spatial(0, per_dim=2), "output_padding": rules.output_padding, "output_shape": rules.spatial(0),
    "group": rules.group, "num_groups": rules.divides(0, 1, "the channels"),
    "num_heads": rules.at_least(1), "kv_num_heads": rules.kv_heads, "rotary_embedding_dim": rules.rotary_dim,
    "num_outputs": rules.at_least(1), "hidden_size": rules.at_least(1), "sample_size": rules.at_least(1),
    "output_height": rules.at_least(1, 2**16 - 1, "bins per RoI"),
    "output_width": rules.at_least(1, 2**16 - 1, "bins per RoI"), "sampling_ratio": rules.at_least(0),
    "chunk_size": rules.at_least(1), "block_size": rules.at_least(0),
    "to": rules.element_type, "dtype": rules.element_type, "output_dtype": rules.element_type,
    "output_datatype": rules.element_type, "softmax_precision": rules.float_type,
    "ngram_counts": rules.ngram_counts, "ngram_indexes": rules.ngram_indexes,
    "min_gram_length": op_rules.gram_length, "max_gram_length": op_rules.gram_length, "max_skip_count": op_rules.skip_count,
    "pooled_shape": rules.at_least(1, 2**16 - 1, "bins per RoI"), "offset_group": rules.divides(0, 1, "the channels"),
    "p": rules.at_least(1),
    "shape": rules.at_least(0), "paddings": rules.pad_pads, "stash_type": rules.float_type,
    "left_window_size": rules.at_least(-1), "right_window_size": rules.at_least(-1),
    "qk_matmul_output_mode": rules.one_of(0, 1, 2, 3), "layout": rules.one_of(0, 1), "storage_order": rules.one_of(0, 1),
    "center_point_box": rules.one_of(0, 1), "num_scan_inputs": rules.at_least(1),
    "directions": op_rules.each_of(0, 1), "scan_input_directions": op_rules.each_of(0, 1),
    "scan_output_directions": op_rules.each_of(0, 1),
}

# integer attributes no rule checks, and why: every one of a registered op's schema is in one of the three
# tables (tests/ops/test_attribute_ranges.py holds them to onnx's schemas)
FLAG = "a flag: onnxruntime takes any nonzero value as true"
UNCHECKED: dict[str, str] = {
    **dict.fromkeys(("align_corners", "allowzero", "antialias", "broadcast", "ceil_mode", "count_include_pad",
                     "detect_negative", "detect_positive", "exclude_outside", "exclusive", "fmod", "input_forget",
                     "interleaved", "inverse", "is_case_sensitive", "is_causal", "is_test", "keepdims", "largest",
                     "linear_before_reset", "noop_with_empty_axes", "onesided", "output_sequence", "periodic",
                     "reverse", "saturate", "select_last_index", "sorted", "spatial", "training_mode", "upper"), FLAG),
    "consumed_inputs": "a legacy optimization hint no kernel reads",
    "start": "clamped to the rank, as the spec says", "end": "clamped to the rank, as the spec says",
    "starts": "clamped to the dim, as the spec says", "ends": "clamped to the dim, as the spec says",
    "k": "EyeLike's diagonal: any offset gives a matrix of the input's shape (TopK's has its own rule)",
    "ignore_index": "any label value (a label outside the classes that is not it is refused, engine/ops/loss.py)",
    "maxsplit": "any count; a string op allocates no more than its input",
    "value_int": "a value, not a size", "value_ints": "values, not sizes",
    "scan_input_axes": "checked by Scan against each scan input", "scan_output_axes": "checked by Scan",
    "pool_int64s": "n-gram values, not sizes",
}

# (op type, attribute) -> the rule where the op reads the name its own way; None: not checked here
BY_OP: dict[tuple[str, str], Rule | None] = {
    **{(op, name): rule for op in POOLS for name, rule in SPATIAL.items()},
    **{("MaxPool", name): op_rules.pool_window(torch_pads=True) for name in ("kernel_shape", "dilations")},
    **{(op, "pads"): rules.pool_pads for op in POOLS},
    **{(op, "pads"): rules.conv_pads for op in CONVS},
    ("OneHot", "axis"): rules.axis(0, extra=1, what="the output has one more dim than indices"),
    ("Flatten", "axis"): rules.axis(extra=1, negative=0, what="an axis or the rank of input 0"),
    ("Unsqueeze", "axes"): rules.axes(inserted=True),
    ("ConcatFromSequence", "axis"): None,  # its input is a sequence: the op checks against the first tensor
    ("ConcatFromSequence", "new_axis"): rules.at_least(0, 1),
    ("DepthToSpace", "blocksize"): rules.blocksize_depth, ("SpaceToDepth", "blocksize"): rules.blocksize_space,
    ("LRN", "size"): rules.lrn_size,
    ("Col2Im", "strides"): rules.at_least(1), ("Col2Im", "dilations"): rules.at_least(1),
    ("Col2Im", "pads"): rules.at_least(0),
    ("MaxUnpool", "pads"): rules.at_least(0), ("MaxUnpool", "strides"): op_rules.unpool_strides,
    ("MaxUnpool", "kernel_shape"): op_rules.unpool_kernel, ("RoiAlign", "sampling_ratio"): op_rules.roi_sampling,
    ("ConvTranspose", "strides"): op_rules.transpose_fits, ("ConvTranspose", "dilations"): op_rules.transpose_fits,
    ("ConvTranspose", "output_shape"): op_rules.transpose_output_shape,
    **{(op, name): op_rules.head_split(name) for op in ("Attention", "LinearAttention")
       for name in ("q_num_heads", "kv_num_heads")},
    ("Gemm", "transA"): rules.gemm_trans, ("Gemm", "transB"): rules.gemm_trans,
    ("RotaryEmbedding", "num_heads"): rules.rotary_heads,
    ("RNN", "hidden_size"): op_rules.hidden_size(1), ("GRU", "hidden_size"): op_rules.hidden_size(3),
    ("LSTM", "hidden_size"): op_rules.hidden_size(4),
    ("DFT", "axis"): rules.axis(what="the signal's dims, the last one real or complex"),
    ("Dropout", "seed"): rules.at_least(0, 2**32 - 1, "a seed of the ONNX reference's RandomState stream"),
    ("Split", "split"): rules.at_least(0), ("Split", "num_outputs"): op_rules.num_outputs,
    ("TopK", "k"): op_rules.topk_k, ("Reshape", "shape"): rules.at_least(-1),
    ("LpNormalization", "p"): rules.one_of(1, 2),
    ("QuantizeLinear", "precision"): op_rules.precision,
    ("QuantizeLinear", "axis"): rules.quant_axis, ("DequantizeLinear", "axis"): rules.quant_axis,
    ("Pad", "pads"): rules.pad_pads,
    **{(op, "dilations"): rules.window_fits for op in CONVS},
    **{(op, "kernel_shape"): rules.conv_kernel for op in CONVS + ("ConvTranspose",)},
    ("ConvTranspose", "pads"): rules.conv_transpose_pads,
    ("MatMulNBits", "block_size"): rules.power_of_two(16),  # onnxruntime takes a block longer than K; B's size says
    ("GatherBlockQuantized", "block_size"): rules.power_of_two(16, rules.data_values),
    ("MatMulNBits", "bits"): rules.one_of(2, 4, 8), ("GatherBlockQuantized", "bits"): rules.one_of(2, 4, 8),
    ("MatMulNBits", "K"): rules.at_least(1), ("MatMulNBits", "N"): rules.at_least(1),
}


# checked first: what the window and output checks read must itself be in range
FIRST = ("pads", "strides", "output_padding", "kernel_shape", "q_num_heads")


def rules_for(op_type: str, names) -> tuple[tuple[str, Rule], ...]:
    """The (attribute, rule) pairs that apply to a node of `op_type` setting the attributes `names`."""
    out = []
    for name in sorted(names, key=lambda n: FIRST.index(n) if n in FIRST else len(FIRST)):
        rule = BY_OP[(op_type, name)] if (op_type, name) in BY_OP else BY_NAME.get(name)
        if rule is not None:
            out.append((name, rule))
    return tuple(out)


def check(rules: tuple[tuple[str, Rule], ...], args: Sequence, attributes: dict) -> None:
    """Raise the one line for the first attribute out of range, before the forward sees any."""
    for name, rule in rules:
        value = attributes.get(name)
        if value is None or not _integral(value):
            continue
        expected = rule(value, args, attributes)
        if expected is not None:
            raise BadAttributeError(f"attribute {name!r} is {_shown(value)}, expected {expected}")


def _integral(value) -> bool:
    if isinstance(value, (list, tuple)):
        return all(isinstance(v, int) for v in value)
    return isinstance(value, int) and not isinstance(value, bool)


def _shown(value) -> str:
    if isinstance(value, (list, tuple)) and len(value) > 16:
        return f"[{', '.join(map(str, value[:16]))}, ... ({len(value)} values)]"
    return str(list(value) if isinstance(value, tuple) else value)

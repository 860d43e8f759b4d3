"""Local gradient rules written out for step mode: one line per input, like PyTorch's derivatives.yaml.

Each rule names its own symbols (Gemm: A, B, C; Conv: X, W, B); the output is always Y, `dY`
the gradient arriving there and `dA` the one sent to input A; `symbol()` reads a line's symbol so
step mode can print which tensor each one stands for. `{attr}` is filled from the node's
attributes (defaults from the schema). `unbroadcast(g)` sums g over the axes its input was
broadcast along. An op without an entry gets a generic vector-Jacobian line per input.
"""
from __future__ import annotations

from onnx import defs, helper

from engine.modelfile.contrib_schema import signature

from .rules_contrib import CONTRIB_RULES

_UNARY_X = {  # op -> dX in terms of X, Y (the result) and dY
    "Relu": "dX = dY · (X > 0)          # at X == 0 the subgradient 0 is used",
    "LeakyRelu": "dX = dY · (X > 0 ? 1 : {alpha})",
    "Elu": "dX = dY · (X > 0 ? 1 : Y + {alpha})",
    "Selu": "dX = dY · {gamma} · (X > 0 ? 1 : {alpha}·exp(X))",
    "Celu": "dX = dY · (X > 0 ? 1 : exp(X/{alpha}))",
    "Sigmoid": "dX = dY · Y · (1 − Y)",
    "HardSigmoid": "dX = dY · {alpha} · (0 < {alpha}·X + {beta} < 1)",
    "Tanh": "dX = dY · (1 − Y²)",
    "Exp": "dX = dY · Y",
    "Log": "dX = dY / X",
    "Sqrt": "dX = dY / (2·Y)",
    "Reciprocal": "dX = −dY · Y²",
    "Neg": "dX = −dY",
    "Abs": "dX = dY · sign(X)          # 0 at X == 0",
    "Sin": "dX = dY · cos(X)",
    "Cos": "dX = −dY · sin(X)",
    "Tan": "dX = dY · (1 + Y²)",
    "Sinh": "dX = dY · cosh(X)",
    "Cosh": "dX = dY · sinh(X)",
    "Asin": "dX = dY / sqrt(1 − X²)",
    "Acos": "dX = −dY / sqrt(1 − X²)",
    "Atan": "dX = dY / (1 + X²)",
    "Asinh": "dX = dY / sqrt(X² + 1)",
    "Acosh": "dX = dY / sqrt(X² − 1)",
    "Atanh": "dX = dY / (1 − X²)",
    "Erf": "dX = dY · 2/√π · exp(−X²)",
    "Softplus": "dX = dY · sigmoid(X)",
    "Softsign": "dX = dY / (1 + |X|)²",
    "Identity": "dX = dY",
    "Dropout": "dX = dY · mask / (1 − ratio)   # identity in inference mode",
    "Flatten": "dX = reshape(dY, shape(X))",
    "Reshape": "dX = reshape(dY, shape(X))",
    "Squeeze": "dX = reshape(dY, shape(X))",
    "Unsqueeze": "dX = reshape(dY, shape(X))",
    "Transpose": "dX = transpose(dY, inverse(perm))",
    "Softmax": "dX = Y · (dY − Σ_axis(dY · Y))     # axis = {axis}",
    "LogSoftmax": "dX = dY − exp(Y) · Σ_axis(dY)     # axis = {axis}",
    "Expand": "dX = unbroadcast(dY)       # summed back to shape(X)",
    "Tile": "dX = Σ over the tiles of dY",
    "Floor": "dX = 0                     # piecewise constant",
    "Ceil": "dX = 0                     # piecewise constant",
    "Round": "dX = 0                     # piecewise constant",
    "Sign": "dX = 0                     # piecewise constant",
    "Cast": "dX = cast(dY, type(X))     # 0 when the target type is not float",
    "GlobalAveragePool": "dX = broadcast(dY / (H·W), shape(X))",
    "GlobalMaxPool": "dX = dY at each channel's arg-max, 0 elsewhere",
    "MaxPool": "dX = dY scattered to the arg-max of each window (ties: the first)",
    "AveragePool": "dX = dY spread evenly over each window ({kernel_shape})",
    "ReduceSum": "dX = broadcast(dY, shape(X))  # over axes, keepdims={keepdims}",
    "ReduceMean": "dX = broadcast(dY, shape(X)) / n   # n elements per reduced group",
    "ReduceMax": "dX = dY where X == max, 0 elsewhere (ties share)",
    "ReduceMin": "dX = dY where X == min, 0 elsewhere (ties share)",
    "ReduceSumSquare": "dX = 2 · X · broadcast(dY)",
    "ReduceL2": "dX = X / Y · broadcast(dY)",
    "ReduceLogSumExp": "dX = exp(X − Y) · broadcast(dY)",
}

# op -> one line per input, in order; the last entry repeats for variadic inputs. None marks an
# input that gets no gradient (shapes, axes, indices). The output is always called Y.
RULES: dict[str, tuple[str | None, ...]] = {op: (line, None) for op, line in _UNARY_X.items()}
RULES.update({
    "Add": ("dA = unbroadcast(dY)", "dB = unbroadcast(dY)"),
    "Sub": ("dA = unbroadcast(dY)", "dB = −unbroadcast(dY)"),
    "Mul": ("dA = unbroadcast(dY · B)", "dB = unbroadcast(dY · A)"),
    "Div": ("dA = unbroadcast(dY / B)", "dB = −unbroadcast(dY · A / B²)"),
    "Pow": ("dX = unbroadcast(dY · E · X^(E − 1))", "dE = unbroadcast(dY · Y · log(X))"),
    "MatMul": ("dA = dY @ Bᵀ   (summed over broadcast batch dims)",
               "dB = Aᵀ @ dY   (summed over broadcast batch dims)"),
    "Sum": ("dXᵢ = unbroadcast(dY)    # the same for every input",),
    "Mean": ("dXᵢ = unbroadcast(dY) / n",),
    "Max": ("dXᵢ = dY where input i is the max (ties share), 0 elsewhere",),
    "Min": ("dXᵢ = dY where input i is the min (ties share), 0 elsewhere",),
    "Concat": ("dXᵢ = the slice of dY along axis {axis} at input i's offset",),
    "Split": ("dX = concat(dYᵢ for each output, axis {axis})   # a missing one counts as 0", None),
    "Gather": ("dX = scatter-add of dY at the indices along axis {axis}", None),
    "GatherElements": ("dX = scatter-add of dY at the indices along axis {axis}", None),
    "Slice": ("dX = dY placed back into zeros shaped like X", None),
    "Pad": ("dX = the interior of dY (the padding cut away)", None),
    "Clip": ("dX = dY · (min ≤ X ≤ max)   # at a bound the subgradient 1 is used",
             "dmin = Σ dY where X < min", "dmax = Σ dY where X > max"),
    "Where": (None, "dA = dY · cond", "dB = dY · ¬cond"),
    "PRelu": ("dX = dY · (X > 0 ? 1 : slope)", "dslope = unbroadcast(dY · X · (X ≤ 0))"),
    "Conv": ("dX = ConvTranspose(dY, W)   # strides {strides}, pads {pads}, group {group}",
             "dW = correlate(X, dY) summed over the batch",
             "dB = Σ dY over N and the spatial axes"),
    "ConvTranspose": ("dX = Conv(dY, W)   # strides {strides}, group {group}",
                      "dW = correlate(dY, X) summed over the batch", "dB = Σ dY over N and the spatial axes"),
    "BatchNormalization": ("dX = dY · scale / sqrt(var + {epsilon})   # inference: mean and var fixed",
                           "dscale = Σ dY · (X − mean) / sqrt(var + {epsilon})",
                           "dB = Σ dY over N and the spatial axes",
                           "dmean = −Σ dY · scale / sqrt(var + {epsilon})",
                           "dvar = −½ Σ dY · scale · (X − mean) · (var + {epsilon})^(−3/2)"),
    "LayerNormalization": ("dX = (dX̂ − mean(dX̂) − X̂ · mean(dX̂ · X̂)) / σ   with dX̂ = dY · scale",
                           "dscale = Σ dY · X̂ over the leading axes", "dB = Σ dY over the leading axes"),
})

# Gemm: Y = alpha · op(A) · op(B) + beta · C, op() transposing when the flag is set.
GEMM_RULES: dict[tuple[int, int], tuple[str, str, str]] = {
    (0, 0): ("dA = {alpha·}dY · Bᵀ", "dB = {alpha·}Aᵀ · dY", "dC = {beta·}unbroadcast(dY)"),
    (1, 0): ("dA = {alpha·}B · dYᵀ", "dB = {alpha·}A · dY", "dC = {beta·}unbroadcast(dY)"),
    (0, 1): ("dA = {alpha·}dY · B", "dB = {alpha·}dYᵀ · A", "dC = {beta·}unbroadcast(dY)"),
    (1, 1): ("dA = {alpha·}Bᵀ · dYᵀ", "dB = {alpha·}dYᵀ · Aᵀ", "dC = {beta·}unbroadcast(dY)"),
}

GENERIC = "d{input} = J_{input}ᵀ · dY   # vector-Jacobian product of {op} w.r.t. {input}, by torch autograd"


def schema_names(op_type: str, domain: str = "", opset: int | None = None) -> tuple[list[str], list[str]]:
    """The op's formal input and output names (variadic ones repeated), or generic names."""
    try:
        schema = defs.get_schema(op_type, opset, domain) if opset else defs.get_schema(op_type, domain)
        return [i.name for i in schema.inputs], [o.name for o in schema.outputs]
    except Exception:  # onnxruntime's contrib ops are not in onnx's registry
        names = signature(domain, op_type)
        return (list(names[0]), list(names[1])) if names else ([], [])


def _attributes(node, op_type: str, domain: str, opset: int | None) -> dict[str, object]:
    values: dict[str, object] = {}
    try:
        schema = defs.get_schema(op_type, opset, domain) if opset else defs.get_schema(op_type, domain)
        for name, attr in schema.attributes.items():
            if attr.default_value is not None and attr.default_value.type:
                values[name] = helper.get_attribute_value(attr.default_value)
    except Exception:
        pass
    if node is not None:
        values.update({a.name: helper.get_attribute_value(a) for a in node.attribute})
    return {k: (v.decode() if isinstance(v, bytes) else v) for k, v in values.items()}


class _Attributes(dict):
    """Attribute texts for rule templates; `{alpha·}` is "0.5·", or "" when alpha is 1."""

    UNSET = {"strides": "1", "pads": "0", "dilations": "1", "kernel_shape": "of the kernel's size",
             "activation": "identity", "alpha": "1.702"}  # the last two: FusedConv's and QuickGelu's defaults

    def __missing__(self, key):
        if key.endswith("·"):
            value = self.get(key[:-1], "1")
            return "" if value in ("1", "1.0") else f"{value}·"
        return self.UNSET.get(key, "default")


def symbol(line: str | None) -> str | None:
    """The input a rule line is about: "dA = dY · B" -> "A"."""
    if not line or "=" not in line:
        return None
    return line.split("=", 1)[0].strip().removeprefix("d") or None


def rule_lines(node, opset: int | None = None) -> list[tuple[str, str | None]]:
    """[(symbol, rule text or None when no gradient flows)], one per input of an ONNX node."""
    op, domain = node.op_type, node.domain
    formal_in, _ = schema_names(op, domain, opset)
    n = max(len(node.input), 1)
    names = [_formal(formal_in, i, n) for i in range(n)]
    attrs = _Attributes({k: _fmt(v) for k, v in _attributes(node, op, domain, opset).items()})
    if op == "Gemm":
        table = GEMM_RULES[(int(attrs.get("transA", 0) or 0), int(attrs.get("transB", 0) or 0))]
    elif domain == "com.microsoft" or (not domain and op == "SimplifiedLayerNormalization"):
        table = CONTRIB_RULES.get(op)
    else:
        table = RULES.get(op)
    lines = []
    for i, name in enumerate(names):
        if table is None:
            text = GENERIC.format(input=name, op=op)
        else:
            text = table[min(i, len(table) - 1)]
            text = None if text is None else text.format_map(attrs)
        lines.append((symbol(text) or name, text))
    return lines


def _formal(formal: list[str], i: int, n: int) -> str:
    if not formal:
        return f"input{i}"
    if i < len(formal) - 1 or n <= len(formal):
        return formal[min(i, len(formal) - 1)]
    return f"{formal[-1]}{i - len(formal) + 1}"  # variadic: Inputs1, Inputs2, ...


def _fmt(v) -> str:
    if isinstance(v, float):
        return f"{v:g}"
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_fmt(x) for x in v) + "]"
    return str(v)

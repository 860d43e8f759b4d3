"""Backward rules of engine/ops/nn.py: MatMul, Gemm, LRN, Det, Einsum (the normalizations: norm.py)."""
from __future__ import annotations

import numpy as np
from onnx import helper

from .context import TypeInfo, attr
from .registry import rule


def _swap_last(ctx, t, rank):
    perm = list(range(rank))
    perm[-2], perm[-1] = perm[-1], perm[-2]
    return ctx.op("Transpose", [t], perm=perm)


@rule("MatMul")
def matmul(ctx, node, grads):
    """numpy matmul: 1-D operands get a unit axis that the output drops; batch axes broadcast."""
    (g,), (a, b) = grads, node.input
    ra, rb = ctx.need_rank(a), ctx.need_rank(b)
    a2 = ctx.op("Unsqueeze", [a, ctx.ints([0])]) if ra == 1 else a
    b2 = ctx.op("Unsqueeze", [b, ctx.ints([1])]) if rb == 1 else b
    ctx.types[a2] = _with_unit(ctx, a, 0 if ra == 1 else None)
    ctx.types[b2] = _with_unit(ctx, b, 1 if rb == 1 else None)
    if ra == 1:
        g = ctx.op("Unsqueeze", [g, ctx.ints([-2 if rb > 1 else 0])])
    if rb == 1:
        g = ctx.op("Unsqueeze", [g, ctx.ints([-1])])
    full = _broadcast_batch(ctx.types[a2].shape, ctx.types[b2].shape)
    out = [None, None]
    for i, (x, x2, make) in enumerate([
            (a, a2, lambda: ctx.op("MatMul", [g, _swap_last(ctx, b2, max(rb, 2))])),
            (b, b2, lambda: ctx.op("MatMul", [_swap_last(ctx, a2, max(ra, 2)), g]))]):
        if not ctx.wants(i):
            continue
        d = make()
        ctx.types[d] = TypeInfo(ctx.elem(x), None if full is None else full + ctx.types[x2].shape[-2:])
        d = ctx.unbroadcast(d, x2, d)
        out[i] = d if x2 == x else ctx.op("Reshape", [d, ctx.op("Shape", [x])])
    return out


def _with_unit(ctx, t, axis):
    info = ctx.types.get(t)
    shape = None if info is None or info.shape is None else list(info.shape)
    if shape is not None and axis is not None:
        shape.insert(axis, 1)
    return TypeInfo(ctx.elem(t), None if shape is None else tuple(shape))


def _broadcast_batch(sa, sb):
    """The broadcast batch shape of two matmul operands (None entries for unknown dims)."""
    if sa is None or sb is None:
        return None
    ba, bb = list(sa[:-2]), list(sb[:-2])
    n = max(len(ba), len(bb))
    ba, bb = [1] * (n - len(ba)) + ba, [1] * (n - len(bb)) + bb
    return tuple(None if p is None or q is None else max(p, q) if 1 in (p, q) else p for p, q in zip(ba, bb))


@rule("Gemm")
def gemm(ctx, node, grads):
    """Y = alpha A' B' + beta C with A' = A or Aᵀ (transA), B' likewise; each gradient is one Gemm."""
    g = grads[0]
    a, b = node.input[0], node.input[1]
    c = node.input[2] if len(node.input) > 2 else ""
    alpha, beta = attr(node, "alpha", 1.0), attr(node, "beta", 1.0)
    ta, tb = attr(node, "transA", 0), attr(node, "transB", 0)
    out = [None, None, None]
    if ctx.wants(0):  # dA' = alpha g B'ᵀ; dA = dA'ᵀ when transA
        out[0] = (ctx.op("Gemm", [b, g], alpha=alpha, transA=tb, transB=1) if ta
                  else ctx.op("Gemm", [g, b], alpha=alpha, transB=1 - tb))
    if ctx.wants(1):  # dB' = alpha A'ᵀ g; dB = dB'ᵀ when transB
        out[1] = (ctx.op("Gemm", [g, a], alpha=alpha, transA=1, transB=ta) if tb
                  else ctx.op("Gemm", [a, g], alpha=alpha, transA=1 - ta))
    if c and ctx.wants(2):
        gc = g if beta == 1.0 else ctx.op("Mul", [g, ctx.scalar(beta, g)])
        out[2] = ctx.unbroadcast(gc, c, node.output[0])
    return out


@rule("LRN")
def lrn(ctx, node, grads):
    """y = x / s^beta, s = bias + alpha/size * (window sum over channels of x²)."""
    g, x, y = grads[0], node.input[0], node.output[0]
    size = attr(node, "size")
    alpha, beta, bias = attr(node, "alpha", 1e-4), attr(node, "beta", 0.75), attr(node, "bias", 1.0)
    rank = ctx.need_rank(x)
    before, after = (size - 1) // 2, size - 1 - (size - 1) // 2
    ones = ctx.const(np.ones([1, 1, size] + [1] * (rank - 2), dtype=helper.tensor_dtype_to_np_dtype(ctx.elem(x))))

    def window_sum(t, lo, hi):  # channels become a spatial axis of a one-channel Conv
        t5 = ctx.op("Unsqueeze", [t, ctx.ints([1])])
        pads = [lo] + [0] * (rank - 2) + [hi] + [0] * (rank - 2)
        return ctx.op("Squeeze", [ctx.op("Conv", [t5, ones], pads=pads), ctx.ints([1])])

    s = ctx.op("Add", [ctx.scalar(bias, x),
                       ctx.op("Mul", [window_sum(ctx.op("Mul", [x, x]), before, after), ctx.scalar(alpha / size, x)])])
    direct = ctx.op("Mul", [g, ctx.op("Pow", [s, ctx.scalar(-beta, x)])])
    # the window of channel c covers c-before..c+after, so the transposed sum swaps the paddings
    back = window_sum(ctx.op("Div", [ctx.op("Mul", [g, y]), s]), after, before)
    coupling = ctx.op("Mul", [ctx.op("Mul", [x, back]), ctx.scalar(2.0 * alpha * beta / size, x)])
    return [ctx.op("Sub", [direct, coupling])]


@rule("Det")
def det(ctx, node, grads):
    """d det(A) / dA = the cofactor matrix: C_ij = (-1)^(i+j) det(A without row i and column j), exact
    for singular A too; n² Det nodes on the minors, so n must be static (and small)."""
    x = node.input[0]
    info = ctx.types.get(x)
    n = info.shape[-1] if info is not None and info.shape else None
    if n is None or n > 16:
        raise ctx.error("needs the static size (at most 16) of the matrices")
    g = grads[0]
    if n == 1:
        return [ctx.op("Unsqueeze", [g, ctx.ints([-1, -2])])]
    cofactors = []
    for i in range(n):
        rows = ctx.op("Gather", [x, ctx.ints([r for r in range(n) if r != i])], axis=-2)
        for j in range(n):
            minor = ctx.op("Gather", [rows, ctx.ints([c for c in range(n) if c != j])], axis=-1)
            d = ctx.op("Det", [minor])
            cofactors.append(ctx.op("Neg", [d]) if (i + j) % 2 else d)
    stacked = ctx.op("Concat", [ctx.op("Unsqueeze", [c, ctx.ints([-1])]) for c in cofactors], axis=-1)
    matrix = ctx.op("Reshape", [stacked, ctx.op("Shape", [x])])
    return [ctx.op("Mul", [matrix, ctx.op("Unsqueeze", [g, ctx.ints([-1, -2])])])]


def _einsum_terms(equation: str):
    lhs, _, rhs = equation.replace(" ", "").partition("->")
    terms = lhs.split(",")
    if not _:
        letters = [c for c in lhs if c.isalpha()]
        rhs = ("..." if "..." in lhs else "") + "".join(sorted(c for c in set(letters) if letters.count(c) == 1))
    return terms, rhs


def _letters(term: str) -> list[str]:
    return [c for c in term.replace("...", "") if c.isalpha()]


@rule("Einsum")
def einsum(ctx, node, grads):
    """d operand k = Einsum(g and the other operands -> operand k's distinct subscripts); letters operand
    k alone sums over come back by Unsqueeze + Expand, a diagonal (a letter twice) by an identity mask,
    a broadcast ellipsis by summing it away."""
    terms, out = _einsum_terms(attr(node, "equation"))
    g = grads[0]
    result = []
    for k, (x, term) in enumerate(zip(node.input, terms)):
        if not ctx.wants(k):
            result.append(None)
            continue
        letters = _letters(term)
        if "..." in term and ("..." not in out or not term.startswith("...")):
            raise ctx.error("an Einsum whose operand sums over or does not start with its ellipsis is not lowered")
        if any(letters.count(c) > 2 for c in letters):
            raise ctx.error("an Einsum with a letter three times in one operand is not lowered")
        others = [(t, s) for j, (t, s) in enumerate(zip(node.input, terms)) if j != k]
        seen = set(_letters(out)).union(*[_letters(s) for _, s in others])
        distinct = list(dict.fromkeys(letters))
        kept = "".join(c for c in distinct if c in seen)
        equation = ",".join([out] + [s for _, s in others]) + "->" + ("..." if "..." in term else "") + kept
        d = ctx.op("Einsum", [g] + [t for t, _ in others], equation=equation)
        lead = ctx.need_rank(x) - len(letters)  # the ellipsis' dimensions come first
        # positions of x the result lacks: letters it summed alone, second copies of a diagonal's letter
        missing = [p for p, c in enumerate(letters) if c not in seen or letters.index(c) != p]
        if missing:
            d = ctx.op("Unsqueeze", [d, ctx.ints([lead + p for p in missing])])
            d = ctx.op("Expand", [d, ctx.op("Shape", [x])])
        for c in distinct:
            if letters.count(c) == 2:
                first = letters.index(c)
                d = ctx.op("Mul", [d, _diagonal_mask(ctx, x, lead + first, lead + letters.index(c, first + 1))])
        if "..." in term:
            d = ctx.unbroadcast(d, x, d)
        result.append(d)
    return result


def _diagonal_mask(ctx, x, a: int, b: int) -> str:
    """1 where x's indices along axes a and b agree, shaped to broadcast against x."""
    n = ctx.dims(x, a, a + 1)
    eye = ctx.op("EyeLike", [ctx.op("ConstantOfShape", [ctx.op("Concat", [n, n], axis=0)], value=ctx.tensor_like(1.0, x))])
    rank = ctx.need_rank(x)
    return ctx.op("Reshape", [eye, ctx.shape_from([n if i in (a, b) else 1 for i in range(rank)])])

"""Half-precision variants of ONNX's float32 node test cases.

onnx ships few float16 cases (49) and fewer bfloat16 ones (27). A variant is a float32 case with
its float32 inputs, initializers and constant tensors made float16 (or bfloat16); the output types
are what ONNX's type rules give (shape inference, strict), so a Cast to float stays float. An op
whose schema at that opset excludes the type has no variant.

The expected values come from onnx's reference evaluator (`onnx.reference`, code we did not write)
on the original float32 model fed the inputs rounded to the half type, then rounded to each
output's type: the exact answer for those inputs, up to float32. The evaluator is trusted on a case
only where it reproduces the case's own expected outputs. Tolerances are a few units in the last
place of the half type, relative to each output's largest magnitude for values near zero
(`HALF_ULPS`).
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass, field

import numpy as np
import onnx
from onnx import TensorProto

from .cases import tolerances
from .compare import compare
from .retype import cast, retyped

HALF_TYPES = {"float16": TensorProto.FLOAT16, "bfloat16": TensorProto.BFLOAT16}
# Units in the last place allowed (rtol, and atol relative to an output's largest magnitude): a
# result rounded once is within half a unit; ops that accumulate (reductions, matmul, norms) in
# a wider type and round at the end stay within a few.
HALF_ULPS = 4
_EPS = {TensorProto.FLOAT16: 2.0**-10, TensorProto.BFLOAT16: 2.0**-7}


@dataclass(frozen=True)
class VariantCase:
    """A case-like value (name, model, data_sets, rtol, atol) that `run_case` runs unchanged."""

    name: str
    model: onnx.ModelProto
    data_sets: tuple
    rtol: float
    atol: float
    source: str  # the float32 case it was made from
    _alternatives: dict = field(default_factory=dict, compare=False, repr=False)

    def alternative(self, k: int) -> list:
        """Data set k's outputs as the reference computes them in the half type itself: where the
        spec fixes the arithmetic's type (QuantizeLinear divides in y_scale's), the other
        legitimate answer."""
        if k not in self._alternatives:
            inputs = self.data_sets[k][0]
            try:
                self._alternatives[k] = _reference_outputs(self.model, list(inputs))
            except Exception:  # the reference has no half kernel here: no second answer
                self._alternatives[k] = [None] * len(self.model.graph.output)
        return self._alternatives[k]


def _has_float(model: onnx.ModelProto) -> bool:
    g = model.graph
    typed = [v.type for v in list(g.input) + list(g.output)]
    if any(t.tensor_type.elem_type in (TensorProto.FLOAT16, TensorProto.BFLOAT16) for t in typed):
        return False  # already a half case
    return any(t.WhichOneof("value") == "tensor_type" and t.tensor_type.elem_type == TensorProto.FLOAT
               for t in typed) or any(t.data_type == TensorProto.FLOAT for t in g.initializer)


def variant_model(model: onnx.ModelProto, elem_type: int) -> onnx.ModelProto | str:
    """The model in `elem_type`, its outputs typed by ONNX's rules; or why there is none."""
    out = retyped(model, TensorProto.FLOAT, elem_type)
    if out.graph == model.graph:
        return "no float32 tensor admits the type"
    for v in out.graph.output:  # typed by inference below
        v.type.CopyFrom(_untyped(v.type))
    try:
        inferred = onnx.shape_inference.infer_shapes(out, check_type=True, strict_mode=True)
    except Exception as exc:  # the op's type constraints at this opset exclude the type
        return f"not typed: {str(exc).strip().splitlines()[-1][:200]}"
    types = {v.name: v.type for v in list(inferred.graph.value_info) + list(inferred.graph.output)}
    for v in out.graph.output:
        if v.name not in types or _untyped(types[v.name]) == types[v.name]:
            return f"not typed: inference leaves output {v.name!r} untyped"
        v.type.CopyFrom(types[v.name])
    return out


def _untyped(tp: onnx.TypeProto) -> onnx.TypeProto:
    """`tp` without its element type (tensors inside sequences and optionals too)."""
    out = onnx.TypeProto()
    out.CopyFrom(tp)
    inner = out
    while inner.WhichOneof("value") in ("sequence_type", "optional_type"):
        inner = getattr(inner, inner.WhichOneof("value")).elem_type
    if inner.WhichOneof("value") == "tensor_type":
        inner.tensor_type.elem_type = TensorProto.UNDEFINED
    return out


def _reference_outputs(model: onnx.ModelProto, inputs: list) -> list:
    from onnx.reference import ReferenceEvaluator

    names = [i.name for i in model.graph.input][: len(inputs)]
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")
        return list(ReferenceEvaluator(model).run(None, dict(zip(names, inputs))))


def _trusted(case, rtol: float, atol: float) -> str:
    """'' when the reference evaluator reproduces the case's expected outputs, else why not."""
    from .runner import normalize

    for inputs, expected in case.data_sets:
        try:
            got = _reference_outputs(case.model, normalize(list(inputs)))
        except Exception as exc:  # no oracle for this case: say so, run nothing
            return f"no oracle: onnx.reference fails ({type(exc).__name__})"
        for g, w in zip(got, normalize(list(expected))):
            if compare(g, w, rtol, atol, check_dtype=False):
                return "no oracle: onnx.reference disagrees with the case's expected output"
    return ""


def make_variant(case, dtype: str) -> VariantCase | str:
    """The `dtype` (float16 or bfloat16) variant of a float32 node case, or why there is none."""
    from .runner import normalize

    elem_type = HALF_TYPES[dtype]
    if not _has_float(case.model):
        return "no float32 tensors"
    model = variant_model(case.model, elem_type)
    if isinstance(model, str):
        return model
    why = _trusted(case, *tolerances(case))
    if why:
        return why
    in_types = [_elem_type(v.type) for v in model.graph.input]
    out_types = [_elem_type(v.type) for v in model.graph.output]
    data_sets, scale = [], 0.0
    for inputs, _ in case.data_sets:
        inputs = normalize(list(inputs))
        half = [cast(v, t, saturate=True) for v, t in zip(inputs, in_types)]
        reference = _reference_outputs(case.model, [cast(v, TensorProto.FLOAT) if t in _EPS else v
                                                    for v, t in zip(half, in_types)])
        expected = [cast(v, t) for v, t in zip(reference, out_types)]
        for v, t in zip(expected, out_types):
            for arr in (v if isinstance(v, list) else [v]):
                if t in _EPS and isinstance(arr, np.ndarray) and arr.size:
                    mags = np.abs(arr.astype(np.float64))
                    mags = mags[np.isfinite(mags)]
                    scale = max(scale, float(mags.max()) if mags.size else 0.0)
        data_sets.append((half, expected))
    eps = _EPS[elem_type]
    return VariantCase(f"{case.name}[{dtype}]", model, tuple(data_sets), rtol=HALF_ULPS * eps,
                       atol=max(HALF_ULPS * eps * scale, 1e-7), source=case.name)


def _elem_type(tp: onnx.TypeProto) -> int | None:
    while tp.WhichOneof("value") in ("sequence_type", "optional_type"):
        tp = getattr(tp, tp.WhichOneof("value")).elem_type
    return tp.tensor_type.elem_type if tp.WhichOneof("value") == "tensor_type" else None


def variants_of(cases, dtype: str) -> list[VariantCase]:
    """The `dtype` variants of those `cases` that have one."""
    return [v for v in (make_variant(c, dtype) for c in cases) if not isinstance(v, str)]

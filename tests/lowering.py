"""Shared by the lowering tests: run a lowered model on onnxruntime, compare with the engine."""
from __future__ import annotations

import numpy as np
import onnx

TOL = 1e-5  # float32: |ort - engine| <= TOL * max(1, max |engine|), per tensor
# float16: onnxruntime's kernels and the engine's (float32 inside some ops) round at other places; a
# transformer block's backward lands a few float16 ulps (eps 2**-10) apart
HALF_TOL = 4 * 2.0**-10


def ort_run(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.log_severity_level = 3  # initializers that are also inputs are fine here
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    wanted = {i.name for i in session.get_inputs()}
    names = [o.name for o in session.get_outputs()]
    return dict(zip(names, session.run(None, {k: v for k, v in feeds.items() if k in wanted})))


def check_valid(model: onnx.ModelProto) -> None:
    onnx.checker.check_model(model, full_check=True)
    onnx.shape_inference.infer_shapes(model, check_type=True, strict_mode=True)
    assert not any(n.op_type == "Gradient" for n in model.graph.node)
    assert {o.domain for o in model.opset_import} <= {"", "ai.onnx"}


def scaled_error(got: np.ndarray, want: np.ndarray) -> float:
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    assert got.shape == want.shape, f"shape {got.shape} != {want.shape}"
    return float(np.abs(got - want).max(initial=0.0) / max(1.0, np.abs(want).max(initial=0.0)))


def assert_close(got: dict[str, np.ndarray], want: dict[str, np.ndarray], tol: float = TOL) -> None:
    errors = {k: scaled_error(got[k], v) for k, v in want.items()}
    limits = {k: max(tol, HALF_TOL) if np.asarray(v).dtype == np.float16 else tol for k, v in want.items()}
    bad = {k: e for k, e in errors.items() if not e <= limits[k]}
    assert not bad, f"beyond {limits}: {bad}"

"""Shared by the lowering tests: run a lowered model on onnxruntime, compare with the engine."""
from __future__ import annotations

import numpy as np
import onnx

TOL = 1e-5  # float32: |ort - engine| <= TOL * max(1, max |engine|), per tensor
HALF_TOL = 5e-3  # float16 (the sweep's): a few units in the last place, as onnxruntime rounds each op to half


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


def assert_close(got: dict[str, np.ndarray], want: dict[str, np.ndarray], tol: float | None = None) -> None:
    """Within `tol`, by default TOL, or HALF_TOL where the engine's gradient is float16."""
    if tol is None:
        tol = HALF_TOL if any(np.asarray(v).dtype == np.float16 for v in want.values()) else TOL
    errors = {k: scaled_error(got[k], v) for k, v in want.items()}
    bad = {k: e for k, e in errors.items() if not e <= tol}
    assert not bad, f"beyond {tol}: {bad}"

"""The explorer on a model whose weights live in an external data file, opened through its folder."""
from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from explorer.app import make_app

from .conftest import SIZE, settle, started


async def test_the_explorer_opens_a_folder_whose_model_keeps_its_weights_outside(tmp_path):
    w = np.random.default_rng(0).standard_normal((64, 64)).astype(np.float32)
    g = helper.make_graph([helper.make_node("MatMul", ["X", "W"], ["H"], name="mm"),
                           helper.make_node("Relu", ["H"], ["Y"], name="relu")], "ext",
                          [helper.make_tensor_value_info("X", TensorProto.FLOAT, [2, 64])],
                          [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [2, 64])],
                          initializer=[numpy_helper.from_array(w, "W")])
    onnx.save_model(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), tmp_path / "model.onnx",
                    save_as_external_data=True, location="model.onnx_data", size_threshold=0)
    app = make_app(str(tmp_path))
    app.raise_errors = True
    async with app.run_test(size=SIZE) as pilot:
        await started(app, pilot)
        await settle(app, pilot)
        s = app.session
        assert s.label == "model.onnx" and not app._notifications
        assert s.model.graph.weights.detached() == {"W"}  # W's bytes stayed in model.onnx_data
        np.testing.assert_array_equal(s.model.constants()["W"].numpy(), w)

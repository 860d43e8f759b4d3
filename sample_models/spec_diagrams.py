"""The ONNX Gradient operator spec's diagrams as runnable models.

ONNX Conv needs a 4-D input and Gemm a 2-D one, so a Flatten sits between H and Gemm; the spec
omits it along with every attribute. X is a graph input without a default in the three Conv
models, as in the spec (feed it with `--feed X=random:1`, the explorer's default value).
"""
from __future__ import annotations

from graphs import FLOAT, finish, gradient, make_model, node, normal, rng
from onnx import ModelProto, helper

from engine.examples import spec_conv_gemm


def conv_gemm() -> ModelProto:
    """The first diagram, identical to the explorer's bundled default model."""
    return spec_conv_gemm()


def _forward_nodes():
    return [node("Conv", ["X", "W"], ["H"], name="conv", kernel_shape=[3, 3]),
            node("Flatten", ["H"], ["H_flat"], name="flatten", axis=1),
            node("Gemm", ["H_flat", "Z"], ["Y"], name="gemm")]


def _forward_params():
    base = spec_conv_gemm(with_gradient=False)
    return {t.name: t for t in base.graph.initializer}  # the same W and Z as the first diagram


def grad_wrt_h() -> ModelProto:
    """Gradient(xs=[H, Z], y=Y) fed with H_1: dY/dH evaluated at H = H_1, whatever Conv computes."""
    h1 = normal(rng(2), (1, 2, 2, 2))
    nodes = _forward_nodes() + [gradient(["H_1", "Z"], ["dY_dH", "dY_dZ"], "gradient", xs=["H", "Z"], y="Y")]
    model = make_model(
        "spec_grad_wrt_h",
        "The spec's fourth diagram: the gradient of Y w.r.t. the intermediate H at a given value H_1. "
        "H_1 is a graph input with a default; override it with --feed H_1=SPEC.",
        nodes,
        inputs=[("X", (1, 1, 4, 4))],
        defaults={"H_1": h1},
        outputs=[("Y", (1, 3)), ("dY_dH", (1, 2, 2, 2)), ("dY_dZ", (8, 3))],
    )
    _add_params(model, ["W", "Z"])
    return model


def _add_params(model: ModelProto, names) -> None:
    """Append the first diagram's W and Z (as graph inputs with defaults, as spec_conv_gemm has them)."""
    params = _forward_params()
    for name in names:
        t = params[name]
        model.graph.input.append(helper.make_tensor_value_info(name, FLOAT, list(t.dims)))
        model.graph.initializer.append(t)


def second_order() -> ModelProto:
    """W -> Gemm -> Y -> Loss -> O, then Gradient nodes for dO/dW and for d(dO/dW)/dW."""
    g = rng(3)
    x, w, label = normal(g, (4, 3)), normal(g, (3, 2)), normal(g, (4, 2))
    members = dict(xs=["X", "W"], zs=["L"])
    nodes = [
        node("Gemm", ["X", "W"], ["Y"], name="gemm"),
        node("Sub", ["Y", "L"], ["E"], name="error"),
        node("Mul", ["E", "E"], ["E2"], name="square"),
        node("ReduceSum", ["E2"], ["O"], name="loss", keepdims=0),
        gradient(["X", "W", "L"], ["dO_dX", "dO_dW"], "gradient", y="O", **members),
        gradient(["X", "W", "L"], ["d_dO_dW_dX", "d2O_dW2"], "gradient_of_gradient", y="dO_dW", **members),
    ]
    return make_model(
        "spec_second_order",
        "The spec's linear model with a loss O = sum((X W - L)^2) and nested Gradient nodes. "
        "dO/dW is not a scalar, so the second Gradient differentiates sum(dO/dW): "
        "d2O_dW2 = 2 X^T X ones(3, 2).",
        nodes,
        defaults={"X": x, "L": label},
        params={"W": w},
        outputs=[("O", ()), ("dO_dX", (4, 3)), ("dO_dW", (3, 2)), ("d_dO_dW_dX", (4, 3)), ("d2O_dW2", (3, 2))],
    )


def optional_output() -> ModelProto:
    """The first diagram with dY/dW skipped: the Gradient node's first output name is empty."""
    model = spec_conv_gemm()
    graph = model.graph
    grad = next(n for n in graph.node if n.op_type == "Gradient")
    grad.output[0] = ""
    kept = [o for o in graph.output if o.name != "dY_dW"]
    del graph.output[:]
    graph.output.extend(kept)
    graph.name = "spec_optional_output"
    graph.doc_string = ("All Gradient outputs are optional: an empty output name skips dY/dW, "
                        "as in RNN, GRU and LSTM.")
    return finish(graph, training=True)

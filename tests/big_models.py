"""Big models generated in code, for the explorer's scale benchmarks and its monkey test.

`residual_chain(blocks)` is `blocks` residual blocks, each Conv -> Relu -> MatMul -> Add back onto
the block's input, and a final ReduceMean: 4 * blocks + 1 nodes and blocks + 1 initializers (a
weight per Conv, one MatMul matrix shared by all). 2,500 blocks give the 10,001-node model of
issue 10. Weights are small, so the residual stream stays finite however deep the chain is.
`wide_fan(branches)` is the opposite shape: one rank far wider than a terminal.
"""
from __future__ import annotations

import numpy as np
from onnx import ModelProto, TensorProto, helper, numpy_helper

CHANNELS, SIDE = 2, 4


def residual_chain(blocks: int = 2500, seed: int = 0) -> ModelProto:
    rng = np.random.default_rng(seed)
    nodes, inits = [], []
    mix = (0.05 * rng.standard_normal((SIDE, SIDE))).astype(np.float32)
    inits.append(numpy_helper.from_array(mix, "mix"))
    h = "input"
    for b in range(blocks):
        w = (0.02 * rng.standard_normal((CHANNELS, CHANNELS, 3, 3))).astype(np.float32)
        inits.append(numpy_helper.from_array(w, f"block{b}.conv.weight"))
        p = f"block{b}"
        nodes += [
            helper.make_node("Conv", [h, f"{p}.conv.weight"], [f"{p}.conv"], name=f"{p}/conv",
                             kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
            helper.make_node("Relu", [f"{p}.conv"], [f"{p}.relu"], name=f"{p}/relu"),
            helper.make_node("MatMul", [f"{p}.relu", "mix"], [f"{p}.mix"], name=f"{p}/mix"),
            helper.make_node("Add", [f"{p}.mix", h], [f"{p}.out"], name=f"{p}/add"),
        ]
        h = f"{p}.out"
    return _with_loss(f"residual_chain_{blocks}", nodes, inits, h)


def wide_fan(branches: int = 40, seed: int = 0) -> ModelProto:
    """One input read by `branches` parallel Mul -> Relu branches, summed: a graph far wider than a
    terminal, whose input box sits in the middle of the top rank (not in the top-left corner)."""
    rng = np.random.default_rng(seed)
    shape = [1, CHANNELS, SIDE, SIDE]
    nodes, inits, ends = [], [], []
    for b in range(branches):
        scale = rng.standard_normal(shape).astype(np.float32)
        inits.append(numpy_helper.from_array(scale, f"branch{b}.scale"))
        nodes += [helper.make_node("Mul", ["input", f"branch{b}.scale"], [f"branch{b}.mul"], name=f"branch{b}/mul"),
                  helper.make_node("Relu", [f"branch{b}.mul"], [f"branch{b}.relu"], name=f"branch{b}/relu")]
        ends.append(f"branch{b}.relu")
    nodes.append(helper.make_node("Sum", ends, ["total"], name="sum"))
    return _with_loss(f"wide_fan_{branches}", nodes, inits, "total")


def _with_loss(name: str, nodes, inits, last: str) -> ModelProto:
    """The model of `nodes` reading "input", with "loss" = the mean of `last` as its output."""
    nodes = nodes + [helper.make_node("ReduceMean", [last], ["loss"], name="loss", keepdims=0)]
    graph = helper.make_graph(
        nodes, name,
        inputs=[helper.make_tensor_value_info("input", TensorProto.FLOAT, [1, CHANNELS, SIDE, SIDE])],
        outputs=[helper.make_tensor_value_info("loss", TensorProto.FLOAT, [])],
        initializer=inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], producer_name="onnxgrad-tests")
    model.ir_version = 8
    return model

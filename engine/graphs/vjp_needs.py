"""Which forward values each op's VJP reads, besides the incoming gradient.

One entry per op: positions of inputs ("in0", "in1", "in" for all) and outputs ("out0", "out"
for all). Ops absent from the table are assumed to read every input, the safe answer for a
teaching view: it may show a value the VJP does not strictly need, never hide one it does.
"""
from __future__ import annotations

from functools import lru_cache
from typing import Sequence

_NONE = ""

NEEDS: dict[str, str] = {
    # Linear in their float inputs: the VJP needs shapes only.
    "Add": _NONE, "Sub": _NONE, "Neg": _NONE, "Sum": _NONE, "Mean": _NONE, "Identity": _NONE,
    "Reshape": _NONE, "Flatten": _NONE, "Squeeze": _NONE, "Unsqueeze": _NONE, "Transpose": _NONE,
    "Concat": _NONE, "Split": _NONE, "Expand": _NONE, "Tile": _NONE, "Pad": _NONE,
    "ReduceSum": _NONE, "ReduceMean": _NONE, "GlobalAveragePool": _NONE, "AveragePool": _NONE,
    "Cast": _NONE, "CastLike": _NONE, "CumSum": _NONE, "DepthToSpace": _NONE, "SpaceToDepth": _NONE,
    "Dropout": "out1",  # the mask (inference mode: nothing)
    "Slice": _NONE, "Resize": _NONE, "Upsample": _NONE, "Trilu": _NONE,
    # Index-driven: the indices decide where gradient goes.
    "Gather": "in1", "GatherElements": "in1", "GatherND": "in1", "ScatterElements": "in1",
    "ScatterND": "in1", "Where": "in0", "Compress": "in1",
    # Products: each input's gradient uses the others.
    "Mul": "in", "Div": "in", "MatMul": "in", "Einsum": "in",
    "Gemm": "in0,in1",  # C enters linearly
    "Conv": "in0,in1", "ConvTranspose": "in0,in1",
    # Activations whose derivative is cheapest from the result.
    "Relu": "out0", "Sigmoid": "out0", "Tanh": "out0", "Exp": "out0", "Sqrt": "out0",
    "Reciprocal": "out0", "Softmax": "out0", "LogSoftmax": "out0", "Elu": "in0,out0",
    # ... and from the input.
    "LeakyRelu": "in0", "PRelu": "in0,in1", "Log": "in0", "Abs": "in0", "Sign": _NONE,
    "Sin": "in0", "Cos": "in0", "Tan": "out0", "Erf": "in0", "Gelu": "in0", "Softplus": "in0",
    "Softsign": "in0", "HardSigmoid": "in0", "HardSwish": "in0", "Mish": "in0", "Swish": "in0",
    "Selu": "in0", "Celu": "in0", "ThresholdedRelu": "in0", "Clip": "in", "Shrink": "in0",
    "Pow": "in,out0", "Max": "in,out0", "Min": "in,out0",
    "ReduceMax": "in0,out0", "ReduceMin": "in0,out0", "ReduceProd": "in0,out0",
    "ReduceL2": "in0,out0", "ReduceL1": "in0", "ReduceSumSquare": "in0", "ReduceLogSumExp": "in0,out0",
    "ReduceLogSum": "in0",
    "MaxPool": "in0,out1", "GlobalMaxPool": "in0,out0", "LpPool": "in0,out0", "LRN": "in0,out0",
    # Normalizations: the input and scale, plus statistics computed in the forward pass.
    "BatchNormalization": "in0,in1,in3,in4", "LayerNormalization": "in0,in1",
    "InstanceNormalization": "in0,in1", "GroupNormalization": "in0,in1",
    # Recurrences read everything they saw.
    "RNN": "in,out", "GRU": "in,out", "LSTM": "in,out",
}


@lru_cache(maxsize=None)
def _parts(op_type: str) -> tuple[str, ...]:
    return tuple(filter(None, NEEDS.get(op_type, "in").split(",")))


def vjp_needs(op_type: str, inputs: Sequence[str], outputs: Sequence[str]) -> tuple[str, ...]:
    """Forward tensor names the VJP of an op_type node with these inputs and outputs reads
    (empty names and duplicates dropped)."""
    picked: list[str] = []
    for part in _parts(op_type):
        if part == "in":
            picked.extend(inputs)
        elif part == "out":
            picked.extend(outputs)
        elif part.startswith("in") and int(part[2:]) < len(inputs):
            picked.append(inputs[int(part[2:])])
        elif part.startswith("out") and int(part[3:]) < len(outputs):
            picked.append(outputs[int(part[3:])])
    return tuple(t for t in dict.fromkeys(picked) if t)

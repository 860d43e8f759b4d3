"""An `--ops` file: registers com.example::MyCustomOp (the op of `engine.examples.custom_op`).

    onnxgrad grad custom_op.onnx --y Y --xs A --ops sample_models/my_ops.py
    onnxgrad explore custom_op.onnx --ops sample_models/my_ops.py

The forward takes the node's inputs in ONNX order (attributes as keyword arguments); the VJP gets
the output gradients, the inputs and the outputs, and returns one gradient per input (None where
there is none). `onnxgrad check ... --ops` verifies the VJP against finite differences.
"""
import torch

import engine


def forward(a):
    return a * a + torch.sin(a)


def vjp(grads, inputs, outputs):
    (g,), (a,) = grads, inputs
    return (g * (2 * a + torch.cos(a)),)


engine.register_op_with_vjp("MyCustomOp", forward, vjp, domain="com.example")

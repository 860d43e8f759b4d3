"""The verifier: is this gradient right? Float64 finite differences as a CI gate.

    check(model, y, xs, ...) -> CheckReport          engine.verify.check
    register_op_with_vjp(op_type, forward, vjp)      ops with hand-written backward passes
    nonfinite_origin(model, y, xs, ...) -> Finding   where a gradient's NaN/Inf comes from
"""
from .check import MODES, check
from .custom import CustomOp, custom_ops, register_op_with_vjp, unregister_op
from .findings import nonfinite_origin
from .report import CheckReport, ClaimedCheck, Finding, ItemProblem, NodeCheck, XCheck

__all__ = ["check", "MODES", "CheckReport", "XCheck", "NodeCheck", "ClaimedCheck", "Finding", "ItemProblem",
           "register_op_with_vjp", "unregister_op", "CustomOp", "custom_ops", "nonfinite_origin"]

"""Which node of a mismatching case goes wrong first: every intermediate value against onnx's
reference evaluator (`onnx.reference.ReferenceEvaluator`, numpy), in the engine's node order."""
from __future__ import annotations

import warnings

import torch

from .cases import tolerances
from .compare import compare
from .runner import normalize


def _numpy(value):
    if isinstance(value, list):
        return [_numpy(v) for v in value]
    if isinstance(value, torch.Tensor):
        t = value.detach().cpu()
        return (t.float() if t.dtype == torch.bfloat16 else t).numpy()
    return value


def first_divergence(case, data_set: int = 0) -> str:
    """'node #k Op (output): reason' for the first node whose output differs, or '' when none does."""
    from onnx.reference import ReferenceEvaluator

    from .. import load

    inputs, _ = case.data_sets[data_set]
    names = [i.name for i in case.model.graph.input][: len(inputs)]
    feeds = dict(zip(names, normalize(list(inputs))))
    rtol, atol = tolerances(case)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            reference = ReferenceEvaluator(case.model).run(None, feeds, intermediate=True)
        except Exception as exc:  # the reference itself cannot run it: nothing to localize against
            return f"(the reference evaluator fails: {type(exc).__name__})"
        model = load(case.model, check=False)
        plan = model.prepare(names, model.outputs, keep_all=True)
        from ..backend import _to_engine

        types = {vi.name: vi.type for vi in case.model.graph.input}
        values = plan.run_all([_to_engine(feeds[n], types.get(n), torch.device("cpu"), None) for n in names])
    for k, node in enumerate(model.graph.nodes):
        for out in node.output:
            if not out or out not in reference or out not in values:
                continue
            problem = compare(_numpy(values[out]), reference[out], rtol, atol, check_dtype=False)
            if problem:
                return f"first differing node #{k} {node.op_type} ({model.graph.node_names[k]}, output {out!r}): {problem}"
    return ""

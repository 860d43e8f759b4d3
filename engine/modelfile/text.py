"""Every name and string the engine reads from a model file must be UTF-8: protobuf hands the others
out as bytes, which would fail far from the file, in a message about something else."""
from __future__ import annotations

import onnx
from onnx import ModelProto

from ..errors import ModelLoadError
from .domains import STANDARD_DOMAINS


def require_text(model: ModelProto) -> None:
    """ModelLoadError naming the first name or string the engine would read that is not UTF-8."""
    def bad(value) -> bool:
        return type(value) is not str

    def graph_text(g, where: str) -> None:
        for vi in list(g.input) + list(g.output) + list(g.value_info):
            if bad(vi.name):
                raise ModelLoadError(f"{where}: a value name is not UTF-8: {vi.name!r}")
            tt = vi.type.tensor_type
            if any(bad(d.dim_param) for d in tt.shape.dim):
                raise ModelLoadError(f"{where}: a dimension name of {vi.name!r} is not UTF-8")
        for t in g.initializer:
            if bad(t.name):
                raise ModelLoadError(f"{where}: an initializer name is not UTF-8: {t.name!r}")
            for e in t.external_data:
                if bad(e.key) or bad(e.value):
                    raise ModelLoadError(f"initializer {t.name!r}: an external data entry is not UTF-8: "
                                         f"{e.key!r}={e.value!r}")
        for i, node in enumerate(g.node):
            label = f"{where}: node {i}"
            for value in (node.name, node.op_type, node.domain, *node.input, *node.output):
                if bad(value):
                    raise ModelLoadError(f"{label}: a name is not UTF-8: {value!r}")
            label = f"{where}: node {node.name or node.op_type!r}"
            for a in node.attribute:
                if bad(a.name):
                    raise ModelLoadError(f"{label}: an attribute name is not UTF-8: {a.name!r}")
                if node.domain in STANDARD_DOMAINS:  # a custom op's string attribute may carry any bytes
                    for value in ([a.s] if a.type == onnx.AttributeProto.STRING else list(a.strings)):
                        try:
                            value.decode("utf-8")
                        except UnicodeDecodeError:
                            raise ModelLoadError(f"{label}: attribute {a.name!r} is not UTF-8: {value!r}") from None
                if a.type == onnx.AttributeProto.GRAPH:
                    graph_text(a.g, f"{label}/{a.name}")
                elif a.type == onnx.AttributeProto.GRAPHS:
                    for sub in a.graphs:
                        graph_text(sub, f"{label}/{a.name}")

    for imp in model.opset_import:
        if bad(imp.domain):
            raise ModelLoadError(f"an opset domain is not UTF-8: {imp.domain!r}")
    if bad(model.graph.name):
        raise ModelLoadError(f"the graph name is not UTF-8: {model.graph.name!r}")
    graph_text(model.graph, "graph")

"""How each box of a layout is marked for the session: roles, the slice, check results. No Textual."""
from __future__ import annotations


def box_tensor(node) -> str | None:
    """The tensor a box stands for: "t:NAME" boxes, and "…dx:NAME" (the gradient of NAME) boxes."""
    if node.node_index is not None:
        return None
    if node.id.startswith("t:"):
        return node.id[2:]
    if "dx:" in node.id:
        return node.id.split("dx:", 1)[1]
    return None


def check_statuses(report) -> dict[str, str]:
    """node name -> "pass" / "fail" / "inconclusive" from a CheckReport's per-node results."""
    out = {}
    for n in getattr(report, "nodes", None) or ():
        status = getattr(n, "status", None)
        out[str(getattr(n, "node_name", ""))] = str(getattr(status, "value", status))
    return out


def graph_marks(session, layout) -> dict[str, str]:
    """Layout id -> the one mark that wins: check status > unsupported op > y > x > z > on the slice > dimmed;
    in diff mode a node's divergence decides (an uncompared node is dimmed)."""
    if layout is None:
        return {}
    g = session.graph
    spec = session.spec
    on_slice = session.slice_nodes()
    unsupported = session.model.unsupported_nodes()
    statuses = check_statuses(session.check)
    # Each tensor's role looked up once (GPT-2's 2,300 boxes asked role_of for every output: the
    # marks are remade on the UI thread whenever a layout or the selection changes).
    roles = {t: "z" for t in session.zs}
    roles.update((t, "x") for t in session.xs)
    if session.y:
        roles[session.y] = "y"
    diff = getattr(session, "diff", None)  # diff mode: nodes take their divergence's mark (diff_state.py)
    divergence = diff.node_marks(g) if diff is not None else None
    marks: dict[str, str] = {}
    for n in layout.nodes:
        mark = None
        if n.node_index is not None and divergence is not None:
            mark = divergence.get(n.node_index, "dim")
        elif n.node_index is not None:
            status = statuses.get(g.node_names[n.node_index]) if statuses else None
            if status in ("pass", "fail", "inconclusive"):
                mark = status
            elif n.node_index in unsupported:
                mark = "unsupported"
            elif roles and (found := {roles[t] for t in g.nodes[n.node_index].output if t in roles}):
                mark = next(r for r in ("y", "x", "z") if r in found)
            elif spec is not None:
                mark = "slice" if n.node_index in on_slice else "dim"
        else:
            tensor = box_tensor(n)
            if tensor is None:  # the seed dy, accumulations: the engine's role says enough
                continue
            mark = roles.get(tensor) or ("dim" if spec is not None else None)
        if mark:
            marks[n.id] = mark
    return marks

"""Naming the made-up input behind a failed step: a run on values nobody fed that fails should say
so, since the fix is to feed that input (or size it), not to debug the node."""
from __future__ import annotations

import re
from collections import deque
from typing import Iterable

from ..modelfile.index import GraphIndex, node_inputs

_NODE = re.compile(r"node '(.*?)' \(")
NAMED = 2  # the nearest made-up inputs an error names


def made_up_behind(graph: GraphIndex, node_name: str, made_up: Iterable[str]) -> list[str]:
    """The made-up inputs the node reads, nearest first (breadth-first up its inputs)."""
    made_up = set(made_up)
    if node_name not in graph.node_names:
        return []
    start = graph.node_names.index(node_name)
    found, seen, queue = [], set(), deque(node_inputs(graph.nodes[start]))
    while queue:
        t = queue.popleft()
        if t in seen or not t:
            continue
        seen.add(t)
        if t in made_up:
            found.append(t)
        elif t in graph.producer:
            queue.extend(node_inputs(graph.nodes[graph.producer[t]]))
    return found


def blame_made_up(graph: GraphIndex, made_up: Iterable[str], exc: Exception) -> str:
    """The one-line error for a failed step, naming the made-up inputs behind its node (if any)."""
    text = str(exc)
    hit = _NODE.match(text)
    behind = made_up_behind(graph, hit.group(1), made_up) if hit else []
    if not behind:
        return text
    from .past_feeds import past_layout

    past = " or --past" if past_layout(graph) is not None else ""
    names = ", ".join(behind[:NAMED]) + (f" and {len(behind) - NAMED} more" if len(behind) > NAMED else "")
    if len(behind) == 1:
        return f"{text} ({names} was made up: feed it, or set its dims with --dim{past})"
    return f"{text} ({names} were made up: feed them, or set their dims with --dim{past})"

"""Widgets grouped by area: the graph, the list, the inspector, the selection bar, the results."""

"""The command palette (ctrl+p): every action of the explorer, by name."""
from __future__ import annotations

from functools import partial

from textual.command import DiscoveryHit, Hit, Hits, Provider

# (palette text, help, action string run on the App)
COMMANDS: list[tuple[str, str, str]] = [
    ("Set y to the current tensor", "the tensor to differentiate", "set_y"),
    ("Add/remove the current tensor in xs", "differentiate with respect to it", "toggle_x"),
    ("Add/remove the current tensor in zs", "an input that is held, not differentiated", "toggle_z"),
    ("Clear the selection", "forget y, xs and zs", "clear_selection"),
    ("Next tensor of this node", "cycle through the node's outputs and inputs", "next_tensor"),
    ("Feed the current tensor…", "random, zeros, ones, constant, .npy or an expression", "feed"),
    ("Run: compute the gradients", "dy/dx for every x, in the background", "run"),
    ("Verify the gradients…", "finite differences: full, sample or fast mode", "verify"),
    ("Step mode", "forward, then reverse mode node by node with the local rules", "step"),
    ("Switch view: forward / backward / combined", "the graph drawn", "cycle_view"),
    ("Switch device", "cpu, or cuda when present", "cycle_device"),
    ("Switch dtype: float32 / float64", "every float tensor computed in it", "toggle_dtype"),
    ("Heatmap: value / gradient", "what the inspector's heatmap shows", "heat_source"),
    ("Export gradients (.npz)…", "one array per x", "export('gradients')"),
    ("Export report (JSON)…", "selection, feeds, gradient stats, check", "export('report')"),
    ("Export graph (DOT/SVG)…", "the current view, via Graphviz", "export('svg')"),
    ("Find a node or tensor", "fuzzy search in the list", "search"),
    ("Open model…", "load another .onnx file", "open_model"),
    ("Cancel running work", "gradient, check, step or export", "cancel"),
    ("Help", "keys and the workflow", "help"),
    ("Quit", "leave onnxgrad", "quit"),
]


class ExplorerCommands(Provider):
    async def discover(self) -> Hits:
        for text, help_text, action in COMMANDS:
            yield DiscoveryHit(text, partial(self._run, action), help=help_text)

    async def search(self, query: str) -> Hits:
        matcher = self.matcher(query)
        for text, help_text, action in COMMANDS:
            score = matcher.match(text)
            if score > 0:
                yield Hit(score, matcher.highlight(text), partial(self._run, action), help=help_text)

    async def _run(self, action: str) -> None:
        await self.app.run_action(action)

"""The command palette (ctrl+p): every action of the explorer, by name."""
from __future__ import annotations

from functools import partial

from textual.await_complete import AwaitComplete
from textual.command import CommandPalette, DiscoveryHit, Hit, Hits, Provider, SimpleProvider
from textual.theme import ThemeProvider

# (palette text, help, action string run on the App)
COMMANDS: list[tuple[str, str, str]] = [
    ("Set y to the current tensor", "the tensor to differentiate", "set_y"),
    ("Add/remove the current tensor in xs", "differentiate with respect to it", "toggle_x"),
    ("Add/remove the current tensor in zs", "an input that is held, not differentiated", "toggle_z"),
    ("Put the inputs y needs into zs", "every graph input the selection still lacks", "zs_inputs"),
    ("Clear the selection", "forget y, xs and zs", "clear_selection"),
    ("Next tensor of this node", "cycle through the node's outputs and inputs", "next_tensor"),
    ("Feed the current tensor…", "random, zeros, ones, constant, .npy or an expression", "feed"),
    ("Run: compute the gradients", "dy/dx for every x, in the background", "run"),
    ("Verify the gradients…", "finite differences: auto, full, sample or fast mode", "verify"),
    ("Step mode", "forward, then reverse mode node by node with the local rules", "step"),
    ("Go to the culprit", "the first failing node, or where NaN/Inf starts; in diff mode the diff's", "go_to_culprit"),
    ("Diff with another model file…", "diff mode: B's values and gradients node by node; or a dtype", "diff"),
    ("Diff against float16", "this model against itself run in float16", "diff('float16')"),
    ("Diff against bfloat16", "this model against itself run in bfloat16", "diff('bfloat16')"),
    ("Diff against onnxruntime", "the engine against onnxruntime on this file, forward only", "diff('onnxruntime')"),
    ("Diff: show forward / gradient divergence", "what diff mode colours nodes by", "diff('where')"),
    ("Leave diff mode", "back to the normal view", "diff('leave')"),
    ("Switch view: forward / backward / combined", "the graph drawn", "cycle_view"),
    ("Switch device", "cpu, or cuda when present", "cycle_device"),
    ("Switch dtype: float32 / float64", "every float tensor computed in it", "toggle_dtype"),
    ("Set symbolic dims…", "batch, seq: the size of the values made up for unfed inputs", "set_dims"),
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


class Palette(CommandPalette):
    """Textual's palette without two races a fast typist (or the monkey test) hits, each of which
    ended the app: page up/down before its list is laid out again (KeyError from OptionList), and
    a second Enter in the frame the first one closed it (ScreenStackError: nothing to pop)."""

    def dismiss(self, result=None) -> AwaitComplete:
        if not self.is_current:
            return AwaitComplete()
        return super().dismiss(result)

    def _action_command_list(self, action: str) -> None:
        try:
            super()._action_command_list(action)
        except KeyError:
            pass  # the list's lines are being rebuilt: this one page key is dropped


def open_palette(app) -> None:
    """ctrl+p: the command palette, unless it is open already."""
    if app.use_command_palette and not Palette.is_open(app):
        app.push_screen(Palette(id="--command-palette"))


def search_commands(app, commands, placeholder: str = "Search for commands…"):
    return app.push_screen(Palette(providers=[SimpleProvider(app.screen, commands)], placeholder=placeholder))


def search_themes(app) -> None:
    app.push_screen(Palette(providers=[ThemeProvider], placeholder="Search for themes…"))

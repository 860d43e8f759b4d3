"""The App's keys: each binding has an id (what user keymaps and tests name) and a description."""
from __future__ import annotations

from textual.binding import Binding

SELECT = Binding.Group("Select")
SETTINGS = Binding.Group("View·dtype")
APP_BINDINGS = [
    Binding("q", "quit", "Quit", id="app.quit"),
    Binding("question_mark", "help", "Help", key_display="?", id="app.help"),
    Binding("slash", "search", "Find", key_display="/", id="app.search", priority=True),  # see NodeList
    Binding("y", "set_y", "Set y", id="selection.set_y", group=SELECT),
    Binding("x", "toggle_x", "Add/remove in xs", id="selection.toggle_x", group=SELECT),
    Binding("z", "toggle_z", "Add/remove in zs", id="selection.toggle_z", group=SELECT),
    Binding("i", "zs_inputs", "Inputs to zs", id="selection.zs_inputs", group=SELECT,
            tooltip="Put every graph input the selection still needs into zs"),
    Binding("c", "clear_selection", "Clear the selection", id="selection.clear", group=SELECT),
    Binding("o", "next_tensor", "Next", id="cursor.next_tensor",
            tooltip="Next tensor of this node (outputs, then inputs); from an input or weight, its reader"),
    Binding("f", "feed", "Feed", id="feed.open"),
    Binding("r", "run", "Run", id="work.run"),
    Binding("v", "verify", "Verify", id="work.verify"),
    Binding("s", "step", "Step", id="work.step"),
    Binding("e", "export", "Export", id="work.export"),
    Binding("n", "go_to_culprit", "Culprit", id="results.culprit", tooltip="The first failing node, NaN/Inf or divergence"),
    Binding("b", "diff", "Diff", id="diff.open", tooltip="Compare with another model file, float16, bfloat16 or onnxruntime"),
    Binding("B", "diff('where')", "Diff: forward/gradient", id="diff.where", tooltip="What diff mode colours nodes by"),
    Binding("g", "cycle_view", "View: forward/backward/combined", id="view.cycle", group=SETTINGS),
    Binding("d", "cycle_device", "Device: cpu/cuda", id="settings.device", group=SETTINGS),
    Binding("t", "toggle_dtype", "Dtype: float32/float64", id="settings.dtype", group=SETTINGS),
    Binding("D", "set_dims", "Dims", id="settings.dims", group=SETTINGS,
            tooltip="Sizes of the symbolic dims (batch, seq) for the values made up for unfed inputs"),
    Binding("h", "heat_source", "Heat", id="inspector.heat_source",
            tooltip="Heatmap shows the value / the gradient"),
    Binding("escape", "cancel", "Cancel", id="work.cancel"),
]

"""What values are computed from and which graph is drawn: feeds, symbolic dims, device, dtype, view."""
from __future__ import annotations

from typing import Protocol

from engine.errors import OnnxGradError
from engine.gradient.dims import symbolic_dims

from . import messages as m
from .host import Shown, Ui, tensor_or_warn
from .screens.dims import DimsScreen
from .screens.feed import CLEAR, FeedScreen


class SettingsApp(Ui, Protocol):
    def results_changed(self) -> None: ...

    def request_values(self, names) -> None: ...

    def request_layout(self) -> None: ...


class Settings:
    """The feed and dims dialogs, and the keys that switch device, dtype and view. After a change the
    App redraws the session (`results_changed`) and the values on show are asked for again."""

    def __init__(self, shown: Shown, app: SettingsApp):
        self.shown, self.app = shown, app

    def feed(self) -> None:
        tensor = tensor_or_warn(self.shown, self.app.notify)
        if tensor is None:
            return
        source, explicit = self.shown.session.feed_source(tensor)

        def try_feed(src) -> str | None:
            try:
                self.shown.session.set_feed(tensor, src)
            except OnnxGradError as exc:
                return str(exc)
            return None

        def done(result) -> None:
            if result is None:
                return
            if result == CLEAR:
                self.shown.session.clear_feed(tensor)
            self.app.results_changed()
            self.app.request_values([tensor])
            desc = None if result == CLEAR else result.describe()
            self.app.post_message(m.FeedChanged(tensor, desc))
            self.app.notify(f"{tensor}: {desc or 'feed removed'}", timeout=3)

        g = self.shown.session.graph
        unfed = (f"computed by {g.node_names[g.producer[tensor]]}" if tensor in g.producer
                 else "its initializer" if tensor in g.initializers else "not fed")
        self.app.push_screen(FeedScreen(tensor, source, explicit, try_feed, unfed), done)

    def set_dims(self) -> None:
        s = self.shown.session
        dims = symbolic_dims(s.graph)
        if not dims:
            self.app.notify("this model's inputs have no symbolic dims", severity="warning", timeout=3)
            return

        def try_dims(value) -> str | None:
            try:
                s.set_dims(value)
            except OnnxGradError as exc:
                return str(exc)
            return None

        def done(value) -> None:
            if value is None:
                return
            self.app.results_changed()
            self._values_on_show()
            self.app.notify(f"dims: {s.dims_text()}", timeout=3)

        self.app.push_screen(DimsScreen(dims, s.dims, try_dims), done)

    def cycle_device(self) -> None:
        self.app.notify(f"device: {self.shown.session.cycle_device()}", timeout=2)
        self._changed()

    def toggle_dtype(self) -> None:
        self.app.notify(f"dtype: {self.shown.session.toggle_dtype()}", timeout=2)
        self._changed()

    def cycle_view(self) -> None:
        self.shown.session.cycle_view()
        self.app.request_layout()
        self._changed()

    def _values_on_show(self) -> None:
        tensor = self.shown.cursor[1]
        self.app.request_values([tensor] if tensor else [])

    def _changed(self) -> None:
        s = self.shown.session
        self.app.results_changed()
        self._values_on_show()
        self.app.post_message(m.SettingsChanged(s.device, s.dtype, s.view))

"""The graph pane's layouts, made in thread workers: a big graph's neighbourhood of the cursor
first (drawn in the frame that asked for it), then the whole layout, swapped in with the cursor
still selected and in view."""
from __future__ import annotations

import gc
from typing import Callable, Protocol

from textual.worker import get_current_worker

from . import messages as m
from .host import Shown, Ui, in_thread, status_line
from .layout import layout_for, local_near, wants_local
from .marks import graph_marks
from .widgets.graph_view import prepare_canvas


class LayoutApp(Ui, Protocol):
    workers: object  # textual's WorkerManager: cancel_group
    screen_stack: list  # the main screen's status line is in screen_stack[0]

    def run_worker(self, work, **kwargs): ...

    def call_after_refresh(self, callback: Callable, *args) -> bool: ...

    def after_input(self, callback: Callable[[], None]) -> None: ...


OTHER_LAYOUTS_KEPT = 4  # backward and combined layouts kept, of the most recent selections


class LayoutWork:
    """Which layout the graph pane shows, for the session's view and selection, and where the cursor
    is in it. `placement` is "auto", "dot" or "layered" (layout.py)."""

    def __init__(self, shown: Shown, app: LayoutApp, placement: str = "auto"):
        self.shown, self.app, self.placement = shown, app, placement
        # (view, spec) -> the whole layout, once made: the forward view's for good, the others' for
        # the last OTHER_LAYOUTS_KEPT selections (each new selection makes a backward and combined one).
        self.layouts: dict[tuple, object] = {}
        self.frozen = False  # the first layout of this model is out of the cyclic collector's way
        self.local = None  # the engine.LocalLayout on screen while the whole layout is being made, else None
        self.collect_before_freeze = False  # set when a model replaces another (see new_model)

    def new_model(self, replacing: bool) -> None:
        self.layouts, self.local, self.frozen = {}, None, False
        if replacing:
            # What was frozen for the last model is collectable again; the next layout collects
            # it, once the widgets have let go of it, then freezes the new model (layout_ready).
            gc.unfreeze()
            self.collect_before_freeze = True
        else:
            # The loaded model lives as long as the session: out of the cyclic collector's way, or
            # its full passes over the model's objects stall the first paint.
            gc.freeze()

    def request(self, first: bool = False) -> None:
        """`first`: the model was just opened; a neighbourhood shown now is painted before the
        whole layout starts competing with the first frame for the interpreter."""
        s, cursor = self.shown.session, self.shown.cursor
        graph = self.app.query_one("#graph")
        spec = s.spec if s.view != "forward" else None
        self._drop_local()
        if s.view != "forward" and spec is None:
            graph.set_layout(None, f"the {s.view} view needs a valid selection: y and xs")
            return
        key = (s.view, spec)
        if key in self.layouts:
            self._apply_layout(self.layouts[key])
            return
        around = None
        if not wants_local(s.model):
            graph.set_layout(None, f"laying out the {s.view} graph…")
        elif s.view == "forward":  # cut from the graph index in milliseconds: drawn in this frame
            self._show_local(local_near(s.model, spec, s.view, cursor))
        else:  # the other views are cut from their whole view, built in the worker
            graph.set_layout(None, f"laying out the {s.view} graph…")
            around = cursor
        if first and self.local is not None:
            self.app.workers.cancel_group(self.app, "layout")  # a previous model's: its result is not news
            self.app.call_after_refresh(self._layout_if_wanted, s.model, key)
        else:
            self.run_layout(s.model, spec, s.view, key, around)

    def _layout_if_wanted(self, model, key) -> None:
        """The deferred start of the first whole layout, unless a view switch has asked for another."""
        s = self.shown.session
        if s is not None and model is s.model and key == self.key() and key not in self.layouts:
            self.run_layout(model, key[1], key[0], key)

    def run_layout(self, model, spec, view, key, around=None):
        return in_thread(self.app, "layout", self._lay_out, model, spec, view, key, around)

    def _lay_out(self, model, spec, view, key, around) -> None:
        """In the worker's thread."""
        worker = get_current_worker()
        if around is not None:
            local = local_near(model, spec, view, around)
            if not worker.is_cancelled:
                self.app.post_message(m.LocalLayoutReady(key, local, prepare_canvas(local.layout), model))
        layout = layout_for(model, spec, view, self.placement)
        canvas = prepare_canvas(layout)
        if not worker.is_cancelled:
            self.app.post_message(m.LayoutReady(key, layout, canvas, model))

    def show_cursor(self, node_index: int | None, tensor: str | None) -> None:
        """Select the box of the node, else of the tensor, else of the node producing the tensor;
        none where the view draws none of them (a box left selected would name another node)."""
        self.follow_local(node_index, tensor)
        if ids := self.boxes_for(node_index, tensor):
            self.app.query_one("#graph").select(ids[0])
        else:
            self.app.query_one("#graph").deselect()

    def follow_local(self, node_index, tensor) -> None:
        """While a neighbourhood is shown, a cursor that leaves it, or reaches its rim, gets its own."""
        if self.local is None or self.shown.session is None:
            return
        ids = self.boxes_for(node_index, tensor)
        if not ids or ids[0] in self.local.frontier:
            s = self.shown.session
            self._show_local(local_near(s.model, s.spec, s.view, (node_index, tensor)))

    def _drop_local(self) -> None:
        if self.local is not None:
            self.local = None
            status_line(self.app).note(None)

    def _show_local(self, local, canvas=None) -> None:
        self.local = local
        graph = self.app.query_one("#graph")
        graph.set_layout(local.layout, canvas=canvas)
        graph.set_marks(graph_marks(self.shown.session, local.layout))
        ids = self.boxes_for(*self.shown.cursor)
        if ids:
            graph.select(ids[0])
        note = f"the {local.shown:,} boxes nearest the cursor: laying out all {local.total:,}…"
        status_line(self.app).note(note)

    def boxes_for(self, node_index: int | None, tensor: str | None) -> list[str]:
        """The boxes showing the node, else the tensor, else the node producing the tensor, else (for a
        weight: a big model draws none) the first node reading it."""
        graph = self.app.query_one("#graph")
        near = _node_near(self.shown.session.graph, tensor)
        return graph.ids_for(node_index=node_index) or graph.ids_for(tensor=tensor) or graph.ids_for(node_index=near)

    def key(self) -> tuple:
        """The layout the session asks for: (view, spec), the spec only where the view draws it."""
        s = self.shown.session
        return (s.view, s.spec if s.view != "forward" else None)

    def _current(self, message) -> bool:
        """A layout message for the model open now (another model's views have the same keys)."""
        return message.model is None or message.model is self.shown.session.model

    def local_ready(self, message: m.LocalLayoutReady) -> None:
        if self._current(message) and message.key == self.key() and message.key not in self.layouts:
            self._show_local(message.local, message.canvas)

    def layout_ready(self, message: m.LayoutReady) -> None:
        if not self._current(message):
            return
        key, layout = message.key, message.layout
        self.layouts[key] = layout
        others = [k for k in self.layouts if k[1] is not None]
        for old in others[:-OTHER_LAYOUTS_KEPT]:
            del self.layouts[old]
        # The model and its first layout live as long as the session: leave them out of the cyclic
        # garbage collector, whose full passes over ~250k objects were 300 ms pauses on densenet.
        # Once: a freeze makes whatever garbage exists then immortal (the collector is off while
        # keys arrive), and a later layout's freeze took in closed step traces and old check
        # reports with it (GPT-2 124M grew to 10x its bytes under 500 random keys).
        if not self.frozen:
            self.frozen = True
            if self.collect_before_freeze:  # another model was opened: its objects go first, once
                self.collect_before_freeze = False
                gc.collect()
            gc.freeze()
        self.app.after_input(lambda: self._apply_if_shown(key, layout, message.canvas))
        self.app.post_message(m.WorkFinished("layout", "done"))

    def _apply_if_shown(self, key, layout, canvas) -> None:
        """Draw `layout` if its view is still the one asked for (a key may have switched views)."""
        if key == self.key():
            self._apply_layout(layout, canvas)

    def _apply_layout(self, layout, canvas=None) -> None:
        self._drop_local()
        graph = self.app.query_one("#graph")
        graph.set_layout(layout, canvas=canvas)
        graph.set_marks(graph_marks(self.shown.session, layout))
        self.show_cursor(*self.shown.cursor)


def _node_near(graph, tensor: str | None) -> int | None:
    """The node producing `tensor`, else, for a weight, the first node reading it."""
    if tensor in graph.initializers:
        return next(iter(graph.consumers.get(tensor, ())), None)
    return graph.producer.get(tensor) if tensor else None

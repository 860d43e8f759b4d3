"""Verify options: mode, tolerances, order, per-node; Enter runs the check with them."""
from __future__ import annotations

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.widgets import Button, Checkbox, Input, Label, RadioButton, RadioSet, Static

from ..guard import guarded
from ..state import CHECK_MODES, CheckOptions
from .dialog import Dialog

MODE_HELP = {"auto": "full where affordable, else fast; resolves coarse directions and falls back to per-node checks",
             "full": "every element of every x (exact, slowest)",
             "sample": "a seeded random sample of elements per x",
             "fast": "random directions: ⟨grad, u⟩ against the directional derivative"}


@guarded
class VerifyScreen(Dialog):
    """Dismisses with CheckOptions, or None when cancelled."""

    BINDINGS = [Binding("escape", "cancel", "Cancel", id="verify.cancel")]
    DEFAULT_CSS = """
    VerifyScreen { align: center middle; }
    VerifyScreen > Vertical { width: 70; max-width: 100%; height: auto; max-height: 100%;
                              border: thick $accent; background: $surface; padding: 0 1; }
    VerifyScreen RadioSet { layout: horizontal; width: 100%; }
    VerifyScreen Horizontal { height: auto; }
    VerifyScreen Input { width: 1fr; }
    VerifyScreen #verify-error { color: $error; text-style: bold; }
    VerifyScreen #verify-mode-help, VerifyScreen .verify-caption, VerifyScreen #verify-cost { color: $text-muted; }
    VerifyScreen #verify-mode-help { width: 100%; }  /* auto's help takes two lines: wrapped, not cut */
    VerifyScreen Button { margin-right: 2; margin-top: 1; }
    """

    def __init__(self, options: CheckOptions, elements: int = 0):
        super().__init__()
        self.options = options
        self.elements = elements  # elements in xs: full mode perturbs each one twice

    def compose(self) -> ComposeResult:
        o = self.options
        with Vertical():
            yield Label("[b]Verify gradients[/b] against float64 finite differences")
            with RadioSet(id="verify-mode"):
                for m in CHECK_MODES:
                    yield RadioButton(m, value=m == o.mode, id=f"mode-{m}")
            yield Label(MODE_HELP[o.mode], id="verify-mode-help")
            if self.elements:
                yield Label(f"xs hold {self.elements:,} elements: full mode = {2 * self.elements:,} perturbed forwards",
                            id="verify-cost")
            yield Label("rtol / atol (empty: defaults for the dtype) and seed", classes="verify-caption")
            with Horizontal():
                yield Input("" if o.rtol is None else f"{o.rtol:g}", placeholder="rtol", id="verify-rtol")
                yield Input("" if o.atol is None else f"{o.atol:g}", placeholder="atol", id="verify-atol")
                yield Input(str(o.seed), placeholder="seed", id="verify-seed")
            with Horizontal():
                yield Checkbox("second order", o.order == 2, id="verify-order")
                yield Checkbox("per node", o.per_node, id="verify-per-node")
            yield Label("", id="verify-error")
            with Horizontal():
                yield Button("Run check", variant="primary", id="verify-run")
                yield Button("Cancel", id="verify-cancel")
            yield Static("tab / shift+tab: next / previous field; ←/→ then enter: mode; space ticks a box; "
                         "enter in a field or on Run check runs; esc cancels.", classes="verify-caption")

    def on_mount(self) -> None:
        self.query_one("#verify-run", Button).focus()

    def on_radio_set_changed(self, event: RadioSet.Changed) -> None:
        self.query_one("#verify-mode-help", Label).update(MODE_HELP[str(event.pressed.label)])

    def on_input_submitted(self, event: Input.Submitted) -> None:
        event.stop()
        self._run()

    def on_button_pressed(self, event: Button.Pressed) -> None:
        if event.button.id == "verify-run":
            self._run()
        else:
            self.dismiss(None)

    def action_cancel(self) -> None:
        self.dismiss(None)

    def _run(self) -> None:
        try:
            options = CheckOptions(
                mode=str(self.query_one(RadioSet).pressed_button.label),
                rtol=_number(self.query_one("#verify-rtol", Input).value, "rtol"),
                atol=_number(self.query_one("#verify-atol", Input).value, "atol"),
                seed=int(_number(self.query_one("#verify-seed", Input).value, "seed") or 0),
                order=2 if self.query_one("#verify-order", Checkbox).value else 1,
                per_node=self.query_one("#verify-per-node", Checkbox).value,
            )
        except ValueError as exc:
            self.query_one("#verify-error", Label).update(str(exc))
            return
        self.dismiss(options)


def _number(text: str, what: str) -> float | None:
    text = text.strip()
    if not text:
        return None
    try:
        v = float(text)
    except ValueError:
        raise ValueError(f"{what} must be a number, not {text!r}") from None
    if v < 0:
        raise ValueError(f"{what} must not be negative")
    return v

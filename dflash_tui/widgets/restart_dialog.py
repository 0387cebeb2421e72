"""Restart's dialog: the choices restart_offer.py offers in the run's state, nothing else.

Enter on the focused resume (or continue) button takes it; a start from step 0 discards what
was trained, so it takes the word `fresh` typed into its line and Enter: no bare letter, and
no button Tab could reach, confirms it. A run that died before start shows its launch's
overrides, one line each to keep or edit, with a `drop` box beside it (Tab to it, space), and
a line to add one; the one its error names is marked. The list is checked against the
launch's config as the trainer checks it: a bad one is said under it, and nothing relaunches.
A finished run offers "Continue" N more steps (the lr held, or a new schedule: the dialog
says which) and a new run. The labels quote the host (run ids, checkpoint names, overrides):
Text, never markup.
"""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Button, Checkbox, Input, Static

from dflash_tui.restart_edits import problems
from dflash_tui.restart_offer import CONTINUE, DIED_BEFORE_START, FRESH_WORD, Choice, Offer
from dflash_tui.widgets import safe


class RestartDialog(ModalScreen[Choice | None]):
    BINDINGS = [Binding("escape", "cancel", "cancel")]
    DEFAULT_CSS = """
    RestartDialog { align: center middle; }
    RestartDialog > VerticalScroll { width: 100; max-width: 100%; height: auto;
                                     max-height: 100%; border: thick $warning;
                                     background: $surface; padding: 0 1; }
    RestartDialog Horizontal { height: auto; }
    RestartDialog Horizontal > Static { width: auto; padding-top: 1; }
    RestartDialog Button { margin-right: 2; }
    RestartDialog #overrides { height: auto; max-height: 12; }
    RestartDialog Input { width: 1fr; }
    RestartDialog .offending { border: tall $error; }
    RestartDialog .override > Checkbox { width: auto; }
    RestartDialog #more { width: 14; }
    RestartDialog #error { color: $error; }
    RestartDialog #fresh-word { width: 24; }
    """

    def __init__(self, offer: Offer) -> None:
        super().__init__()
        self.offer = offer

    def compose(self) -> ComposeResult:
        o = self.offer
        # Scrolls when taller than the terminal (80x24): the focused line is kept in view.
        with VerticalScroll(id="dialog"):
            yield Static(safe.text(o.question), id="question")
            if o.detail:
                yield Static(safe.text(o.detail, "dim"), id="detail")
            if o.state == DIED_BEFORE_START:
                if o.error:
                    yield Static(safe.text(o.error), id="error")
                if o.overrides is None:
                    yield Static(
                        Text("launch.json unreadable: its overrides are kept as they were"),
                        id="no-overrides",
                    )
                else:
                    if not o.overrides:
                        yield Static(Text("no overrides: the config file itself is at fault"))
                    with VerticalScroll(id="overrides"):
                        for i, value in enumerate(o.overrides):
                            with Horizontal(classes="override"):
                                line = Input(value, id=f"override-{i}")
                                if i in o.offending:
                                    line.add_class("offending")
                                    line.border_title = "the error names this key"
                                yield line
                                yield Checkbox("drop", id=f"drop-{i}")
                        yield Input(placeholder="add an override: KEY=VALUE", id="override-add")
                    yield Static(Text(""), id="edit-error")
            if o.state == CONTINUE:
                with Horizontal():
                    yield Static(Text("more steps "))
                    yield Input(str(max(1, o.steps)), id="more", restrict=r"[0-9]*", max_length=9)
                    yield Checkbox("new schedule", id="new-schedule")
                yield Static(Text(""), id="lr")
            with Horizontal():
                if o.resume_label:
                    yield Button(safe.text(o.resume_label), id="resume", variant="primary")
                yield Button(Text("Cancel"), id="cancel")
            yield Static(Text(f"{o.fresh_label}: type {FRESH_WORD} and Enter"), id="fresh-label")
            yield Input(placeholder=FRESH_WORD, id="fresh-word", max_length=16)
            keys = "esc = cancel"
            if o.resume_label:
                keys = f"Enter = {o.resume_label.lower()}    {keys}"
            yield Static(Text(keys, style="dim"), id="keys")

    def on_mount(self) -> None:
        self.say_lr()
        o = self.offer
        if o.state == CONTINUE:
            self.query_one("#more", Input).focus()  # N, then Enter continues
        elif o.resume_label:
            self.query_one("#resume", Button).focus()  # Enter resumes: the default
        elif o.offending and o.overrides:
            self.query_one(f"#override-{o.offending[0]}", Input).focus()
        else:
            self.query_one("#fresh-word", Input).focus()

    def more_steps(self) -> int:
        text = self.query_one("#more", Input).value
        return int(text) if text.isdigit() else 0

    def say_lr(self) -> None:
        """What the continued run's learning rate does, as the operator sets it."""
        if self.offer.state != CONTINUE:
            return
        n = self.more_steps()
        new = self.query_one("#new-schedule", Checkbox).value
        if n < 1:
            words = "more steps: at least 1"
        elif new:
            words = self.offer.lr_new.format(n=n, end=self.offer.steps + n)
        else:
            words = self.offer.lr_held
        end = f"to step {self.offer.steps + n}: " if n >= 1 else ""
        self.query_one("#lr", Static).update(safe.text(end + words, "dim"))
        self.query_one("#resume", Button).label = Text(f"Continue {n} more steps")

    def on_input_changed(self, event: Input.Changed) -> None:
        if event.input.id == "more":
            self.say_lr()

    def on_checkbox_changed(self, event: Checkbox.Changed) -> None:
        box = event.checkbox.id or ""
        if box.startswith("drop-"):  # a dropped line is greyed out, and Tab passes it by
            self.query_one(f"#override-{box[5:]}", Input).disabled = event.value
        self.say_lr()

    def on_input_submitted(self, event: Input.Submitted) -> None:
        event.stop()
        if event.input.id == "more":
            self.take_resume()
        elif event.input.id == "fresh-word":
            if event.value.strip().lower() == FRESH_WORD:
                self.take_fresh()
            else:
                event.input.value = ""
                self.notify(f"type {FRESH_WORD} to start from step 0", severity="warning")
        # Enter in an override's line confirms nothing: it is being edited

    def take_fresh(self) -> None:
        """Relaunch from step 0, with the overrides as edited when the trainer would take
        them; else each bad one is said under the list and the word is typed again."""
        overrides = self.edited_overrides()
        o = self.offer
        died_of = [o.overrides[i] for i in o.offending] if o.overrides is not None else []
        bad = problems(overrides, o.config_toml, died_of) if overrides is not None else []
        if not bad:
            self.dismiss(Choice(fresh=True, overrides=overrides))
            return
        self.query_one("#edit-error", Static).update(safe.text("\n".join(bad), newlines=True))
        self.query_one("#fresh-word", Input).value = ""
        self.notify("an override the trainer would refuse: see the dialog", severity="error")

    def on_button_pressed(self, event: Button.Pressed) -> None:
        if event.button.id == "resume":
            self.take_resume()
        else:
            self.dismiss(None)

    def take_resume(self) -> None:
        if self.offer.state == CONTINUE:
            n = self.more_steps()
            if n < 1:
                self.notify("more steps: at least 1", severity="warning")
                return
            new = self.query_one("#new-schedule", Checkbox).value
            self.dismiss(Choice(more_steps=n, new_schedule=new))
        elif self.offer.resume_label:
            self.dismiss(Choice())

    def edited_overrides(self) -> list[str] | None:
        """The overrides as the operator left them (a dropped or emptied line left out, the
        added one last); None: the parent's, unchanged (no editor shown)."""
        o = self.offer
        if o.state != DIED_BEFORE_START or o.overrides is None:
            return None
        lines = [
            self.query_one(f"#override-{i}", Input).value
            for i in range(len(o.overrides))
            if not self.query_one(f"#drop-{i}", Checkbox).value
        ]
        lines.append(self.query_one("#override-add", Input).value)
        return [v.strip() for v in lines if v.strip()]

    def action_cancel(self) -> None:
        self.dismiss(None)

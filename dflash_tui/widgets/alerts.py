"""Alerts: the diagnosis findings, each with its evidence and what to do; `x` on the focused
alerts pane explains their codes (the text of `dflash-tui explain CODE`)."""

from __future__ import annotations

from rich.console import Group
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.screen import ModalScreen
from textual.widgets import Static

from dflash_tui.diagnosis import Finding
from dflash_tui.widgets import quiet, safe
from dflash_tui.widgets.panes import Pane, VimScroll

STYLE = {"critical": "bold red", "warning": "bold yellow", "info": "cyan"}


class AlertsPane(Static):
    DEFAULT_CSS = """
    AlertsPane { height: auto; padding: 0 1; }
    """

    findings: tuple[Finding, ...] = ()  # those shown now

    def update_findings(self, findings: list[Finding]) -> None:
        self.findings = tuple(findings)
        if not findings:
            quiet.update(self, Text.assemble(("✓ nothing wrong that I can see", "green")))
            return
        parts = []
        for f in findings:
            # Findings quote the host (thread names, errors, log lines): all through `safe`.
            parts.append(
                Text.assemble(
                    (f"● {f.severity}: ", STYLE.get(f.severity, "")), safe.text(f.title, "bold")
                )
            )
            parts.append(safe.text(f"   {f.evidence}", "dim"))
            parts.append(safe.text(f"   → {f.action}", "italic"))
        quiet.update(self, Group(*parts))


class AlertsBox(Pane):
    """The alerts' box: focused, `x` opens what each alert's code means (ExplainScreen)."""

    BINDINGS = [Binding("x", "explain", "explain")]

    def action_explain(self) -> None:
        codes = list(dict.fromkeys(f.code for f in self.query_one(AlertsPane).findings))
        if not codes:
            self.app.notify("no alert to explain", timeout=3)
            return
        self.app.push_screen(ExplainScreen(codes))


class ExplainScreen(ModalScreen[None]):
    """The registry's entry for each code of the alerts shown, one at a time: what it
    means, how it is decided (thresholds at their defaults), what to do. The text is ours
    (dflash_tui/diagnosis/docs.py), a code is the rules' own: no host text here."""

    BINDINGS = [
        Binding("escape,q,x", "app.pop_screen", "close"),
        Binding("right,n", "move(1)", "next alert"),
        Binding("left,p", "move(-1)", "alert before"),
    ]
    DEFAULT_CSS = """
    ExplainScreen { align: center middle; }
    ExplainScreen > VimScroll { width: 96; max-width: 100%; height: auto; max-height: 100%;
                                border: thick $primary; background: $surface; padding: 0 1;
                                scrollbar-size-vertical: 1; }
    """

    def __init__(self, codes: list[str]) -> None:
        super().__init__()
        self.codes, self.index = codes, 0

    def compose(self) -> ComposeResult:
        with VimScroll():
            yield Static(self.body(), id="explain")

    def on_mount(self) -> None:
        self.query_one(VimScroll).focus()

    def body(self) -> Text:
        from dflash_tui.diagnosis import docs

        code = self.codes[self.index]
        known = code in docs.codes()
        keys = f"alert {self.index + 1} of {len(self.codes)}"
        keys += " · ← → the others" if len(self.codes) > 1 else ""
        return (
            Text(f"{code}", style="bold")
            + Text(f"   {keys} · j/k scroll · esc close\n\n", style="dim")
            + Text(docs.explain(code) if known else f"{code}: not in the rules' registry")
        )

    def action_move(self, by: int) -> None:
        self.index = (self.index + by) % len(self.codes)
        self.query_one("#explain", Static).update(self.body())

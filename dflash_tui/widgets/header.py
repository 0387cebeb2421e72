"""The top bar: target, connection and round trip, run id, phase (or how the run ended) and
time in it, and how many malformed lines were skipped."""

from __future__ import annotations

from rich.text import Text
from textual.widgets import Static

from dflash_tui.fmt import duration
from dflash_tui.state import Store
from dflash_tui.widgets import quiet, safe


class StatusBar(Static):
    DEFAULT_CSS = """
    StatusBar { height: 1; background: $panel; color: $foreground; padding: 0 1; }
    """

    def update_from(self, s: Store) -> None:
        t = Text()
        t.append(" dflash-tui ", style="bold reverse")
        t.append(safe.text(f"  {s.target}  ", "bold"))
        link = s.link.state
        colour = {
            "connected": "green",
            "reconnecting": "yellow",
            "connecting": "yellow",
            "refused": "red",
        }.get(link, "white")
        t.append(f"● {link}", style=f"bold {colour}")
        if s.link.rtt_ms is not None and link == "connected":
            t.append(f" {s.link.rtt_ms:.0f}ms", style="dim")
        if link == "reconnecting" and s.link.retry_in:
            t.append(f" (retry in {s.link.retry_in:.1f}s)", style="yellow")
        t.append("   run ")
        t.append(safe.text(s.run_id or "—", "bold"))
        phase, age = s.shown_phase()
        if phase:
            style = {
                "training": "bold green",
                "crashed": "bold red",
                "killed": "bold red",
                "died before start": "bold red",
                "finished": "cyan",
            }.get(phase.split(" (")[0], "bold yellow")  # `killed (SIGKILL)` is red too
            t.append("   ")
            t.append(safe.text(f" {phase} ", f"reverse {style}"))  # a newer trainer's phase
            if age is not None:
                t.append(f" {duration(age)}")
        if s.malformed:
            t.append(f"   {s.malformed} malformed lines skipped", style="yellow")
        quiet.update(self, t)

"""The top bar: target, connection and round trip, phase (or how the run ended) and time in
it, step, tok/s, run id, and how many malformed lines were skipped.

Fitted to the terminal's width by priority: at 80 columns the phase, step and tok/s stay and
the run id is cut in its middle (its date and its tail tell runs apart); the app's own name
goes first."""

from __future__ import annotations

from rich.text import Text
from textual.widgets import Static

from dflash_tui import sanitize
from dflash_tui.fmt import count, duration, rate
from dflash_tui.state import Store
from dflash_tui.widgets import quiet, safe

RUN_ID_MIN = 12  # the run id is cut to no fewer characters than this, else left out


def middle_cut(value: str, width: int) -> str:
    """`value` in at most `width` characters, its middle replaced by `…`."""
    if len(value) <= width:
        return value
    if width < 3:
        return value[:width]
    head = (width - 1) // 2
    tail = width - 1 - head
    return value[:head] + "…" + value[-tail:]


class StatusBar(Static):
    DEFAULT_CSS = """
    StatusBar { height: 1; background: $panel; color: $foreground; padding: 0 1; }
    """

    def update_from(self, s: Store) -> None:
        self._store = s
        quiet.update(self, self.line(s, self.size.width - 2 if self.size.width else 1000))

    def on_resize(self) -> None:
        store = getattr(self, "_store", None)
        if store is not None:
            self.update_from(store)

    def line(self, s: Store, width: int) -> Text:
        """The bar's text in `width` cells: the parts that fit, most important first."""
        link = s.link.state
        colour = {
            "connected": "green",
            "reconnecting": "yellow",
            "connecting": "yellow",
            "refused": "red",
        }.get(link, "white")
        conn = Text(f"● {link}", style=f"bold {colour}")
        if s.link.rtt_ms is not None and link == "connected":
            conn.append(f" {s.link.rtt_ms:.0f}ms", style="")
        if link == "reconnecting" and s.link.retry_in:
            conn.append(f" (retry in {s.link.retry_in:.1f}s)", style="yellow")

        phase_part = Text()
        phase, age = s.shown_phase()
        if phase:
            style = {
                "training": "bold green",
                "crashed": "bold red",
                "killed": "bold red",
                "died before start": "bold red",
                "finished": "cyan",
            }.get(phase.split(" (")[0], "bold yellow")  # `killed (SIGKILL)` is red too
            phase_part.append(safe.text(f" {phase} ", f"reverse {style}"))  # a newer phase
            if age is not None:
                phase_part.append(f" {duration(age, s.outcome() is not None)}")
        hb = s.heartbeat
        step = Text(f"step {count(hb.step)}", style="bold") if hb is not None else Text()
        toks = Text(rate(hb.tok_s)) if hb is not None and hb.tok_s is not None else Text()
        malformed = (
            Text(f"{s.malformed} malformed lines skipped", style="yellow")
            if s.malformed
            else Text()
        )
        badge = Text(" dflash-tui ", style="bold reverse")
        target = safe.text(s.target, "bold")

        # (priority, part): lower numbers are kept first; shown in this order.
        parts = [
            (6, badge),
            (1, target),
            (0, conn),
            (0, phase_part),
            (2, step),
            (3, toks),
            (5, malformed),
        ]
        parts = [(p, t) for p, t in parts if t.plain]
        sep = 3
        kept: set[int] = set()
        used = 0
        for i in sorted(range(len(parts)), key=lambda i: parts[i][0]):
            need = parts[i][1].cell_len + (sep if kept else 0)
            if used + need <= width:
                kept.add(i)
                used += need
        # The run id takes what is left, cut in the middle; shown after tok/s.
        room = width - used - sep - len("run ")
        run_id = sanitize.field(s.run_id or "—")
        run = Text()
        if room >= min(RUN_ID_MIN, len(run_id)):
            run.append("run ")
            run.append(safe.text(middle_cut(run_id, room), "bold"))
        out = Text()
        for i, (_, part) in enumerate(parts):
            if i not in kept:
                continue
            if part is malformed and run.plain:
                out.append(" " * sep)
                out.append_text(run)
                run = Text()
            if out.plain:
                out.append(" " * sep)
            out.append_text(part)
        if run.plain:
            out.append(" " * sep)
            out.append_text(run)
        return out

"""The step log: a live tail of train.log with the fields highlighted, follow/pause, a
regular-expression filter, wrap or horizontal scroll. Bounded: the store keeps a ring
buffer, the widget a fixed number of lines."""

from __future__ import annotations

import re

from rich.text import Text
from textual import events
from textual.widgets import RichLog

from dflash_tui import sanitize
from dflash_tui.state import Store
from dflash_tui.widgets import safe
from dflash_tui.widgets.panes import VIM_SCROLL

_FIELD = re.compile(r"\b(step|loss|acc|streak|lr|noise|tgt|dft|q_pre|q_hs|epoch|ETA)([=~])")
_TOKS = re.compile(r"\(([\d.]+[KM]?tok/s)\)")
# The trainer's `[479m] ` (minutes since the run started): bracketed, it reads as a leaked
# ANSI code in a terminal (ESC[0m), so it is shown as `+479m`.
_ELAPSED = re.compile(r"^\[(\d{1,9})m\] ")


class FilterError(ValueError):
    """A filter that is not a regular expression, said in one line."""


def compile_filter(pattern: str) -> re.Pattern[str] | None:
    """The step log's filter: a regular expression, case-insensitive; None for none."""
    if not pattern:
        return None
    try:
        return re.compile(pattern, re.IGNORECASE)
    except re.error as e:
        where = f" at {e.pos}" if e.pos is not None else ""
        raise FilterError(f"not a regex: {e.msg}{where}") from None


def elapsed_label(minutes: int) -> str:
    return "0m" if minutes == 0 else f"+{minutes}m"


def shown(raw: str) -> str:
    """One train.log line as the pane shows it (and as the filter reads it): its control
    characters visible, the elapsed minutes unbracketed."""
    line = sanitize.line(raw, safe.LINE_LIMIT)
    m = _ELAPSED.match(line)
    return elapsed_label(int(m.group(1))) + " " + line[m.end() :] if m else line


def highlight(raw: str) -> Text:
    """One train.log line as shown (never markup), the fields highlighted."""
    t = Text(shown(raw))  # through the terminal boundary above
    if _ELAPSED.match(sanitize.line(raw, 64)):
        t.stylize("dim", 0, t.plain.index(" "))
    line = t.plain
    if line.startswith("error") or "Traceback" in line or "Error" in line:
        t.stylize("bold red")
        return t
    if line.startswith("WARNING"):
        t.stylize("yellow")
        return t
    for m in _FIELD.finditer(line):
        t.stylize("bold cyan", m.start(1), m.end(1))
    for m in _TOKS.finditer(line):
        t.stylize("bold green", m.start(1), m.end(1))
    return t


class StepLog(RichLog):
    MAX_LINES = 2000
    BINDINGS = VIM_SCROLL  # arrows (left/right too, unwrapped) come with the scroll view

    def __init__(self, **kw: object) -> None:
        super().__init__(max_lines=self.MAX_LINES, wrap=False, markup=False, **kw)  # type: ignore[arg-type]
        self.following = True
        self.pattern = ""
        self._regex: re.Pattern[str] | None = None
        self._run_id: str | None = None
        self._total_seen = 0  # the store's log_total this widget has shown up to
        self._store: Store | None = None
        self._drawn_width = 0
        self.reading = False  # scrolled up by the operator: new lines do not pull it down

    def set_filter(self, pattern: str, s: Store) -> None:
        """Raises FilterError (the filter is left as it was)."""
        self._regex = compile_filter(pattern)
        self.pattern = pattern
        self.rebuild(s)

    def _write(self, t: Text, scroll_end: bool) -> None:
        if self._regex is not None and not self._regex.search(t.plain):
            return
        # Unwrapped, a line keeps its whole width (scroll left/right to read its end: a
        # traceback's "line 314" must not read "line 31"); wrapped, it folds at the pane.
        self.write(t, shrink=self.wrap, scroll_end=scroll_end)

    def rebuild(self, s: Store) -> None:
        self.clear()
        self.reading = False
        self._store = s
        self._drawn_width = self.scrollable_content_region.width
        for ln in list(s.log_lines)[-self.MAX_LINES :]:
            self._write(highlight(ln), scroll_end=self.following)
        self._run_id, self._total_seen = s.run_id, s.log_total

    def update_from(self, s: Store) -> None:
        self._store = s
        if s.run_id != self._run_id:
            self.rebuild(s)
            return
        if not self.following:
            return  # paused: new lines wait in the store's ring buffer
        new = s.log_total - self._total_seen
        if new <= 0:
            return
        self._total_seen = s.log_total
        for ln in list(s.log_lines)[-min(new, len(s.log_lines)) :]:
            self._write(highlight(ln), scroll_end=not self.reading)

    # Scrolled up to read (k, PgUp, g, the wheel): new lines come in below and the view
    # stays, until the operator scrolls back to the end (G, End, j or the wheel down there).
    # Set by what the operator did, never by where the view is as lines arrive: a
    # scroll to the end still under way is not a scroll away from it.
    def action_scroll_up(self) -> None:
        super().action_scroll_up()
        self.reading = True

    def action_page_up(self) -> None:
        super().action_page_up()
        self.reading = True

    def action_scroll_home(self) -> None:
        super().action_scroll_home()
        self.reading = True

    def action_scroll_end(self) -> None:
        super().action_scroll_end()
        self.reading = False

    def action_scroll_down(self) -> None:
        super().action_scroll_down()
        self._still_reading()

    def action_page_down(self) -> None:
        super().action_page_down()
        self._still_reading()

    def on_mouse_scroll_up(self, event: events.MouseScrollUp) -> None:
        self.reading = True

    def on_mouse_scroll_down(self, event: events.MouseScrollDown) -> None:
        self.call_after_refresh(self._still_reading)

    def _still_reading(self) -> None:
        self.reading = self.scroll_target_y < self.max_scroll_y

    def toggle_follow(self, s: Store) -> bool:
        self.following = not self.following
        if self.following:
            self.rebuild(s)
        return self.following

    def toggle_wrap(self, s: Store) -> bool:
        self.wrap = not self.wrap
        self.rebuild(s)
        return self.wrap

    def on_resize(self, event: events.Resize) -> None:
        # Wrapped lines were folded at the old width (RichLog's own handler runs too).
        width = self.scrollable_content_region.width
        if self.wrap and self._store is not None and width != self._drawn_width:
            self.rebuild(self._store)

    def title(self) -> Text:
        """The box's title: paused, wrapped, the filter and how many lines it lets through."""
        t = Text("Step log")
        if not self.following:
            t.append("  [paused: f to follow]", style="yellow")
        if self.wrap:
            t.append("  [wrap]", style="dim")
        if self.pattern:
            lines = list(self._store.log_lines) if self._store is not None else []
            regex = self._regex
            matched = sum(1 for ln in lines if regex is None or regex.search(shown(ln)))
            t.append("  [filter /")
            t.append(safe.text(self.pattern))  # the operator's own words, shown as typed
            t.append(f"/ · {matched} of {len(lines)} lines]")
        return t

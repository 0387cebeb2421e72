"""The step log: a live tail of train.log with the fields highlighted, follow/pause and a
filter. Bounded: the store keeps a ring buffer, the widget a fixed number of lines."""

from __future__ import annotations

import re

from rich.text import Text
from textual.widgets import RichLog

from dflash_tui.state import Store
from dflash_tui.widgets import safe

_FIELD = re.compile(r"\b(step|loss|acc|streak|lr|noise|tgt|dft|q_pre|q_hs|epoch|ETA)([=~])")
_TOKS = re.compile(r"\(([\d.]+[KM]?tok/s)\)")


def highlight(raw: str) -> Text:
    """One train.log line as shown: its control characters visible (never markup), the
    fields highlighted in what is shown."""
    t = safe.log_line(raw)
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
    if line.startswith("["):
        end = line.find("]") + 1
        t.stylize("dim", 0, end)
    return t


class StepLog(RichLog):
    MAX_LINES = 2000

    def __init__(self, **kw: object) -> None:
        super().__init__(max_lines=self.MAX_LINES, wrap=False, markup=False, **kw)  # type: ignore[arg-type]
        self.following = True
        self.pattern = ""
        self._run_id: str | None = None
        self._total_seen = 0  # the store's log_total this widget has shown up to

    def _matches(self, line: str) -> bool:
        return not self.pattern or self.pattern.lower() in line.lower()

    def set_filter(self, pattern: str, s: Store) -> None:
        self.pattern = pattern
        self.rebuild(s)

    def rebuild(self, s: Store) -> None:
        self.clear()
        lines = [ln for ln in s.log_lines if self._matches(ln)]
        for ln in lines[-self.MAX_LINES :]:
            self.write(highlight(ln), scroll_end=self.following)
        self._run_id, self._total_seen = s.run_id, s.log_total

    def update_from(self, s: Store) -> None:
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
            if self._matches(ln):
                self.write(highlight(ln), scroll_end=True)

    def toggle_follow(self, s: Store) -> bool:
        self.following = not self.following
        if self.following:
            self.rebuild(s)
        return self.following

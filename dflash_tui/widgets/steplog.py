"""The step log: a live tail of train.log with the fields highlighted, follow/pause and a
filter. Bounded: the store keeps a ring buffer, the widget a fixed number of lines.

Paged back (g / Home: the file's first page; PageUp at the top: the page before; PageDown at
the bottom: the page after): the widget asks the app for a page by byte range (`PageWanted`)
and shows that window of the file (dflash_tui/log_pages.py), then the store's tail where the
two join; f or G / End goes back to following the newest lines."""

from __future__ import annotations

import re

from rich.text import Text
from textual.binding import Binding
from textual.message import Message
from textual.widgets import RichLog

from dflash_tui.log_pages import Window, page_lines
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
    BINDINGS = [
        Binding("g,home", "log_top", "top of log", show=False),
        Binding("G,end", "log_newest", "newest", show=False),
        Binding("pageup", "page_up", "page up", show=False),
        Binding("pagedown", "page_down", "page down", show=False),
    ]

    class PageWanted(Message):
        """A page of train.log by byte range: `start` (from there on) or `end` (the page
        before it). The app fetches it and hands it to `show_page`."""

        def __init__(self, start: int | None, end: int | None) -> None:
            super().__init__()
            self.start, self.end = start, end

    def __init__(self, **kw: object) -> None:
        super().__init__(max_lines=self.MAX_LINES, wrap=False, markup=False, **kw)  # type: ignore[arg-type]
        self.following = True
        self.pattern = ""
        self._run_id: str | None = None
        self._total_seen = 0  # the store's log_total this widget has shown up to
        self._follows = 0  # the store's fresh follows this widget has shown
        self.window: Window | None = None  # paged back: the lines fetched, else None
        self._store: Store | None = None  # the store last drawn from (for the page keys)

    # -- paging back -------------------------------------------------------------------
    def action_log_top(self) -> None:
        """The file's first page, fetched (the store's tail may be too long to show it)."""
        self.post_message(self.PageWanted(0, None))

    def action_log_newest(self) -> None:
        self.window = None
        self.following = True
        if self._store is not None:
            self.rebuild(self._store)
        self.scroll_end(animate=False)

    def action_page_up(self) -> None:
        """PageUp; at the top of what is shown, the page of the file before it."""
        start = self.window.start if self.window is not None else self._tail_start()
        if self.scroll_y <= 0 and start is not None and start > 0:
            self.post_message(self.PageWanted(None, start))
            return
        super().action_page_up()

    def action_page_down(self) -> None:
        """PageDown; at the bottom of a window that does not reach the store's tail yet,
        the page of the file after it."""
        w = self.window
        at_bottom = self.scroll_y >= self.max_scroll_y
        if w is not None and at_bottom and not w.joins(self._tail_start()):
            self.post_message(self.PageWanted(w.end, None))
            return
        super().action_page_down()

    def _tail_start(self) -> int | None:
        return self._store.log_start() if self._store is not None else None

    def show_page(self, text: str, start: int, end: int, s: Store) -> None:
        """A fetched page: joined after the window (paging forward), before it (paging
        back), or as a new one (g)."""
        if s.run_id != self._run_id or s.follows != self._follows:
            return  # another run was chosen while it was on its way
        w = self.window
        self.following = False
        if w is not None and w.lines and start == w.end and start > 0:
            w.append(text, start, end)
            self.rebuild(s)
            # at the new page's first line (a line of the one before above it, for context)
            first_new = len(w.lines) - len(page_lines(text, start))
            self.scroll_to(y=max(0, first_new - 1), animate=False)
            return
        if w is None or end != w.start:
            self.window = w = Window()
        w.prepend(text, start, end)
        self.rebuild(s)
        self.scroll_home(animate=False)

    def paged_lines(self, s: Store) -> list[str]:
        """What the window shows: its lines, then the store's tail from where it ends (or a
        line saying what lies between the two)."""
        w = self.window
        if w is None:
            return list(s.log_lines)
        lines = [text for _, text in w.lines]
        if w.joins(s.log_start()):
            lines += [t for o, t in zip(s.log_offsets, s.log_lines, strict=False) if o >= w.end]
        else:
            lines.append(
                f"… more of train.log after byte {w.end:,}: PageDown for the next page, "
                "G / End for the newest"
            )
        return lines

    def _matches(self, line: str) -> bool:
        return not self.pattern or self.pattern.lower() in line.lower()

    def set_filter(self, pattern: str, s: Store) -> None:
        self.pattern = pattern
        self.rebuild(s)

    def rebuild(self, s: Store) -> None:
        self.clear()
        self._store = s
        if s.follows != self._follows:
            self.window = None  # another run (or this one afresh): its window is not this one
        lines = [ln for ln in self.paged_lines(s) if self._matches(ln)]
        shown = lines[: self.MAX_LINES] if self.window is not None else lines[-self.MAX_LINES :]
        for ln in shown:
            self.write(highlight(ln), scroll_end=self.following)
        self._run_id, self._total_seen, self._follows = s.run_id, s.log_total, s.follows

    def update_from(self, s: Store) -> None:
        self._store = s
        if s.run_id != self._run_id or s.follows != self._follows:
            self.following = True  # a run just chosen is shown from its newest lines
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
            self.window = None
            self.rebuild(s)
        return self.following

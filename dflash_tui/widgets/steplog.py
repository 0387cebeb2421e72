"""The step log: a live tail of train.log with the fields highlighted, follow/pause, a
regular-expression filter, wrap or horizontal scroll. Bounded: the store keeps a ring
buffer, the widget a fixed number of lines.

Paged back (g / Home: the file's first page; PageUp at the top: the page before; PageDown at
the bottom: the page after): the widget asks the app for a page by byte range (`PageWanted`)
and shows that window of the file (dflash_tui/log_pages.py), then the store's tail where the
two join; f or G / End goes back to following the newest lines.

A wall-clock column (C on the dashboard): each step line's time, as metrics.jsonl's row of
that step recorded it (the trainer's clock), in the operator's time zone; a line that is no
step line has no time of its own and leaves the column blank."""

from __future__ import annotations

import re
import time

from rich.text import Text
from textual import events
from textual.binding import Binding
from textual.geometry import Size
from textual.message import Message
from textual.widgets import RichLog

from dflash_tui import sanitize
from dflash_tui.log_pages import Window, page_lines
from dflash_tui.state import Store
from dflash_tui.widgets import safe
from dflash_tui.widgets.panes import VIM_SCROLL

_FIELD = re.compile(r"\b(step|loss|acc|streak|lr|noise|tgt|dft|q_pre|q_hs|epoch|ETA)([=~])")
_TOKS = re.compile(r"\(([\d.]+[KM]?tok/s)\)")
# The trainer's `[479m] ` (minutes since the run started): bracketed, it reads as a leaked
# ANSI code in a terminal (ESC[0m), so it is shown as `+479m`.
_ELAPSED = re.compile(r"^\[(\d{1,9})m\] ")
# wandb's history and summary at a run's end in train.log: `wandb: Run history:`, a
# sparkline or a figure per metric, `+5 ...`, blank `wandb:` lines. Not shown: the log's
# tail is the run's steps and how it ended; its other lines (where the run syncs) stay.
WANDB_NOISE = re.compile(
    r"^wandb:(\s*|\s+Run (history|summary):|\s+\S+ [▁▂▃▄▅▆▇█ ]+|\s+\S+ [-+.\deE]+"
    r"|\s+\+\d+ \.\.\.)$"
)
_STEP = re.compile(r"^\[\d{1,9}m\] step=(\d{1,12}) ")
CLOCK_WIDTH = 9  # "HH:MM:SS "


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


def step_of(raw: str) -> int | None:
    """The step a step line reports; None for any other line."""
    m = _STEP.match(raw)
    return int(m.group(1)) if m else None


def step_time(s: Store, step: int) -> float | None:
    """When the trainer logged `step`: its metrics row's time (the newest rows first: a live
    line's row is among the last). None when no row of that step is held."""
    for row in reversed(s.metrics):
        if row.step == step:
            return row.time or None
        if row.step < step:
            return None
    return None


def clock_cell(t: float | None) -> Text:
    """The column's cell: `HH:MM:SS ` local time, or blank."""
    if t is None:
        return Text(" " * CLOCK_WIDTH)
    return Text(time.strftime("%H:%M:%S ", time.localtime(t)), style="dim cyan")


class StepLog(RichLog):
    MAX_LINES = 2000
    # Arrows (left/right too, unwrapped) come with the scroll view; g and G here page the
    # file itself (its first line, its newest), after j and k from VIM_SCROLL.
    BINDINGS = [
        *(b for b in VIM_SCROLL if isinstance(b, Binding) and b.key in ("j", "k")),
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
        self._regex: re.Pattern[str] | None = None
        self._run_id: str | None = None
        self._total_seen = 0  # the store's log_total this widget has shown up to
        self._store: Store | None = None
        self._drawn_width = 0
        self.reading = False  # scrolled up by the operator: new lines do not pull it down
        self._follows = 0  # the store's fresh follows this widget has shown
        self.window: Window | None = None  # paged back: the lines fetched, else None
        self.clock = False  # the wall-clock column (C)
        self._times: dict[int, float] | None = None  # step -> row time, during a rebuild

    # -- paging back -------------------------------------------------------------------
    def action_log_top(self) -> None:
        """The file's first page, fetched (the store's tail may be too long to show it)."""
        self.reading = True
        if self.window is None and self._tail_start() == 0:  # the store has it from line 1
            self.scroll_home(animate=False)
            return
        self.post_message(self.PageWanted(0, None))

    def action_log_newest(self) -> None:
        self.window = None
        self.following = True
        if self._store is not None:
            self.rebuild(self._store)
        self.scroll_end(animate=False)
        self.reading = False

    def action_page_up(self) -> None:
        """PageUp; at the top of what is shown, the page of the file before it."""
        start = self.window.start if self.window is not None else self._tail_start()
        if self.scroll_y <= 0 and start is not None and start > 0:
            self.post_message(self.PageWanted(None, start))
            return
        super().action_page_up()
        self.reading = True

    def action_page_down(self) -> None:
        """PageDown; at the bottom of a window that does not reach the store's tail yet,
        the page of the file after it."""
        w = self.window
        at_bottom = self.scroll_y >= self.max_scroll_y
        if w is not None and at_bottom and not w.joins(self._tail_start()):
            self.post_message(self.PageWanted(w.end, None))
            return
        super().action_page_down()
        self._still_reading()

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

    def set_filter(self, pattern: str, s: Store) -> None:
        """Raises FilterError (the filter is left as it was)."""
        self._regex = compile_filter(pattern)
        self.pattern = pattern
        self.rebuild(s)

    def _write(self, t: Text, scroll_end: bool, raw: str = "", s: Store | None = None) -> None:
        if self._regex is not None and not self._regex.search(t.plain):
            return
        if WANDB_NOISE.match(t.plain):
            return
        if self.clock:  # after the filter: it reads the line, not the time before it
            t = clock_cell(self._time_of(raw, s)) + t
        # Unwrapped, a line keeps its whole width (scroll left/right to read its end: a
        # traceback's "line 314" must not read "line 31"); wrapped, it folds at the pane.
        self.write(t, shrink=self.wrap, scroll_end=scroll_end)

    def rebuild(self, s: Store) -> None:
        self.clear()
        self.reading = False
        self._store = s
        self._drawn_width = self.scrollable_content_region.width
        if s.follows != self._follows:
            self.window = None  # another run (or this one afresh): its window is not this one
        lines = self.paged_lines(s)
        paged = self.window is not None
        self._times = {r.step: r.time for r in s.metrics if r.time} if self.clock else None
        for ln in lines[: self.MAX_LINES] if paged else lines[-self.MAX_LINES :]:
            self._write(highlight(ln), self.following and not paged, ln, s)
        self._times = None
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
            self._write(highlight(ln), not self.reading, ln, s)

    def _time_of(self, raw: str, s: Store | None) -> float | None:
        """A step line's wall-clock time: from the rows gathered for a rebuild, else the
        store's rows; the newest step line whose row has not come yet (metrics.jsonl and
        train.log are followed apart) takes the time its line arrived."""
        step = step_of(raw)
        if step is None:
            return None
        if s is None:
            return None
        t = self._times.get(step) if self._times is not None else step_time(s, step)
        if t is None and s.step_lines and s.step_lines[-1].step == step:
            t = s.last_step_line_at
        return t

    def toggle_clock(self, s: Store) -> bool:
        self.clock = not self.clock
        self.rebuild(s)
        return self.clock

    # Scrolled up to read (k, PgUp, g, the wheel): new lines come in below and the view
    # stays, until the operator scrolls back to the end (G, End, j or the wheel down there).
    # Set by what the operator did, never by where the view is as lines arrive: a
    # scroll to the end still under way is not a scroll away from it.
    def action_scroll_up(self) -> None:
        super().action_scroll_up()
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

    def on_mouse_scroll_up(self, event: events.MouseScrollUp) -> None:
        self.reading = True

    def on_mouse_scroll_down(self, event: events.MouseScrollDown) -> None:
        self.call_after_refresh(self._still_reading)

    def _still_reading(self) -> None:
        self.reading = self.scroll_target_y < self.max_scroll_y

    def toggle_follow(self, s: Store) -> bool:
        self.following = not self.following
        if self.following:
            self.window = None
            self.rebuild(s)
        return self.following

    def toggle_wrap(self, s: Store) -> bool:
        self.wrap = not self.wrap
        self.rebuild(s)
        return self.wrap

    # Textual's ScrollView compares the size the layout gives it with its own virtual size
    # (its lines), which never match, so every layout anywhere on the screen (a pane's
    # age ticking) redrew both scrollbars unchanged (issue 32). Only a change they show
    # redraws them: the widget's size, its lines' extent, the container's.
    _scrollbars_for: tuple[Size, Size, Size] | None = None

    def _size_updated(
        self, size: Size, virtual_size: Size, container_size: Size, layout: bool = True
    ) -> bool:
        seen = (size, self.virtual_size, container_size)
        if seen == self._scrollbars_for:
            return False
        self._scrollbars_for = seen
        return super()._size_updated(size, virtual_size, container_size, layout)

    def on_resize(self, event: events.Resize) -> None:
        # Wrapped lines were folded at the old width (RichLog's own handler runs too).
        width = self.scrollable_content_region.width
        if self.wrap and self._store is not None and width != self._drawn_width:
            self.rebuild(self._store)
        # A pane that changes height (a note above it comes or goes, the layout gives it
        # rows) keeps the newest line in view unless the operator scrolled away to read.
        if self.following and not self.reading and self.window is None:
            self.call_after_refresh(self.scroll_end, animate=False)

    def title(self) -> Text:
        """The box's title: paused, wrapped, the filter and how many lines it lets through."""
        t = Text("Step log")
        if self.window is not None:  # paged back (log_pages.py): where in the file, and out
            t.append(f"  [train.log from byte {self.window.start:,}: G for the newest]")
        elif not self.following:
            t.append("  [paused: f to follow]", style="yellow")
        if self.wrap:
            t.append("  [wrap]", style="dim")
        if self.clock:
            t.append("  [clock]", style="dim")
        if self.pattern:
            lines = list(self._store.log_lines) if self._store is not None else []
            regex = self._regex
            matched = sum(1 for ln in lines if regex is None or regex.search(shown(ln)))
            t.append("  [filter /")
            t.append(safe.text(self.pattern))  # the operator's own words, shown as typed
            t.append(f"/ · {matched} of {len(lines)} lines]")
        return t

"""The step log paged back past the store's tail: a window of train.log fetched from the
agent by byte range (dflash_tui/control.py `read_page`), so a past run's log can be read from
its first line while neither side ever holds the whole file.

Pure Python (no textual): the window's lines with their byte offsets, how a fetched page joins
it, and what to ask for next. The widget (widgets/steplog.py) shows it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

PAGE_BYTES = 1 << 18  # one page of train.log: a few thousand step lines
MAX_WINDOW_LINES = 2000  # lines kept paged back (the widget's own bound)


def page_lines(text: str, start: int) -> list[tuple[int, str]]:
    """A page's text as (byte offset, line) pairs, the first line at `start`."""
    out = []
    pos = start
    for raw in text.encode("utf-8", "surrogateescape").split(b"\n")[:-1]:
        out.append((pos, raw.decode("utf-8", "replace")))
        pos += len(raw) + 1
    return out


@dataclass
class Window:
    """Contiguous lines of train.log, [start, end) in bytes, oldest first."""

    lines: list[tuple[int, str]] = field(default_factory=list)
    start: int = 0
    end: int = 0

    def prepend(self, text: str, start: int, end: int) -> None:
        """A page that ends where this window starts (paging further back); the newest
        lines give way past MAX_WINDOW_LINES, so the window stays bounded."""
        if self.lines and end != self.start:
            self.lines = []  # not adjacent: the page replaces the window
        if not self.lines:
            self.end = end
        self.lines = page_lines(text, start) + self.lines
        self.start = start
        if len(self.lines) > MAX_WINDOW_LINES:
            self.end = self.lines[MAX_WINDOW_LINES][0]  # where the first line dropped began
            del self.lines[MAX_WINDOW_LINES:]

    def append(self, text: str, start: int, end: int) -> None:
        """A page that starts where this window ends (paging forward); the oldest lines give
        way past MAX_WINDOW_LINES."""
        if self.lines and start != self.end:
            self.lines = []  # not adjacent: the page replaces the window
        if not self.lines:
            self.start = start
        self.lines += page_lines(text, start)
        self.end = end
        if len(self.lines) > MAX_WINDOW_LINES:
            del self.lines[: len(self.lines) - MAX_WINDOW_LINES]
            self.start = self.lines[0][0]

    def joins(self, store_start: int | None) -> bool:
        """The store's kept tail continues this window with no gap between them."""
        return store_start is not None and store_start <= self.end

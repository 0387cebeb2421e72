"""A viewer's search, as in less: `/` opens a line at the bottom, Enter searches (a regular
expression, case-insensitive, as the step log's filter), `n` / `N` go to the next / previous
match (round the ends), Esc closes the line. Every match is marked, the current one more.

`SearchText` is the scrolling text a viewer shows (its lines the host's, made safe by the
caller); `Search` is the viewer's side: the bar, the keys' actions, the line saying where
the current match is. A viewer binds keys.VIEWER and calls `Search`'s methods."""

from __future__ import annotations

import re
from typing import Any

from rich.console import Console
from rich.text import Text
from textual.app import ComposeResult
from textual.screen import Screen
from textual.widgets import Static

from dflash_tui.widgets.filterbar import SearchBar
from dflash_tui.widgets.panes import VimScroll
from dflash_tui.widgets.steplog import FilterError, compile_filter

MATCH = "reverse"
CURRENT = "bold black on yellow"


def find(lines: list[Text], regex: re.Pattern[str]) -> list[tuple[int, int, int]]:
    """Every match as (line, start, end), in reading order; an empty match is skipped."""
    return [
        (i, m.start(), m.end())
        for i, line in enumerate(lines)
        for m in regex.finditer(line.plain)
        if m.end() > m.start()
    ]


class SearchText(VimScroll):
    """Lines of text, scrolled with j k g G and the arrows, whose matches can be marked."""

    DEFAULT_CSS = "SearchText > Static { width: 1fr; }"

    def __init__(self, text: Text, **kw: object) -> None:
        super().__init__(**kw)  # type: ignore[arg-type]
        self.lines = list(text.split("\n", allow_blank=True))
        self.matches: list[tuple[int, int, int]] = []
        self.current = -1
        self._heights: tuple[int, list[int]] | None = None  # (width, rows per line)

    def compose(self) -> ComposeResult:
        yield Static(self._render_lines(), id="body")

    def _render_lines(self) -> Text:
        lines = [line.copy() for line in self.lines]
        for n, (i, start, end) in enumerate(self.matches):
            lines[i].stylize(CURRENT if n == self.current else MATCH, start, end)
        return Text("\n").join(lines)

    def search(self, regex: re.Pattern[str] | None) -> None:
        """Mark `regex`'s matches (None: none) and go to the first one from the top line
        shown on, as less does."""
        self.matches = find(self.lines, regex) if regex is not None else []
        top = self._line_at(round(self.scroll_y))
        after = [n for n, (i, _, _) in enumerate(self.matches) if i >= top]
        self.current = after[0] if after else (0 if self.matches else -1)
        self._show()

    def step(self, by: int) -> None:
        """The next (1) or previous (-1) match, round the ends."""
        if self.matches:
            self.current = (self.current + by) % len(self.matches)
            self._show()

    def _show(self) -> None:
        self.query_one("#body", Static).update(self._render_lines())
        if self.current >= 0:
            row = self._row_of(self.matches[self.current][0])
            self.call_after_refresh(self.scroll_to, y=max(0, row - 2), animate=False)

    # -- where a line is drawn: long lines wrap, so a line's row is counted, not assumed ----
    def _rows(self) -> list[int]:
        width = max(1, self.query_one("#body", Static).size.width or self.size.width or 80)
        if self._heights is None or self._heights[0] != width:
            console = self.app.console if self.is_attached else Console(width=width)
            rows = [max(1, len(line.wrap(console, width))) for line in self.lines]
            self._heights = (width, rows)
        return self._heights[1]

    def _row_of(self, line: int) -> int:
        return sum(self._rows()[:line])

    def _line_at(self, row: int) -> int:
        total = 0
        for i, rows in enumerate(self._rows()):
            total += rows
            if total > row:
                return i
        return len(self.lines)


class Search:
    """A viewer's search: its bar, its text and the line that says where the match is."""

    def __init__(self, screen: Screen[Any], keys_line: str) -> None:
        """`keys_line`: what the viewer's bottom line says while nothing is searched."""
        self.screen = screen
        self.keys_line = keys_line
        self.pattern = ""

    def bar(self) -> SearchBar:
        return SearchBar(self.submit, id="search-bar")

    def status(self) -> Static:
        return Static(Text(self.keys_line, style="dim"), id="keys")

    def _text(self) -> SearchText:
        return self.screen.query_one(SearchText)

    def open(self) -> None:
        self.screen.query_one(SearchBar).open(self.pattern)

    def submit(self, pattern: str) -> bool:
        try:
            regex = compile_filter(pattern)
        except FilterError as e:
            self.screen.query_one(SearchBar).say(str(e))
            return False
        self.pattern = pattern
        self._text().search(regex)
        self._say_where()
        return True

    def step(self, by: int) -> None:
        if not self.pattern:
            self._say(Text("nothing searched yet: / to search", style="yellow"))
            return
        self._text().step(by)
        self._say_where()

    def _say_where(self) -> None:
        text = self._text()
        if not self.pattern:
            self._say(Text(self.keys_line, style="dim"))
        elif not text.matches:
            self._say(Text(f"/{self.pattern}: no match", style="yellow"))
        else:
            line = text.matches[text.current][0] + 1
            where = f"match {text.current + 1} of {len(text.matches)}, line {line}"
            self._say(Text(f"/{self.pattern}: {where} · n / N next / previous", style="bold"))

    def _say(self, text: Text) -> None:
        self.screen.query_one("#keys", Static).update(text)


class SearchKeys:
    """A viewer's keys over its `Search` (keys.VIEWER): `/` opens the search, `n`/`N` step
    through the matches, `q`/Esc closes. Mixed into the viewer screens, before Screen."""

    search: Search

    def action_search(self) -> None:
        self.search.open()

    def action_next_match(self) -> None:
        self.search.step(1)

    def action_previous_match(self) -> None:
        self.search.step(-1)

    def action_close(self) -> None:
        screen: Any = self
        screen.dismiss()

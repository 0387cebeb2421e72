"""Stage bars: one per pipeline thread, its loop split by stage in loop order.

    drafter-0 cuda:0 ██████████░░░░░░ 266 ms  wait q_hs 58% · forward 21% · backward 19%

Work stages are solid, each in its own colour; waits are hatched and dim (`░` a queue or
the replicas' barrier, `▒` a GPU stream waiting for Python). The bar is the loop's period
(the medians' sum); the text names the largest stages with their share. The busiest thread
(the one the others wait for) is in bold. Fitted to the pane's width: the device, the
legend and the smaller stages go first, then the bar shrinks.
"""

from __future__ import annotations

from rich.text import Text
from textual import events
from textual.widget import Widget
from textual.widgets import Static

from dflash_tui.stages import ThreadStages, busiest, by_role, ms_text, of_heartbeat
from dflash_tui.state import Store
from dflash_tui.widgets import quiet, safe
from trainer.contract.heartbeat import (
    STAGE_BACKWARD,
    STAGE_BUILD,
    STAGE_CHECKPOINT,
    STAGE_FORWARD,
    STAGE_HOST,
    STAGE_MASK,
    STAGE_OPTIMIZER,
    STAGE_TRANSFER,
)

COLOURS = {
    STAGE_BUILD: "green",
    STAGE_FORWARD: "cyan",
    STAGE_TRANSFER: "bright_blue",
    STAGE_MASK: "yellow",
    STAGE_BACKWARD: "magenta",
    STAGE_OPTIMIZER: "bright_red",
    STAGE_CHECKPOINT: "white",
}
OTHER_COLOURS = ("bright_cyan", "bright_magenta", "bright_yellow", "bright_green")
WAIT, HOST = "░", "▒"
NAME_MAX = 14  # a longer thread name is cut (the host chooses them)
DEVICE_MAX = 8
PERIOD_W = 7  # "0.03 ms"
DEFAULT_WIDTH = 60  # before the first layout


def colour(stage: str) -> str:
    if stage in COLOURS:
        return COLOURS[stage]
    return OTHER_COLOURS[sum(map(ord, stage)) % len(OTHER_COLOURS)]  # stable per name


def fitted(value: str, width: int, style: str = "", pad: bool = False) -> Text:
    """A string from the host as Text, cut to `width` cells with an ellipsis."""
    t = safe.text(value)
    t.truncate(max(0, width), overflow="ellipsis", pad=pad)
    t.stylize(style)  # a span, not the base style: a row goes on after it
    return t


def cells(row: ThreadStages, width: int) -> list[int]:
    """Each stage's cells of a `width`-cell bar, by largest remainder (they add up)."""
    period = row.period_ms
    exact = [st.ms / period * width for st in row.stages]
    got = [int(x) for x in exact]
    by_remainder = sorted(range(len(exact)), key=lambda i: got[i] - exact[i])
    for i in by_remainder[: width - sum(got)]:
        got[i] += 1
    return got


def bar(row: ThreadStages, width: int) -> Text:
    out = Text()
    for st, n in zip(row.stages, cells(row, width), strict=True):
        if n:
            if st.wait:
                out.append((HOST if st.name == STAGE_HOST else WAIT) * n, style="dim")
            else:
                out.append("█" * n, style=colour(st.name))
    return out


def shares(row: ThreadStages, room: int) -> Text:
    """The largest stages with their share, as many as fit in `room` cells (the largest
    cut to fit rather than left out)."""
    out = Text()
    for st in row.by_size():
        if st.ms / row.period_ms < 0.005 and out.plain:
            break  # "0%" says nothing
        part = safe.text(f"{st.name} {st.ms / row.period_ms:.0%}")
        sep = " · " if out.plain else ""
        if out.cell_len + len(sep) + part.cell_len > room:
            if not out.plain and room >= 8:
                part.truncate(room, overflow="ellipsis")
                out.append_text(part)
            break
        out.append(sep)
        out.append_text(part)
    return out


def layout(rows: list[ThreadStages], width: int) -> tuple[int, int, int]:
    """(name, device, bar) widths for a pane `width` columns wide; 0 leaves it out."""
    name_w = min(NAME_MAX, max(safe.text(r.name).cell_len for r in rows))
    dev_w = min(DEVICE_MAX, max(safe.text(r.device).cell_len for r in rows))
    if width < 64:
        dev_w = 0
    fixed = name_w + 1 + (dev_w + 1 if dev_w else 0) + PERIOD_W + 2
    # The bar gives way to each row's largest stage and its share, down to 4 cells; below
    # that the bar takes what is left after the name and the period.
    top = max(safe.text(f"{r.top().name} 100%").cell_len for r in rows)
    bar_w = min(24 if width >= 100 else 16 if width >= 72 else 10, width - fixed - 3 - top)
    if bar_w < 4:
        bar_w = width - fixed - 1
    return name_w, dev_w, bar_w if bar_w >= 4 else 0


def row_text(row: ThreadStages, widths: tuple[int, int, int], width: int, bold: bool) -> Text:
    name_w, dev_w, bar_w = widths
    t = fitted(row.name, name_w, "bold" if bold else "", pad=True)
    if dev_w:
        t.append(" ")
        t.append_text(fitted(row.device, dev_w, "dim", pad=True))
    if bar_w:
        t.append(" ")
        t.append_text(bar(row, bar_w))
    t.append(" " + ms_text(row.period_ms).rjust(PERIOD_W))
    room = width - t.cell_len - 2
    if room < 8:
        return t
    t.append("  ")
    if row.stale():
        # Medians change when a loop ends: one that has not ended for long says so.
        note = f"'{row.state}' for {row.in_state_s:.0f}s now"
        t.append_text(fitted(note, room, "yellow"))
    else:
        t.append_text(shares(row, room))
    return t


def legend(rows: list[ThreadStages], width: int) -> Text | None:
    """The work stages present, each in its colour, then the waits' hatching."""
    seen: dict[str, None] = {}
    for r in rows:
        for st in r.stages:
            if not st.wait:
                seen.setdefault(st.name, None)
    host = any(st.name == STAGE_HOST for r in rows for st in r.stages)
    t = Text(f"{WAIT} wait  " + (f"{HOST} host  " if host else ""), style="dim")
    for name in seen:
        label = safe.text(f" {name}  ", "dim")
        if t.cell_len + 1 + label.cell_len > width + 2:  # (the last one's spaces go)
            break
        t.append("█", style=colour(name))
        t.append_text(label)
    t.rstrip()
    return t if t.plain else None


def render_rows(rows: list[ThreadStages], width: int, with_legend: bool = True) -> Text:
    widths = layout(rows, width)
    top = busiest(rows)
    out = Text("\n").join(row_text(r, widths, width, r is top) for r in rows)
    key = legend(rows, width) if width >= 44 and with_legend else None
    if key is not None:
        out.append("\n")
        out.append_text(key)
    return out


class StagePane(Static):
    DEFAULT_CSS = """
    StagePane { height: auto; padding: 0 1; }
    """

    def __init__(self, *args: object, **kw: object) -> None:
        super().__init__(*args, **kw)  # type: ignore[arg-type]
        self._rows: list[ThreadStages] = []
        self._note: Text = Text("no heartbeat yet", style="dim")
        self._drawn_width = -1
        self._drawn: tuple[object, ...] | None = None
        self._drawn_height = -1

    def update_from(self, s: Store) -> None:
        hb = s.heartbeat
        self._rows = of_heartbeat(hb)
        if hb is None:
            self._note = Text("no heartbeat yet", style="dim")
        elif hb.step == 0:
            self._note = Text("stage times from the first step", style="dim")
        else:  # a trainer from before stage timing
            self._note = Text("no stage times in this trainer's heartbeat", style="dim")
        self._draw()

    def _draw(self) -> None:
        width = self.size.width or DEFAULT_WIDTH
        self._drawn_width = width
        lines = self._line_budget()
        key = (tuple(self._rows), self._note.plain, width, lines)
        if key == self._drawn:
            return  # the same picture: no refresh, no layout (the app redraws every 0.25 s)
        self._drawn = key
        if not self._rows:
            content = self._note
        else:
            rows = self._rows
            if lines is not None and len(rows) > lines:
                rows = by_role(rows)  # too short for a row per thread: a row per role
                if len(rows) > lines:  # or for that: the thread the others wait for
                    top = busiest(self._rows)
                    rows = [top] if top is not None else rows[:lines]
            content = render_rows(rows, width, lines is None or len(rows) < lines)
        height = content.plain.count("\n") + 1
        quiet.update(self, content, layout=height != self._drawn_height)  # layout: a new height
        self._drawn_height = height

    def _line_budget(self) -> int | None:
        """The lines this pane may fill: its box's max-height (app.tcss, a share of the
        column it is in) less the box's border and title; None without one."""
        box = self.parent
        column = box.parent if isinstance(box, Widget) else None
        if not isinstance(box, Widget) or not isinstance(column, Widget):
            return None
        limit = box.styles.max_height
        if limit is None or not column.size.height:
            return None
        outer = limit.resolve(column.size, self.app.size)
        others = sum(c.outer_size.height for c in box.children if c is not self)
        return max(1, int(outer) - box.styles.gutter.height - others)

    def on_resize(self, event: events.Resize) -> None:
        if event.size.width != self._drawn_width:  # a new height alone changes nothing
            self._draw()

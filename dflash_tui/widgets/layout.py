"""Which panes a terminal of a given size shows, by priority, and `z`'s zoom.

What an operator must never lose, at 80x24 too: the header (phase, step, tok/s), the
alerts, the queues, the GPUs and the step log. Then, as rows allow: the heartbeat (and a
processes-mode job's ranks), the stage bars, and last the plots (history the alerts
already summarise). Below TOP_MIN_HEIGHT rows the GPUs are one line across the screen
(widgets/gpus.py's compact form) instead of a row per device. Below 100 columns the queues
and alerts sit side by side above the step log rather than in a thin column beside it,
where neither the queue bars nor an alert's evidence fit.

A pane left out is never silently gone: the step log's bottom border names each one and
the rows it needs (`hidden_note`). The headless mode and --json carry everything.

Zoom (`z`, Textual's maximize) gives the zoomed box the whole screen: the sizes this plan
sets inline (the plots' rows, the top row's most) would otherwise keep it small, the rest
hatched."""

from __future__ import annotations

from dataclasses import dataclass

from textual.widget import Widget

from dflash_tui.widgets.gpus import GpuPane

NARROW_BELOW = 100  # columns: the side column moves above the step log
MIN_WIDTH, MIN_HEIGHT = 80, 24  # below this the dashboard is one line saying so (app.py)
TOP_MIN_HEIGHT = 30  # rows: the heartbeat, and the GPUs a row per device (else compact)
RANKS_MIN_HEIGHT = 30  # rows: a processes-mode job's ranks (none in threads mode)
STAGES_MIN_HEIGHT = 36  # rows: the stage bars
PLOTS_MIN_HEIGHT = 44  # rows: the plots
PLOTS_ROWS = 13  # the plots' height at PLOTS_MIN_HEIGHT; they grow by a row per 3 beyond 48
COMPACT_GPU_ROWS = 4  # the compact GPUs' box: its border, its title and one line


@dataclass(frozen=True)
class Plan:
    narrow: bool
    heartbeat: bool
    gpus_compact: bool
    ranks: bool
    stages: bool
    plots: bool
    plots_rows: int
    top_rows: int  # the GPUs and heartbeat row's most

    def hidden(self, ranks_run: bool = False) -> list[tuple[str, int]]:
        """(pane, rows it needs) for each pane this plan leaves out; the ranks only for a
        processes-mode job (`ranks_run`), the only kind that has them."""
        out = []
        if not self.heartbeat:
            out.append(("Heartbeat", TOP_MIN_HEIGHT))
        if ranks_run and not self.ranks:
            out.append(("Ranks", RANKS_MIN_HEIGHT))
        if not self.stages:
            out.append(("Stages", STAGES_MIN_HEIGHT))
        if not self.plots:
            out.append(("Plots", PLOTS_MIN_HEIGHT))
        return out


def plan(width: int, height: int) -> Plan:
    return Plan(
        narrow=width < NARROW_BELOW,
        heartbeat=height >= TOP_MIN_HEIGHT,
        gpus_compact=height < TOP_MIN_HEIGHT,
        ranks=height >= RANKS_MIN_HEIGHT,
        stages=height >= STAGES_MIN_HEIGHT,
        plots=height >= PLOTS_MIN_HEIGHT,
        plots_rows=PLOTS_ROWS + max(0, height - 48) // 3,
        top_rows=COMPACT_GPU_ROWS if height < TOP_MIN_HEIGHT else 12 if height < 40 else 16,
    )


def too_small(width: int, height: int) -> str | None:
    """The one line a terminal below the minimum shows instead of the dashboard."""
    if width >= MIN_WIDTH and height >= MIN_HEIGHT:
        return None
    line = f"dflash-tui needs at least {MIN_WIDTH}x{MIN_HEIGHT}: this terminal is {width}x{height}"
    return line if len(line) <= width else f"needs {MIN_WIDTH}x{MIN_HEIGHT}, is {width}x{height}"


def hidden_note(hidden: list[tuple[str, int]]) -> str:
    """`hidden: Heartbeat (30 rows) · Plots (44 rows)`, or '' when every pane is shown."""
    if not hidden:
        return ""
    return "hidden: " + " · ".join(f"{name} ({rows}+ rows)" for name, rows in hidden)


def apply(screen: Widget, p: Plan) -> None:
    """Show and size the dashboard's boxes as `p` says (the dashboard's ids, app.py), the
    zoomed box (if any) at the whole screen's size."""
    zoomed = getattr(screen, "maximized", None)
    screen.set_class(p.narrow, "narrow")
    top = screen.query_one("#top")
    screen.query_one("#hb-box").display = p.heartbeat
    for box in top.children:  # each scrolls within it (a Pane), its border kept
        box.styles.max_height = p.top_rows
    gpus, gpus_box = screen.query_one(GpuPane), screen.query_one("#gpus-box")
    gpus.compact = p.gpus_compact and zoomed is not gpus_box
    # Compact, its title goes in the border: a row more for the step log.
    gpus_box.query_one(".box-title").display = not gpus.compact
    gpus_box.border_title = "GPUs" if gpus.compact else None
    ranks = screen.query_one("#ranks-box")
    ranks.set_class(not p.ranks, "-no-room")
    screen.query_one("#stages-box").display = p.stages
    plots = screen.query_one("#plots-box")
    plots.display = p.plots
    plots.styles.height = p.plots_rows
    for box in screen.query(".box"):
        if box is zoomed:
            box.styles.height = "1fr"
            box.styles.max_height = "100%"
            box.styles.width = "100%"
        elif box.styles.inline.has_rule("width"):  # was zoomed: back to the stylesheet's
            box.styles.width = None
            if box is not plots:
                box.styles.height = None
            if box.parent is not top:
                box.styles.max_height = None
    log_box = screen.query_one("#log-box")
    log_box.border_subtitle = hidden_note(p.hidden(ranks_run=not ranks.has_class("-no-ranks")))

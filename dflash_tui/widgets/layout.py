"""Which panes a terminal of a given size shows, by priority.

What an operator must never lose, at 80x24 too: the header (phase, step, tok/s), the
alerts, the queues and the step log. Then, as rows allow: the GPUs and heartbeat (and a
processes-mode job's ranks), the stage bars, and last the plots (history the alerts
already summarise). Below 100 columns the queues and alerts sit side by side above the
step log rather than in a thin column beside it, where neither the queue bars nor an
alert's evidence fit.

A hidden pane's figures stay in the alerts' evidence, `z` shows any pane that is on screen
whole, and the headless mode and --json carry everything."""

from __future__ import annotations

from dataclasses import dataclass

from textual.widget import Widget

NARROW_BELOW = 100  # columns: the side column moves above the step log
TOP_MIN_HEIGHT = 30  # rows: the GPUs and the heartbeat
RANKS_MIN_HEIGHT = 30  # rows: a processes-mode job's ranks (none in threads mode)
STAGES_MIN_HEIGHT = 36  # rows: the stage bars
PLOTS_MIN_HEIGHT = 44  # rows: the plots
PLOTS_ROWS = 13  # the plots' height at PLOTS_MIN_HEIGHT; they grow by a row per 3 beyond 48


@dataclass(frozen=True)
class Plan:
    narrow: bool
    top: bool
    ranks: bool
    stages: bool
    plots: bool
    plots_rows: int
    top_rows: int  # the GPUs and heartbeat row's most


def plan(width: int, height: int) -> Plan:
    return Plan(
        narrow=width < NARROW_BELOW,
        top=height >= TOP_MIN_HEIGHT,
        ranks=height >= RANKS_MIN_HEIGHT,
        stages=height >= STAGES_MIN_HEIGHT,
        plots=height >= PLOTS_MIN_HEIGHT,
        plots_rows=PLOTS_ROWS + max(0, height - 48) // 3,
        top_rows=12 if height < 40 else 16,
    )


def apply(screen: Widget, p: Plan) -> None:
    """Show and size the dashboard's boxes as `p` says (the dashboard's ids, app.py)."""
    screen.set_class(p.narrow, "narrow")
    top = screen.query_one("#top")
    top.display = p.top
    for box in top.children:  # each scrolls within it (a Pane), its border kept
        box.styles.max_height = p.top_rows
    screen.query_one("#ranks-box").set_class(not p.ranks, "-no-room")
    screen.query_one("#stages-box").display = p.stages
    plots = screen.query_one("#plots-box")
    plots.display = p.plots
    plots.styles.height = p.plots_rows

"""Plots (textual-plotext): tok/s, loss, acc and streak per step, each on its own axes, the
held-out τ of the run's evals beside the streak; GPU memory over the last samples. Every line
takes its colour from the theme (widgets/palette.py); a panel without data says why instead
of drawing an empty box.

With the plots focused (dflash_tui/plot_view.py decides what they show): + and - smooth the
step plots (an EMA), x switches the x-axis between step and time, ← → move a cursor over the
rows (a line above the plots says their values there; → past the newest follows it again).

Drawing a plot is the costliest thing on screen, so a panel is redrawn only when what it
shows changed (new rows, new samples, a theme or scale change), never on a timer, and new
points at most once a second.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from textual import events
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.widget import Widget
from textual.widgets import Static
from textual_plotext import PlotextPlot

from dflash_tui import plot_data, plot_view
from dflash_tui.fmt import PLAUSIBLE_MAX
from dflash_tui.state import Store
from dflash_tui.widgets import palette, safe
from trainer.contract.records import MetricsRow
from trainer.contract.steplines import StepLine

GPU_POINTS = 600  # samples per GPU drawn: ten minutes at the agent's 1 Hz
DRAW_EVERY_S = 1.0  # new points wait this long after a panel's last draw (a plot's render
# was a quarter of the TUI's CPU at 10 steps a second, redrawn at every 0.25 s redraw)


def _finite(v: object) -> bool:
    """A value a plot can take: finite and plausible. plotext's tick labels turn a range of
    1e308 into NaN and raise, which took the whole TUI down with one hostile metrics row."""
    return isinstance(v, int | float) and math.isfinite(v) and abs(v) <= PLAUSIBLE_MAX


def _thousands(title: str, y: list[float | None]) -> tuple[str, list[float | None]]:
    """`K tok/s` in thousands once the values reach them: `15.6` is a tick label that fits
    a narrow panel where `15600.0` takes a third of it."""
    if max((v for v in y if v is not None and _finite(v)), default=0.0) < 1000:
        return title, y
    return f"K {title}", [None if v is None else v / 1000 for v in y]


Line = tuple[str, int, tuple[float, ...], tuple[float, ...]]  # label, colour, x, y


@dataclass(frozen=True)
class Figure:
    """What one panel shows: its lines (label, theme colour index, x values, y values) and
    where the cursor is on x, or, with no data, `why`."""

    title: str
    xlabel: str
    lines: tuple[Line, ...] = ()
    ylim: tuple[float, float] | None = None
    log: bool = False
    why: str = ""
    theme: str = field(default="", compare=True)
    cursor: float | None = None

    @property
    def has_data(self) -> bool:
        return any(x and y for _, _, x, y in self.lines)

    def same_axes(self, other: Figure) -> bool:
        """Only the points differ: the same title, axes, scale, theme and cursor, data in
        both (a key that changes any of these draws at once)."""
        return (
            self.has_data
            and other.has_data
            and (self.title, self.xlabel, self.log, self.theme, self.cursor)
            == (other.title, other.xlabel, other.log, other.theme, other.cursor)
        )


class PlotPanel(Vertical):
    """One plot, and in its place while it has no data the line that says why."""

    DEFAULT_CSS = """
    PlotPanel { width: 1fr; height: 1fr; }
    PlotPanel > .plot-empty { height: 1fr; padding: 0 1; color: $foreground; }
    """

    def __init__(self, id: str) -> None:
        super().__init__(id=id)
        self._shown: Figure | None = None
        self._drawn_at = -DRAW_EVERY_S
        self._waiting: Figure | None = None  # new points held back until DRAW_EVERY_S

    def compose(self) -> ComposeResult:
        yield PlotextPlot()
        yield Static(classes="plot-empty")

    @property
    def figure(self) -> Figure | None:
        """What the panel draws now (new points held back until DRAW_EVERY_S not yet)."""
        return self._shown

    def show(self, fig: Figure) -> bool:
        """Draw `fig` unless it is what is on screen already; True when it drew. New points
        on the lines shown wait until DRAW_EVERY_S after the last draw (one draw for all
        that came meanwhile); anything else (data at last, a theme, a scale) draws now."""
        if fig == self._shown:
            self._waiting = None
            return False
        wait = self._drawn_at + DRAW_EVERY_S - time.monotonic()
        if wait > 0 and self._shown is not None and fig.same_axes(self._shown):
            if self._waiting is None:
                self.set_timer(wait, self._draw_waiting)
            self._waiting = fig
            return False
        self._draw(fig)
        return True

    def _draw_waiting(self) -> None:
        fig, self._waiting = self._waiting, None
        if fig is not None and fig != self._shown:
            self._draw(fig)

    def _draw(self, fig: Figure) -> None:
        self._shown = fig
        self._drawn_at = time.monotonic()
        plot = self.query_one(PlotextPlot)
        empty = self.query_one(".plot-empty", Static)
        plot.display = fig.has_data
        empty.display = not fig.has_data
        if not fig.has_data:
            message = safe.text(fig.title, "bold")
            message.append("\n")
            message.append(safe.text(fig.why))  # may quote the host (the agent's GPU error)
            empty.update(message)
            return
        plt = plot.plt
        plt.clear_data()
        plt.clear_figure()
        plt.title(fig.title)
        plt.xlabel(fig.xlabel)
        plt.yscale("log" if fig.log else "linear")
        for label, colour, x, y in fig.lines:
            if x and len(y) == len(x):
                plt.plot(
                    list(x),
                    list(y),
                    label=label if len(fig.lines) > 1 else None,
                    marker="braille",
                    color=palette.series_rgb(self.app, colour),
                )
        if fig.ylim is not None:
            plt.ylim(*fig.ylim)
        if fig.cursor is not None:
            plt.vline(fig.cursor, palette.rgb(self.app, "foreground"))
        plot.refresh()


class Plots(Widget, can_focus=True):
    """The plots row. While it has focus: `L` (or a click on the loss plot) switches the loss
    axis between linear and log, + and - the smoothing, x the x-axis (step or time), ← →
    a cursor over the rows, whose values the line above the plots says."""

    BINDINGS = [
        Binding("L", "toggle_log_loss", "loss log/linear"),
        Binding("plus,equals_sign", "smooth(True)", "smooth more", show=False),
        Binding("minus", "smooth(False)", "smooth less", show=False),
        Binding("x", "toggle_axis", "x: step/time", show=False),
        Binding("left", "cursor(-1)", "cursor back", show=False),
        Binding("right", "cursor(1)", "cursor on", show=False),
        Binding("home", "cursor_first", "first row", show=False),
    ]
    DEFAULT_CSS = """
    Plots { height: 1fr; }
    Plots Horizontal { height: 1fr; }
    Plots #plot-readout { height: 1; padding: 0 1; display: none; color: $foreground; }
    Plots #plot-readout.-shown { display: block; }
    """

    def __init__(self, id: str | None = None, log_loss: bool = False) -> None:
        super().__init__(id=id)
        self.log_loss = log_loss
        self.smoothing = 0.0  # plot_view.SMOOTHING
        self.axis = plot_view.STEP
        self.cursor: int | None = None  # the step under the cursor; None: none
        self._readout = ""  # the line above the plots, as drawn
        self._smooth = plot_view.Smoother()  # each series smoothed on from the last redraw
        self._store: Store | None = None
        self.drawn = 0  # panels drawn at once since start (tests count them)

    def compose(self) -> ComposeResult:
        yield Static(id="plot-readout")
        with Horizontal():
            for name in ("toks", "loss", "acc", "streak", "mem"):
                yield PlotPanel(id=f"plot-{name}")

    def _again(self) -> None:
        if self._store is not None:
            self.update_from(self._store)

    def action_toggle_log_loss(self) -> None:
        self.log_loss = not self.log_loss
        self._again()

    def action_smooth(self, up: bool) -> None:
        self.smoothing = plot_view.next_smoothing(self.smoothing, up)
        self._again()

    def action_toggle_axis(self) -> None:
        self.axis = plot_view.TIME if self.axis == plot_view.STEP else plot_view.STEP
        self._again()

    def action_cursor(self, by: int) -> None:
        self.cursor = plot_view.move_cursor(self._rows(), self.cursor, by)
        self._again()

    def action_cursor_first(self) -> None:
        rows = self._rows()
        self.cursor = rows[0].step if rows else None
        self._again()

    def on_click(self, event: events.Click) -> None:
        loss = self.query_one("#plot-loss", PlotPanel)
        if event.widget is not None and (event.widget is loss or loss in event.widget.ancestors):
            self.action_toggle_log_loss()

    def _rows(self) -> Sequence[MetricsRow | StepLine]:
        s = self._store
        if s is None:
            return []
        rows: Sequence[MetricsRow | StepLine] = list(s.metrics)
        if not rows and s.step_lines:  # a trainer without metrics.jsonl: use the step lines
            rows = list(s.step_lines)
        return rows

    def update_from(self, s: Store) -> None:
        self._store = s
        theme = self.app.theme
        rows = self._rows()
        axis, smoothing = self.axis, self.smoothing
        xs = tuple(plot_view.x_of(r, axis) for r in rows)
        why = "" if rows else plot_data.why_no_metrics(s)
        row = plot_view.cursor_row(rows, self.cursor)
        cursor = None if row is None else plot_view.x_of(row, axis)
        cursor = cursor if _finite(cursor) else None
        xlabel = plot_view.xlabel(axis)

        def points(
            name: str, y: Sequence[float | None]
        ) -> tuple[tuple[float, ...], tuple[float, ...]]:
            # Only the rows that carry the value: a None (an older trainer's row) or a NaN
            # would break the line, and NaN != NaN would redraw the panel at every update.
            pts = [
                (x, float(v))
                for x, v in zip(xs, y, strict=True)
                if v is not None and _finite(v) and _finite(x)
            ]
            ys = self._smooth(name, [v for _, v in pts], smoothing)
            return tuple(x for x, _ in pts), tuple(ys)

        def per_step(
            title: str, y: Sequence[float | None], colour: int, *extra: Line, **kw: object
        ) -> Figure:
            x, ys = points(title, y)
            label = title.split(" · ", maxsplit=1)[0]  # the legend's: "streak" beside "τ"
            return Figure(
                title + (f" · ema {smoothing:g}" if smoothing else ""),
                xlabel,
                ((label, colour, x, ys), *extra),
                why=why,
                theme=theme,
                cursor=cursor,
                **kw,  # type: ignore[arg-type]
            )

        losses = [r.loss for r in rows]
        finite_losses = [v for v in losses if v is not None and _finite(v)]
        log = self.log_loss
        evals = plot_view.held_out(rows)
        tau: tuple[Line, ...] = ()
        if evals:  # beside the training streak: the same drafter on prompts it never saw
            tau_x = tuple(e.minutes if axis == plot_view.TIME else float(e.step) for e in evals)
            tau = (("τ", 4, tau_x, tuple(e.tau for e in evals)),)
        figures = {
            "toks": per_step(*_thousands("tok/s", [r.tok_s for r in rows]), colour=0),
            "loss": per_step(
                "loss (log)" if log else "loss",
                [v if not log or (v is not None and v > 0) else None for v in losses],
                1,
                ylim=plot_data.recent_range(
                    self._smooth("loss window", finite_losses, smoothing) if smoothing else losses,
                    log=log,
                ),
                log=log,
            ),
            "acc": per_step("acc", [r.acc for r in rows], 2),
            "streak": per_step(
                "streak · τ" if tau else "streak", [r.streak for r in rows], 3, *tau
            ),
            "mem": self._memory(s, theme),
        }
        for name, fig in figures.items():
            if self.query_one(f"#plot-{name}", PlotPanel).show(fig):
                self.drawn += 1
        text = plot_view.readout(rows, self.cursor, smoothing, axis, evals)
        if text != self._readout:  # drawn on a change only: an idle screen repaints nothing
            self._readout = text
            readout = self.query_one("#plot-readout", Static)
            readout.set_class(bool(text), "-shown")
            readout.update(safe.text(text))

    def _memory(self, s: Store, theme: str) -> Figure:
        """GB used per GPU against seconds before the newest sample (not before now: the
        plot changes only when a sample comes)."""
        hists = {i: list(h)[-GPU_POINTS:] for i, h in sorted(s.gpu_history.items()) if h}
        if not hists:
            return Figure(
                "GPU mem GB", "s, 0 = latest", why=plot_data.why_no_gpu_samples(s), theme=theme
            )
        newest = max(pts[-1].t for pts in hists.values())
        # One x for all: every GPU is sampled together, so their histories line up.
        first = next(iter(hists.values()))
        x = tuple(p.t - newest for p in first)
        lines = tuple(
            (f"gpu{i}", n, x, tuple(p.mem_used / (1 << 30) for p in pts))
            for n, (i, pts) in enumerate(hists.items())
            if len(pts) == len(first)
        )
        return Figure("GPU mem GB", "s, 0 = latest", lines, theme=theme)

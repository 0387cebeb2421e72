"""Plots (textual-plotext): tok/s, loss, acc and streak per step; GPU memory over time."""

from __future__ import annotations

from collections.abc import Sequence

from textual.app import ComposeResult
from textual.containers import Horizontal
from textual.widget import Widget
from textual_plotext import PlotextPlot

from dflash_tui.state import Store
from trainer.contract.records import MetricsRow
from trainer.contract.steplines import StepLine


class Plots(Widget):
    DEFAULT_CSS = """
    Plots { height: 1fr; }
    Plots Horizontal { height: 1fr; }
    Plots PlotextPlot { width: 1fr; height: 1fr; }
    """

    def compose(self) -> ComposeResult:
        with Horizontal():
            yield PlotextPlot(id="plot-toks")
            yield PlotextPlot(id="plot-loss")
            yield PlotextPlot(id="plot-acc")
            yield PlotextPlot(id="plot-mem")

    def update_from(self, s: Store) -> None:
        rows: Sequence[MetricsRow | StepLine] = list(s.metrics)
        if not rows and s.step_lines:  # a trainer without metrics.jsonl: use the step lines
            rows = list(s.step_lines)
        steps = [r.step for r in rows]
        self._line("plot-toks", "tok/s", steps, {"tok/s": [r.tok_s for r in rows]})
        self._line("plot-loss", "loss", steps, {"loss": [r.loss for r in rows]})
        self._line(
            "plot-acc",
            "acc · streak",
            steps,
            {"acc": [r.acc for r in rows], "streak": [r.streak for r in rows]},
        )
        now = s.clock()
        series = {}
        x: list[float] = []
        for index, hist in sorted(s.gpu_history.items()):
            pts = list(hist)[-600:]
            x = [p.t - now for p in pts]
            series[f"gpu{index}"] = [p.mem_used / (1 << 30) for p in pts]
        self._line("plot-mem", "GPU mem GB (s ago)", x, series)

    def _line(self, wid: str, title: str, x: list, series: dict[str, list]) -> None:
        plot = self.query_one(f"#{wid}", PlotextPlot)
        plt = plot.plt
        plt.clear_data()
        plt.title(title)
        for label, y in series.items():
            if x and y and len(x) == len(y):
                plt.plot(x, y, label=label if len(series) > 1 else None, marker="braille")
        plot.refresh()

"""The compare screen: two or more runs' loss, acc, streak and tok/s curves overlaid, keyed
by run, and what differs between their configs and environments (dflash_tui/compare.py)."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.containers import Horizontal
from textual.screen import Screen
from textual.widgets import Static
from textual_plotext import PlotextPlot

from dflash_tui import compare
from dflash_tui.widgets import keys, safe
from dflash_tui.widgets.footer import Footer
from dflash_tui.widgets.search import Search, SearchKeys, SearchText

# One colour per run, the same in every plot and in the key.
RUN_COLOURS = ("cyan", "magenta", "green", "orange", "red", "blue", "yellow", "white")
CURVES = (("loss", "loss"), ("acc", "acc"), ("streak", "streak"), ("tok_s", "tok/s"))


class CompareScreen(SearchKeys, Screen[None]):
    """A viewer (widgets/keys.py): `/` searches the differences, n / N, q or Esc back."""

    BINDINGS = keys.VIEWER
    DEFAULT_CSS = """
    CompareScreen #title { background: $panel; padding: 0 1; text-style: bold; }
    CompareScreen #key { padding: 0 1; height: auto; }
    CompareScreen Horizontal { height: 2fr; }
    CompareScreen PlotextPlot { width: 1fr; height: 1fr; }
    CompareScreen SearchText { height: 1fr; padding: 0 1; }
    CompareScreen #keys { background: $panel; padding: 0 1; height: 1; }
    """

    def __init__(self, runs: list[compare.RunData]) -> None:
        super().__init__()
        self.runs = runs
        self.search = Search(self, "/ search the differences, n/N · j/k scroll · esc/q back")

    def compose(self) -> ComposeResult:
        yield Static(safe.text(f"Compare {len(self.runs)} runs — esc: back"), id="title")
        key = safe.text("")
        for i, r in enumerate(self.runs):
            key.append_text(safe.text(f"■ {r.info.run_id}   ", RUN_COLOURS[i % len(RUN_COLOURS)]))
        yield Static(key, id="key")
        with Horizontal():
            for field, _ in CURVES:
                yield PlotextPlot(id=f"cmp-{field}")
        yield SearchText(safe.log_text("\n".join(compare.describe(self.runs))), id="differences")
        yield self.search.status()
        yield self.search.bar()
        yield Footer()

    def on_mount(self) -> None:
        for field, title in CURVES:
            plot = self.query_one(f"#cmp-{field}", PlotextPlot)
            plt = plot.plt
            plt.clear_data()
            plt.title(title)
            plt.xlabel("step")
            for i, r in enumerate(self.runs):
                steps = [m.step for m in r.metrics]
                ys = [float(getattr(m, field)) for m in r.metrics]
                if steps:
                    plt.plot(
                        steps,
                        ys,
                        # the legend once (the first plot); the key line above says it too
                        label=r.info.run_id if field == CURVES[0][0] else None,
                        color=RUN_COLOURS[i % len(RUN_COLOURS)],
                        marker="braille",
                    )
            plot.refresh()

"""The replay screen: a run's telemetry scrubbed with the live view's own panes.

It composes the app's layout (`app.compose()`: the same panes, the same ids and CSS) under
a REPLAY bar, and draws them from `Recording.store_at(i)` (dflash_tui/replay.py): a store
as it was at telemetry entry i, its clock pinned there, so the alerts are the diagnosis
rules evaluated at that moment. The live store goes on being fed underneath; escape
returns to it. Control keys (kill, restart, stacks, clear cache) are refused here: a replay
shows the past and sends nothing.
"""

from __future__ import annotations

from typing import Any

from rich.text import Text
from textual import work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.css.query import NoMatches
from textual.screen import Screen
from textual.widgets import Static

from dflash_tui import replay_source
from dflash_tui.diagnosis import DEFAULT_CONFIG, DiagnosisConfig, diagnose
from dflash_tui.link.link import LinkError
from dflash_tui.replay import Recording, ReplayError, memory_line, parse_at
from dflash_tui.state import Store
from dflash_tui.widgets import safe
from dflash_tui.widgets.alerts import AlertsPane
from dflash_tui.widgets.filterbar import SearchBar
from dflash_tui.widgets.gpus import GpuPane
from dflash_tui.widgets.header import StatusBar
from dflash_tui.widgets.heartbeat import HeartbeatPane
from dflash_tui.widgets.plots import Plots
from dflash_tui.widgets.queues import QueuePane
from dflash_tui.widgets.stages import StagePane
from dflash_tui.widgets.steplog import FilterError, StepLog
from trainer.contract.heartbeat import Heartbeat

REFUSED = "replay: control keys are disabled (escape returns to live)"


class ReplayBar(Static):
    DEFAULT_CSS = """
    ReplayBar { height: auto; background: $warning 30%; color: $foreground; padding: 0 1; }
    """


class ReplayScreen(Screen[None]):
    """`recording`: scrub this one; else fetch `run_id`'s through the app's link."""

    replaying = True  # DFlashApp's redraw and controls stand aside while this is on top

    # priority: the step log (focused, scrollable) would take the arrows and home/end.
    BINDINGS = [
        Binding("left", "move(-1)", "entry back", show=False, priority=True),
        Binding("right", "move(1)", "entry on", show=False, priority=True),
        Binding("shift+left,left_square_bracket", "minutes(-1)", "−1 min", priority=True),
        Binding("shift+right,right_square_bracket", "minutes(1)", "+1 min", priority=True),
        Binding("home", "first", "start", show=False, priority=True),
        Binding("end,e", "last", "the end", priority=True),
        Binding("escape,q", "live", "live"),
        Binding("slash", "filter", "filter the log"),
        Binding("p", "noop", "", show=False),  # a replay in a replay: nothing to add
        # The app's control keys do nothing over the dashboard (widgets/keys.py); here they
        # say why (the palette's way in: app_control's `start`).
        Binding("r,K,d,c", "refused", "", show=False),
    ]

    def __init__(
        self,
        run_id: str | None,
        at: str | None = None,
        recording: Recording | None = None,
        config: DiagnosisConfig = DEFAULT_CONFIG,
    ) -> None:
        super().__init__()
        self.run_id = run_id
        self.at = at
        self.recording = recording
        self.config = config
        self.index = 0
        self.store: Store | None = None  # the replayed store shown now

    def compose(self) -> ComposeResult:
        loading = f"REPLAY {self.run_id or ''}: loading telemetry…"
        yield ReplayBar(safe.text(loading), id="replay-bar")
        yield from self.app.compose()  # the live view's panes, as they are laid out there
        # `/` here filters the replayed log (its store, its moment), never the live one.
        yield SearchBar(self._filter, id="replay-filter")

    def on_mount(self) -> None:
        if self.recording is not None:
            self._start(self.recording)
        elif self.run_id is None:
            self._failed("no run is followed: nothing to replay")
        else:
            self._fetch(self.run_id)

    @work(exclusive=True, group="replay")
    async def _fetch(self, run_id: str) -> None:
        app: Any = self.app
        if app.link is None:
            self._failed("not connected")
            return
        try:
            rec = await replay_source.fetch(app.link, app.store, run_id)
        except (ReplayError, LinkError) as e:
            self._failed(str(e))
            return
        self._start(rec)

    def _start(self, rec: Recording) -> None:
        self.recording = rec
        self.index = len(rec.entries) - 1
        if self.at:
            try:
                self.index = rec.index_at(parse_at(self.at, rec.end))
            except ReplayError as e:
                self.app.notify(str(e), severity="error")
        self.show()

    def _failed(self, why: str) -> None:
        self.query_one(ReplayBar).update(
            safe.text(f"REPLAY {self.run_id or ''}: {why} — escape returns to live", "bold red")
        )

    # -- drawing -------------------------------------------------------------------------
    def show(self) -> None:
        rec = self.recording
        if rec is None:
            return
        s = self.store = rec.store_at(self.index)
        try:
            self.query_one(ReplayBar).update(self.bar_text(rec, s))
            self.query_one(StatusBar).update_from(s)
            self.query_one(GpuPane).update(self.gpu_text(rec.entries[self.index].beat))
            self.query_one(HeartbeatPane).update_from(s)
            self.query_one(QueuePane).update_from(s)
            self.query_one(StagePane).update_from(s)
            self.query_one(StepLog).rebuild(s)  # a moment back has fewer lines, not more
            self.query_one(AlertsPane).update_findings(diagnose(s, s.clock(), self.config))
            self.query_one(Plots).update_from(s)
        except NoMatches:  # torn down as a key came in
            return

    def gpu_text(self, beat: Heartbeat) -> Text:
        """What stands in the GPU pane: the agent's samples are not in the run dir."""
        t = Text("GPU samples (util, power, clocks) are not recorded in the run dir.\n", "dim")
        t.append("The trainer's own memory at this entry: ")
        t.append(safe.text(memory_line(beat)))
        return t

    def bar_text(self, rec: Recording, s: Store) -> Text:
        beat = rec.entries[self.index].beat
        t = Text()
        t.append(" REPLAY ", style="bold reverse")
        t.append(f" entry {self.index + 1}/{len(rec.entries)}  ")
        t.append(rec.when(self.index), style="bold")
        t.append(safe.text(f"  step {beat.step}  phase {beat.phase}"))
        t.append(
            "\n ←/→ entry · [/] or shift+←/→ minute · home/end · e the end · esc live"
            " · / filter the log · controls disabled",
            style="dim",
        )
        t.append("\n GPU util/power: not recorded in the run dir")
        if rec.skipped:
            t.append(f" · {rec.skipped} unreadable lines skipped", style="yellow")
        if rec.cut:
            cut = ", ".join(rec.cut)
            t.append(safe.text(f" · only the end of {cut} read: older lines left", "yellow"))
        return t

    # -- keys ----------------------------------------------------------------------------
    def _go(self, index: int) -> None:
        if self.recording is None:
            return
        self.index = max(0, min(index, len(self.recording.entries) - 1))
        self.show()

    def action_move(self, by: int) -> None:
        self._go(self.index + by)

    def action_minutes(self, by: int) -> None:
        if self.recording is not None:
            self._go(self.recording.step_minutes(self.index, by))

    def action_first(self) -> None:
        self._go(0)

    def action_last(self) -> None:
        self._go(len(self.recording.entries) - 1 if self.recording else 0)

    def action_filter(self) -> None:
        self.query_one(SearchBar).open(self.query_one(StepLog).pattern)

    def _filter(self, pattern: str) -> bool:
        if self.store is None:
            return True  # nothing replayed yet
        try:
            self.query_one(StepLog).set_filter(pattern, self.store)
        except FilterError as e:
            self.query_one(SearchBar).say(str(e))
            return False
        return True

    def action_noop(self) -> None:
        pass

    def action_refused(self) -> None:
        self.app.notify(REFUSED, severity="warning")

    def action_live(self) -> None:
        app: Any = self.app
        app.pop_screen()
        app.redraw(force=True)

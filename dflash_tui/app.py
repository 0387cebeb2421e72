"""The Textual app: the second view of the same store the headless mode prints.

Events from the link go into the Store as they arrive (cheap); an event schedules one redraw
REFRESH_S later, so a burst of log lines costs one, and nothing redraws while nothing comes
but the ages (once a second, and only the panes whose text changed: widgets/quiet.py).

The app composes the panes, feeds the store and redraws; its keys delegate: the run's controls
to app_control.py (through dflash_tui/control.py, the CLI's path too; a command already in
flight is never sent twice), the log's and the panes' view keys to app_views.py, and the
screens they open live in widgets/.
"""

from __future__ import annotations

import argparse
import contextlib
import shlex
import time
from collections.abc import Callable, Iterable
from typing import Any

from rich.text import Text
from textual import events
from textual.app import App, ComposeResult, SystemCommand
from textual.color import ColorParseError
from textual.containers import Horizontal, Vertical
from textual.css.query import NoMatches
from textual.notifications import SeverityLevel
from textual.theme import Theme
from textual.widgets import Static

from dflash_tui import run_summary, sanitize, themes
from dflash_tui.app_control import RunControl
from dflash_tui.app_views import ViewKeys
from dflash_tui.diagnosis import DiagnosisConfig, config_for, diagnose, rank_marks
from dflash_tui.link.events import SinkEvent
from dflash_tui.link.link import Link
from dflash_tui.notify import Notifier
from dflash_tui.state import Store
from dflash_tui.targets import Target
from dflash_tui.widgets import keys, layout, palette
from dflash_tui.widgets.alerts import AlertsBox, AlertsPane
from dflash_tui.widgets.filterbar import FilterBar
from dflash_tui.widgets.footer import Footer
from dflash_tui.widgets.gpus import GpuPane
from dflash_tui.widgets.header import StatusBar
from dflash_tui.widgets.heartbeat import HeartbeatPane
from dflash_tui.widgets.offline import OfflineNote, OfflineNotes
from dflash_tui.widgets.panes import Box, Pane
from dflash_tui.widgets.plots import Plots
from dflash_tui.widgets.queues import QueuePane
from dflash_tui.widgets.ranks import RanksPane
from dflash_tui.widgets.replay import ReplayScreen
from dflash_tui.widgets.run_summary import SummaryPane
from dflash_tui.widgets.screens import (
    HelpScreen,
)
from dflash_tui.widgets.stages import StagePane
from dflash_tui.widgets.steplog import StepLog
from dflash_tui.widgets.thread_table import ThreadsScreen


class DFlashApp(App[int]):
    CSS_PATH = "app.tcss"
    TITLE = "dflash-tui"
    BINDINGS = keys.DASHBOARD  # which keys act where: dflash_tui/widgets/keys.py
    # Every screen gets -narrow below 100 columns (Textual sets the class): dialogs stack
    # their buttons there (app.tcss).
    HORIZONTAL_BREAKPOINTS = [(0, "-narrow"), (layout.NARROW_BELOW, "-wide")]
    REFRESH_S = 0.25  # an event's redraw waits this long for the rest of its burst
    AGES_S = 1.0  # "heartbeat 3s ago", time in phase, and findings that come with time

    def __init__(
        self,
        target: Target,
        theme_name: str | None = None,
        link: Any = None,
        connect: bool = True,
        clock: Callable[[], float] = time.time,
        notify_command: str | None = None,
        replay: tuple[str, str | None] | None = None,
    ) -> None:
        """`connect=False`: no link is started (tests feed events with `feed`).
        `notify_command`: --notify's CMD (dflash_tui/notify.py). `replay`: (RUN, --at) of
        `dflash-tui replay`: follow RUN and open its replay at once."""
        super().__init__()
        self.target = target
        self.notifier = (
            None
            if notify_command is None
            else Notifier(
                notify_command, target.name, lambda t: self.notify(t, severity="error"), clock=clock
            )
        )
        self.store = Store(target.name, clock=clock)
        self.connect = connect
        self.replay_request = replay
        self.link: Any = link
        self.clock = clock
        self._drawn_version = -1
        self._redraw_pending = False
        self._notified_version = -1  # the live store's version --notify saw during a replay
        self.controls = RunControl(self)  # kill, restart, dump stacks…: one at a time
        self.views = ViewKeys(self)  # the step log's keys, the pager, zoom
        self.offline_notes = OfflineNotes(self)  # "not connected to …" once, under the header
        self.theme_specs = themes.available_themes()
        for spec in self.theme_specs.values():
            colours: dict[str, Any] = dict(spec.colours)
            theme = Theme(name=spec.name, dark=spec.dark, **colours)
            try:  # a user's file: a colour Textual cannot read is its line, not a traceback
                theme.to_color_system()
            except ColorParseError as e:
                raise themes.ThemeError(f"{spec.path}: {e}") from None
            self.register_theme(theme)
        # Only themes that meet WCAG AA for text, in the palette and for `t`: Textual's own
        # fail (some at 1.9:1); a user's theme that fails is left out and said at start.
        dropped = palette.keep_aa_themes(self)
        self.dropped_themes = {n: why for n, why in dropped.items() if n in self.theme_specs}
        self.theme_specs = {n: t for n, t in self.theme_specs.items() if n not in dropped}
        self.diagnosis = config_for(target.extra)
        # --theme, else the named target's (the user config's), else the one remembered
        self.theme = themes.starting_theme(theme_name, target.extra.get("theme"), self.theme_specs)

    # The same actions as the keys, in the command palette (ctrl+p).
    PALETTE = (
        (
            "Restart the run",
            "kill, wait for GPU memory, launch the same config: resume or fresh (r)",
            "restart",
        ),
        ("Kill the run", "SIGTERM its process group, then SIGKILL (K)", "kill"),
        ("Dump stacks", "every thread's stack, and py-spy where installed (d)", "dump_stacks"),
        ("Clear the compile cache", "refused while a run is alive (c)", "clear_cache"),
        ("Choose a run", "the runs under the run root; space marks, c compares (l)", "runs"),
        ("Run info", "the run's config, environment and exit (i)", "run_info"),
        ("Top of the step log", "train.log from its first line, paged (g)", "log_top"),
        ("Filter the step log", "show only matching lines (/)", "filter"),
        ("Follow or pause the log", "(f)", "follow"),
        ("Wrap the log's long lines", "or one line each, scrolled with ← → (w)", "wrap"),
        ("Time column in the step log", "each step line's wall-clock time, or none (C)", "clock"),
        ("Open the log in $PAGER", "what the monitor holds, sanitised; plain less (o)", "pager"),
        ("View the log", "what the monitor holds, with / search, n N (v)", "log_viewer"),
        (
            "GPU processes",
            "pid, user, memory and command on each GPU; the kernel log's Xid faults (P)",
            "gpu_processes",
        ),
        ("Zoom the focused pane", "to the whole screen; z or Esc back (z)", "zoom"),
        ("Replay the run", "its telemetry with these panes, at any moment (p)", "replay"),
        ("Next theme", "dark, light, high-contrast, … (t)", "next_theme"),
        (
            "Threads and processes",
            "every trainer thread and the run's processes, htop style (T)",
            "threads",
        ),
        ("Help", "the keys (?)", "help"),
    )

    def get_system_commands(self, screen: Any) -> Iterable[SystemCommand]:
        yield from super().get_system_commands(screen)
        for title, help_text, action in self.PALETTE:
            yield SystemCommand(title, help_text, getattr(self, f"action_{action}"))

    # -- layout -----------------------------------------------------------------------
    def compose(self) -> ComposeResult:
        yield StatusBar(id="status")
        yield OfflineNote(id="offline-note")  # "not connected to …", once (widgets/offline.py)
        with Horizontal(id="top"):
            with Pane(id="gpus-box", classes="box"):
                yield Static("GPUs", classes="box-title")
                yield GpuPane(id="gpus")
            with Pane(id="hb-box", classes="box"):
                yield Static("Heartbeat", classes="box-title")
                yield HeartbeatPane(id="heartbeat")
        with Horizontal(id="middle"):
            with Vertical(id="main-col"):
                # Once the run has ended: its summary, in place of the live views (`ended`).
                with Pane(id="summary-box", classes="box"):
                    yield Static("Run summary", classes="box-title")
                    yield SummaryPane(id="summary")
                # processes mode only: a row per rank (hidden until a rank heartbeat comes).
                with Pane(id="ranks-box", classes="box -no-ranks"):
                    yield Static("Ranks · ms per loop", classes="box-title")
                    yield RanksPane(id="ranks")
                # Next to the queues, and as wide as the step log: a bar per thread.
                with Pane(id="stages-box", classes="box"):
                    yield Static("Stages · median ms per loop", classes="box-title")
                    yield StagePane(id="stages")
                with Box(id="log-box", classes="box"):
                    yield Static("Step log", classes="box-title", id="log-title")
                    yield StepLog(id="steplog")
            with Vertical(id="side"):
                with Pane(id="queues-box", classes="box"):
                    yield Static("Queues", classes="box-title")
                    yield QueuePane(id="queues")
                with AlertsBox(id="alerts-box", classes="box"):
                    yield Static("Alerts", classes="box-title")
                    yield AlertsPane(id="alerts")
        with Pane(id="plots-box", classes="box"):
            yield Plots(id="plots")
        yield FilterBar(self.views.apply_filter, id="filter-bar")
        yield Footer(compact=True)
        yield Static(id="too-small")  # below 80x24: the only thing shown (app.tcss)

    def on_resize(self, event: events.Resize) -> None:
        self.apply_layout(event.size.width, event.size.height)

    def apply_layout(self, width: int | None = None, height: int | None = None) -> None:
        """Essentials first (widgets/layout.py): the heartbeat, the stage bars and the plots
        give way on a small terminal, and below the minimum one line says so. The dashboard
        is the first screen, whatever is over it; a replay lays out the same panes."""
        width = self.size.width if width is None else width
        height = self.size.height if height is None else height
        plan, small = layout.plan(width, height), layout.too_small(width, height)
        for screen in self.screen_stack:
            if screen is not self.screen_stack[0] and not isinstance(screen, ReplayScreen):
                continue
            with contextlib.suppress(NoMatches):
                layout.apply(screen, plan)
                screen.set_class(small is not None, "too-small")
                screen.query_one("#too-small", Static).update(Text(small or ""))
        self._shown_ended = None  # the layout showed the stage bars again: decide anew
        with contextlib.suppress(NoMatches):
            self._show_ended(run_summary.replaces_live_views(self.store))

    def on_mount(self) -> None:
        # The step log has the focus from the start (its keys: j k g G, paging). Not by
        # App.AUTO_FOCUS: that is every screen's default, and a screen pushed over this one
        # (the fleet, the runs, the threads) would look for a step log it does not have.
        with contextlib.suppress(NoMatches):
            self.query_one(StepLog).focus()
        palette.follow_theme(self, lambda: self.redraw(force=True))
        for name, why in self.dropped_themes.items():
            self.notify(
                f"theme {name} left out: below WCAG AA ({'; '.join(why[:3])})",
                severity="warning",
                timeout=10,
            )
        # z and Esc (Textual's maximize): the zoomed box takes the whole screen, and back.
        self.watch(self.screen_stack[0], "maximized", lambda _: self.apply_layout(), init=False)
        self.offline_notes.install()
        self.set_interval(self.AGES_S, self.redraw)
        if self.connect:
            if self.link is None:
                follow = self.replay_request[0] if self.replay_request else "latest"
                self.link = Link(self.target, self.feed, follow=follow)
            self.link.start()
        self.redraw(force=True)
        if self.replay_request is not None:
            run_id, at = self.replay_request
            self.push_screen(ReplayScreen(run_id, at, config=self.diagnosis))

    async def on_unmount(self) -> None:
        if self.link is not None and self.connect:
            await self.link.close()  # the remote run is left alone
        if self.notifier is not None:
            self.notifier.close(wait_s=2.0)

    # -- state --------------------------------------------------------------------------
    def feed(self, event: SinkEvent) -> None:
        self.store.apply(event)
        # Before the app runs (events fed ahead of it) there is no timer to set: on_mount
        # draws everything the store holds by then.
        if not self._redraw_pending and self.is_running:
            self._redraw_pending = True
            self.set_timer(self.REFRESH_S, self._redraw_soon)

    def _redraw_soon(self) -> None:
        self._redraw_pending = False
        self.redraw()

    def redraw(self, force: bool = False) -> None:
        """Redraw the panes from the store; skipped while they are not on screen (a full
        screen over them, or the app tearing down as the timer fires)."""
        if not self.screen_stack:
            return  # torn down between the timer and its callback: nothing left to draw
        if getattr(self.screen, "replaying", False):
            # The replay draws its own store (widgets/replay.py); --notify still hears the
            # live run.
            if self.notifier is not None and self.store.version != self._notified_version:
                self._notified_version = self.store.version
                findings = diagnose(self.store, self.clock(), self.diagnosis)
                self.notifier.update(findings, self.store.run_id)
            return
        with contextlib.suppress(NoMatches):
            self._redraw(force)
            self.offline_notes.update(self.store)

    def _redraw(self, force: bool) -> None:
        s = self.store
        if not force and s.version == self._drawn_version:
            # Nothing new, but ages (heartbeat, time in phase) still move, a finding can come
            # with time alone (a stalled loop), and the log's keys (paging, follow) change its
            # title without a change in the store; each pane repaints only if it changed.
            self.query_one(StatusBar).update_from(s)
            self.query_one(HeartbeatPane).update_from(s)
            self.query_one(AlertsPane).update_findings(diagnose(s, self.clock(), self.diagnosis))
            self._log_title()
            return
        self._drawn_version = s.version
        self._show_ended(run_summary.replaces_live_views(s))
        self.query_one(SummaryPane).update_from(s, self.target_args())
        self.query_one(StatusBar).update_from(s)
        self.query_one(GpuPane).update_from(s)
        self.query_one(HeartbeatPane).update_from(s)
        self.query_one(QueuePane).update_from(s)
        self.query_one(StagePane).update_from(s)
        self.query_one(StepLog).update_from(s)
        self.query_one(RanksPane).update_from(s, rank_marks(s, self.clock(), self.diagnosis))
        if bool(s.ranks) != self._ranks_run:  # a processes-mode job: the ranks pane, or why not
            self._ranks_run = bool(s.ranks)
            self.apply_layout()
        findings = diagnose(s, self.clock(), self.diagnosis)
        self.query_one(AlertsPane).update_findings(findings)
        if self.notifier is not None:
            self.notifier.update(findings, s.run_id)
        self.query_one(Plots).update_from(s)
        self._log_title()

    _shown_log_title: object = None
    _ranks_run = False
    _shown_ended: bool | None = None

    def _show_ended(self, ended: bool) -> None:
        """A run that finished or stopped: its summary in place of the live views (the
        queues, the stage bars, the ranks: app.tcss's `ended`); a run alive again (a restart
        followed): them back. A crash keeps its last picture beside the alert."""
        if ended == self._shown_ended:
            return
        self._shown_ended = ended
        screen = self.screen_stack[0]
        screen.set_class(ended, "ended")
        if ended:
            screen.query_one("#stages-box").display = False
        else:  # the stage bars as the terminal's size allows (widgets/layout.py)
            layout.apply(screen, layout.plan(self.size.width, self.size.height))

    def target_args(self) -> str:
        """TARGET as a command line names this run's host: for the summary's export command."""
        t = self.target
        if t.kind == "local":
            return f"local --remote-dir {shlex.quote(t.remote_dir)}"
        return t.name

    def _log_title(self) -> None:
        title = self.query_one(StepLog).title()
        if title != self._shown_log_title:  # drawn on a change only (Text compares its spans)
            self._shown_log_title = title
            self.query_one("#log-title", Static).update(title)

    def notify(
        self,
        message: str,
        *,
        title: str = "",
        severity: SeverityLevel = "information",
        timeout: float | None = None,
        markup: bool = True,
    ) -> None:
        """Every toast goes through here: many quote the host (an agent's error, a run id,
        a progress note), so none is read as markup and its control characters are visible.
        `markup` is accepted for Textual's signature and ignored."""
        super().notify(
            sanitize.field(message),
            title=sanitize.field(title),
            severity=severity,
            timeout=timeout,
            markup=False,
        )

    def show_store(
        self, target: Target, store: Store, link: Any, diagnosis: DiagnosisConfig
    ) -> None:
        """Point the dashboard at another target's store and link (the fleet's Enter); its
        panes are drawn anew at the next redraw."""
        self.target, self.store, self.link, self.diagnosis = target, store, link, diagnosis
        self._drawn_version = -1

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        """The dashboard's keys act only on the dashboard (keys.py): over it, a viewer's or a
        dialog's own keys answer, and a key they do not bind does nothing. The palette calls
        the actions themselves, from anywhere."""
        if keys.dashboard_only(action) and len(self.screen_stack) > 1:
            return False
        return super().check_action(action, parameters)

    # -- keys: the run's controls (app_control.py), the views (app_views.py), screens --------
    def action_kill(self) -> None:
        self.controls.kill()

    def action_restart(self) -> None:
        self.controls.restart()

    def action_dump_stacks(self) -> None:
        self.controls.dump_stacks()

    def action_clear_cache(self) -> None:
        self.controls.clear_cache()

    def action_runs(self) -> None:
        self.controls.runs()

    def action_run_info(self) -> None:
        self.controls.run_info()

    def action_log_top(self) -> None:
        self.views.log_top()

    def on_step_log_page_wanted(self, message: StepLog.PageWanted) -> None:
        # Only the dashboard's log pages train.log through the agent: a replay's (its own
        # StepLog, over the dashboard) shows the lines of its moment and sends nothing.
        if len(self.screen_stack) == 1:
            self.views.page_wanted(message)

    def action_filter(self) -> None:
        self.views.filter()

    def action_wrap(self) -> None:
        self.views.wrap()

    def action_follow(self) -> None:
        self.views.follow()

    def action_clock(self) -> None:
        self.views.clock()

    def action_zoom(self) -> None:
        self.views.zoom()

    def action_pager(self) -> None:
        self.views.pager()

    def action_gpu_processes(self) -> None:
        self.views.gpu_processes()

    def action_log_viewer(self) -> None:
        self.views.log_viewer()

    def action_next_theme(self) -> None:
        names = sorted(self.theme_specs)
        if not names:
            return
        i = names.index(self.theme) if self.theme in names else -1
        self.theme = names[(i + 1) % len(names)]
        not_kept = themes.remember_theme(self.theme)
        self.notify(f"theme: {self.theme}" + (f" ({not_kept})" if not_kept else ""), timeout=2)

    def action_threads(self) -> None:
        if not isinstance(self.screen, ThreadsScreen):  # its rows and actions: widgets/
            self.push_screen(ThreadsScreen())

    def action_replay(self) -> None:
        """The followed run's telemetry, scrubbed with these panes; escape comes back."""
        self.push_screen(ReplayScreen(self.store.run_id, config=self.diagnosis))

    def action_help(self) -> None:
        self.push_screen(HelpScreen())


async def run_app(target: Target, args: argparse.Namespace) -> int:
    theme = getattr(args, "theme", None)
    if theme and theme not in themes.available_themes():
        known = ", ".join(sorted(themes.available_themes()))
        raise themes.ThemeError(f"--theme {theme!r}: no such theme (known: {known})")
    run = getattr(args, "replay_run", None)
    app = DFlashApp(
        target,
        theme_name=theme,
        notify_command=getattr(args, "notify", None),
        replay=(run, getattr(args, "at", None)) if run else None,
    )
    await app.run_async()
    return 0

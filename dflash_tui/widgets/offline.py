"""The "not connected" note (dflash_tui/offline.py says what it reads).

One note, under the header, while the link is down: what it says, why, and when the link
tries again. A pane that never had a connection (nothing of its own but an empty state that
would mislead: "waiting for GPU samples…") is hidden behind a short blank that points at the
note; a pane whose connection was lost keeps its last picture. The note is said once, not in
every pane: six copies of it were all a small terminal showed.
"""

from __future__ import annotations

from textual.app import App
from textual.widget import Widget
from textual.widgets import Static

from dflash_tui import offline
from dflash_tui.state import Store
from dflash_tui.widgets import safe
from dflash_tui.widgets.alerts import AlertsPane
from dflash_tui.widgets.gpus import GpuPane
from dflash_tui.widgets.heartbeat import HeartbeatPane
from dflash_tui.widgets.plots import Plots
from dflash_tui.widgets.queues import QueuePane
from dflash_tui.widgets.stages import StagePane
from dflash_tui.widgets.steplog import StepLog

PANES: tuple[type[Widget], ...] = (
    GpuPane,
    HeartbeatPane,
    StagePane,
    StepLog,
    QueuePane,
    AlertsPane,
    Plots,
)


class OfflineNote(Static):
    """The one note, composed by the app under its header (hidden while connected)."""

    DEFAULT_CSS = """
    OfflineNote { height: auto; padding: 0 1; color: $warning; text-style: bold;
                  background: $panel; }
    """


class OfflineBlank(Static):
    """What a pane that never had a connection shows instead of its empty state."""

    DEFAULT_CSS = """
    OfflineBlank { height: auto; padding: 0 1; color: $foreground 75%; }
    """

    TEXT = "— no data yet"


class OfflineNotes:
    def __init__(self, app: App[int]) -> None:
        self.app = app
        self.blanks: list[tuple[Widget, OfflineBlank]] = []
        self._shown: tuple[str | None, bool] | None = None

    def install(self) -> None:
        """A hidden blank above each pane; call once the panes are composed."""
        for kind in PANES:
            for pane in self.app.query(kind):
                box = pane.parent
                if not isinstance(box, Widget):
                    continue
                blank = OfflineBlank(safe.text(OfflineBlank.TEXT))
                blank.display = False
                box.mount(blank, before=pane)
                self.blanks.append((pane, blank))

    def update(self, s: Store) -> None:
        text = offline.not_connected(s)
        never = s.hello is None  # nothing of the host's in any pane yet
        if (text, never) == self._shown:
            return  # the same words: no refresh (called on every redraw tick)
        self._shown = (text, never)
        note = self.app.screen_stack[0].query_one(OfflineNote)
        note.display = text is not None
        if text is not None:
            note.update(safe.text(text))  # quotes the link's detail: the host's words
        for pane, blank in self.blanks:
            hide = text is not None and never
            blank.display = hide
            pane.display = not hide

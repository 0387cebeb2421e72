"""The "not connected" note above every pane (dflash_tui/offline.py says what it reads).

One note per pane, mounted above it in its box, so the panes themselves stay as they are:
while the link is down each note says so, and why; a pane that never had a connection (so
nothing of its own but an empty state that would mislead) is hidden behind its note; a pane
whose connection was lost keeps its last picture under the note.
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
    DEFAULT_CSS = """
    OfflineNote { height: auto; padding: 0 1; color: $warning; text-style: bold; }
    """


class OfflineNotes:
    def __init__(self, app: App[int]) -> None:
        self.app = app
        self.notes: list[tuple[Widget, OfflineNote]] = []
        self._shown: tuple[str | None, bool] | None = None

    def install(self) -> None:
        """A hidden note above each pane; call once the panes are composed."""
        for kind in PANES:
            for pane in self.app.query(kind):
                box = pane.parent
                if not isinstance(box, Widget):
                    continue
                note = OfflineNote(classes="offline-note")
                note.display = False
                box.mount(note, before=pane)
                self.notes.append((pane, note))

    def update(self, s: Store) -> None:
        text = offline.not_connected(s)
        never = s.hello is None  # nothing of the host's in any pane yet
        if (text, never) == self._shown:
            return  # the same words: no refresh (called on every redraw tick)
        self._shown = (text, never)
        for pane, note in self.notes:
            note.display = text is not None
            if text is not None:
                note.update(safe.text(text))  # quotes the link's detail: the host's words
            pane.display = text is None or not never

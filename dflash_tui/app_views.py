"""The dashboard's view keys: the step log's filter, follow, wrap, clock, top and pages, the
log in $PAGER or in the log viewer (searchable), and zoom. Nothing here acts on the run: a page
of train.log is read through the agent, never held up by a control command in flight.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
from typing import Any

from textual.app import SuspendNotSupported
from textual.css.query import NoMatches

from dflash_tui import control, gpu_procs, log_pages, pager
from dflash_tui.control import ControlError
from dflash_tui.link.link import LinkError
from dflash_tui.widgets.filterbar import FilterBar
from dflash_tui.widgets.panes import box_of
from dflash_tui.widgets.screens import TextScreen
from dflash_tui.widgets.steplog import FilterError, StepLog, shown


class ViewKeys:
    def __init__(self, app: Any) -> None:
        """`app`: the DFlashApp (its store, link and redraw); typed loosely, as this module
        may not import the app that imports it."""
        self.app = app

    def log(self) -> StepLog:
        return self.app.query_one(StepLog)

    def log_top(self) -> None:
        with contextlib.suppress(NoMatches):
            self.log().action_log_top()

    def page_wanted(self, message: StepLog.PageWanted) -> None:
        """The lines of train.log the log scrolled past, fetched from the host."""
        app = self.app
        run_id = app.store.run_id
        if run_id is None or app.link is None:  # nothing to page from: what is held
            with contextlib.suppress(NoMatches):
                self.log().scroll_home(animate=False)
            return

        async def run() -> None:  # read only: not held up by a kill or restart in flight
            try:
                page = await control.read_page(
                    app.link, "train.log", run_id, message.start, message.end, log_pages.PAGE_BYTES
                )
            except (LinkError, ControlError) as e:
                app.notify(f"page the log: {e}", severity="error", timeout=8)
                return
            with contextlib.suppress(NoMatches):
                self.log().show_page(page.text, page.start, page.end, app.store)

        app.run_worker(run(), group="log-pages", exclusive=True)

    def filter(self) -> None:
        self.app.query_one(FilterBar).open(self.log().pattern)

    def apply_filter(self, pattern: str) -> str | None:
        """The filter bar's pattern on the log; why not, in one line, when it is no regex."""
        try:
            self.log().set_filter(pattern, self.app.store)
        except FilterError as e:
            return str(e)
        self.app.redraw(force=True)
        return None

    def wrap(self) -> None:
        wrapped = self.log().toggle_wrap(self.app.store)
        self.app.notify(
            "wrapping long lines" if wrapped else "one line each: ← → scroll", timeout=3
        )
        self.app.redraw(force=True)

    def clock(self) -> None:
        """The wall-clock column of the step log: each step line's time, or none."""
        shown = self.log().toggle_clock(self.app.store)
        self.app.notify(
            "wall-clock time of each step line" if shown else "no time column", timeout=3
        )
        self.app.redraw(force=True)

    def follow(self) -> None:
        following = self.log().toggle_follow(self.app.store)
        self.app.notify("following the log" if following else "log paused", timeout=3)
        self.app.redraw(force=True)

    def zoom(self) -> None:
        """The focused pane to the whole screen, or back."""
        screen = self.app.screen
        if screen.maximized is not None:
            screen.minimize()
            return
        box = box_of(screen.focused)
        if box is not None:
            screen.maximize(box, container=False)

    def log_viewer(self) -> None:
        """The log the store holds in a viewer: / searches, n N, q back (widgets/search.py)."""
        store = self.app.store
        lines = store.log_lines
        title = f"Step log of {store.run_id or 'no run'} — the last {len(lines)} lines held"
        self.app.push_screen(TextScreen(title, "\n".join(shown(line) for line in lines)))

    def gpu_processes(self) -> None:
        """Which processes are on each GPU (pid, user, memory, command, this run's or not),
        a GPU NVML cannot read, the kernel log's Xid lines: gpu_procs.py, a viewer."""
        store = self.app.store
        self.app.push_screen(
            TextScreen(f"GPU processes on {store.target}", gpu_procs.view_text(store))
        )

    def pager(self) -> None:
        """The log the store holds, sanitised, in $PAGER while the app is suspended."""
        app = self.app
        try:
            argv = pager.command(os.environ)
        except pager.PagerError as e:
            app.notify(str(e), severity="error")
            return
        path = pager.write_log(app.store.log_lines, app.store.run_id)
        try:
            with app.suspend():
                subprocess.run([*argv, str(path)], check=False)
        except SuspendNotSupported:
            app.notify("o: this terminal cannot hand the screen to a pager", severity="error")
        except OSError as e:
            app.notify(f"$PAGER {argv[0]}: {e.strerror or e}", severity="error")
        finally:
            path.unlink(missing_ok=True)

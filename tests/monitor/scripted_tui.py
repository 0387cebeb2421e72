"""The real TUI in a real terminal, fed the scripted healthy stream (app_scenarios.py) and
the train.log lines given as arguments: for tests that need what Pilot has not, a terminal
the app can hand over (`o`, $PAGER). Run as `python tests/monitor/scripted_tui.py LINE…`."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from app_scenarios import NOW, RUN, healthy
from monitor_helpers import typed_event

from dflash_tui.app import DFlashApp
from dflash_tui.targets import Target


def main() -> None:
    app = DFlashApp(
        Target(name="gpu-box", kind="ssh", host="gpu-box"),
        theme_name="dark",
        connect=False,
        clock=lambda: NOW,
    )
    lines = [
        {
            "type": "line",
            "t": NOW,
            "run_id": RUN,
            "file": "train.log",
            "offset": 0,
            "end": 0,
            "text": text,
        }
        for text in sys.argv[1:]
    ]
    for e in [*healthy(), *lines]:
        app.feed(typed_event(e))
    app.run()


if __name__ == "__main__":
    main()

"""`--notify CMD`: page yourself. CMD runs (through `sh -c`, so pipes and redirections work)
each time a critical finding appears or clears, with one JSON object on its stdin:

    {"event": "raised" | "cleared", "target": "gpu-box", "run_id": "…", "time": 1764…,
     "finding": {"severity": "critical", "code": "stalled_loop", "title": "…",
                 "evidence": "…", "action": "…"}}

A finding is the same one while its code stays among the criticals, so a stall that goes on
for an hour pages once, and once more when it clears. The command runs beside the monitor,
never in its way: it is not waited for (at most `timeout_s`, then killed), and one that fails
is said once, in one line, with its exit code and last line of stderr. Its text came from the
training host: the JSON escapes every control character, and nothing here parses it back.
"""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Callable
from dataclasses import asdict
from typing import Any

from dflash_tui.diagnosis import Finding

RAISED, CLEARED = "raised", "cleared"


class NotifyError(ValueError):
    """The --notify command itself is unusable (bad input: exit 2)."""


class Notifier:
    def __init__(
        self,
        command: str,
        target: str,
        on_error: Callable[[str], None],
        timeout_s: float = 30.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if not command.strip():
            raise NotifyError("--notify: the command is empty")
        self.command, self.target, self.on_error = command, target, on_error
        self.timeout_s, self.clock = timeout_s, clock
        self.active: dict[str, tuple[Finding, str | None]] = {}  # code -> (finding, its run)
        self.sent: list[dict[str, Any]] = []  # every payload, in order (what --json can show)
        self._running: list[tuple[subprocess.Popen[bytes], float]] = []
        self._failed_once = False

    def update(self, findings: list[Finding], run_id: str | None) -> None:
        """The current findings: notify what became critical and what stopped being so."""
        self._reap()
        now = {f.code: f for f in findings if f.severity == "critical"}
        for code, f in now.items():
            if code not in self.active:
                self._send(RAISED, f, run_id)
                self.active[code] = (f, run_id)
        for code in [c for c in self.active if c not in now]:
            # said of the run it was raised for, even when the view moved on to a new run
            f, raised_for = self.active.pop(code)
            self._send(CLEARED, f, raised_for)

    def _send(self, event: str, f: Finding, run_id: str | None) -> None:
        payload = {
            "event": event, "target": self.target, "run_id": run_id, "time": self.clock(),
            "finding": asdict(f),
        }  # fmt: skip
        self.sent.append(payload)
        try:
            p = subprocess.Popen(
                ["/bin/sh", "-c", self.command],
                stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                start_new_session=True,  # Ctrl-C in the monitor's terminal is not for it
            )  # fmt: skip
        except OSError as e:
            self._fail(f"--notify: cannot run {self.command!r}: {e}")
            return
        assert p.stdin is not None
        try:  # one small object: a pipe holds it without blocking
            p.stdin.write((json.dumps(payload) + "\n").encode())
            p.stdin.close()
        except BrokenPipeError:
            pass  # the command did not read its stdin: its business
        self._running.append((p, time.monotonic()))

    def _reap(self) -> None:
        still = []
        for p, started in self._running:
            rc = p.poll()
            if rc is None:
                if time.monotonic() - started > self.timeout_s:
                    p.kill()
                    p.wait()
                    self._fail(f"--notify: {self.command!r} ran past {self.timeout_s:.0f}s: killed")
                else:
                    still.append((p, started))
                continue
            err = p.stderr.read().decode(errors="replace") if p.stderr else ""
            if p.stderr:
                p.stderr.close()
            if rc != 0:
                last = (err.strip().splitlines() or [""])[-1]
                said = f": {last}" if last else ""
                self._fail(f"--notify: {self.command!r} exited {rc}{said}")
        self._running = still

    def _fail(self, text: str) -> None:
        # Said once: a broken pager must not flood the screen at every refresh.
        if not self._failed_once:
            self._failed_once = True
            self.on_error(text)

    def close(self, wait_s: float = 5.0) -> None:
        """Let the commands in flight finish (up to `wait_s`: a `status --once` that exits at
        once would otherwise cut its own notification short)."""
        deadline = time.monotonic() + wait_s
        while self._running and time.monotonic() < deadline:
            self._reap()
            if self._running:
                time.sleep(0.05)
        self._reap()

"""The state store: folds link and agent events into what the views show.

Pure Python: no asyncio, no textual, no torch. The headless view and the TUI both read it;
diagnosis rules read it. `apply()` is cheap (a dict update or a deque append) so a view can
feed it every event and redraw at its own pace, using `version` to skip idle redraws.
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from trainer.contract.steplines import parse_step_line

ROLE_LETTER = {"target": "T", "drafter": "D", "prefetch": "P"}


@dataclass
class LinkInfo:
    state: str = "idle"  # idle connecting connected reconnecting refused closed
    detail: str = ""
    since: float = field(default_factory=time.time)
    attempt: int = 0
    retry_in: float | None = None
    rtt_ms: float | None = None
    sessions: int = 0


class Store:
    def __init__(
        self,
        target: str = "local",
        log_capacity: int = 5000,
        history: int = 3600,
        clock: Callable[[], float] = time.time,
    ):
        self.target = target
        self.clock = clock  # injectable: snapshot tests need a frozen "now"
        self.version = 0
        self.link = LinkInfo()
        self.hello: dict[str, Any] | None = None
        self.clock_offset: float | None = None  # local time - agent time (min seen)
        self.gpu: dict[str, Any] | None = None
        self.gpu_history: dict[int, deque[tuple[float, int, int | None]]] = {}
        self.history = history
        self.run_id: str | None = None
        self.run_dir: str | None = None
        self.heartbeat: dict[str, Any] | None = None
        self.heartbeat_error: str | None = None
        self.log_lines: deque[str] = deque(maxlen=log_capacity)
        self.log_total = 0  # train.log lines ever received for this run (views count from it)
        self.step_lines: deque[dict[str, Any]] = deque(maxlen=log_capacity)
        self.last_step_line_at: float | None = None  # agent time the last step line arrived
        self.metrics: deque[dict[str, Any]] = deque(maxlen=history * 10)
        self.launch_log: deque[str] = deque(maxlen=500)
        self.runs: list[dict[str, Any]] = []
        self.runs_received = False
        self.alive_run: str | None = None
        self.liveness: dict[str, Any] | None = None
        self.notes: deque[tuple[float, str, str]] = deque(maxlen=200)
        self.follow_received = False

    # -- time ------------------------------------------------------------------------
    def remote_now(self, now: float | None = None) -> float:
        """The agent's clock now: ages of remote timestamps must not depend on clock skew."""
        now = self.clock() if now is None else now
        return now - (self.clock_offset or 0.0)

    def _seen(self, t: Any) -> None:
        if isinstance(t, int | float):
            offset = self.clock() - t
            # The smallest offset is the one with the least transit delay in it.
            if self.clock_offset is None or offset < self.clock_offset:
                self.clock_offset = offset

    # -- events ----------------------------------------------------------------------
    def apply(self, event: dict[str, Any]) -> None:
        kind = event.get("type")
        handler = getattr(self, f"_on_{kind}", None)
        if kind not in ("link", "rtt"):
            self._seen(event.get("t"))
        if handler is not None:
            handler(event)
            self.version += 1

    def _on_link(self, e: dict[str, Any]) -> None:
        if e.get("state") != self.link.state:
            self.link.since = self.clock()
        self.link.state = str(e.get("state"))
        self.link.detail = str(e.get("detail") or "")
        self.link.attempt = int(e.get("attempt") or 0)
        self.link.retry_in = e.get("retry_in")
        if self.link.state == "connected":
            self.link.sessions += 1
            self.clock_offset = None  # a new agent, maybe a new host clock

    def _on_rtt(self, e: dict[str, Any]) -> None:
        self.link.rtt_ms = float(e["rtt_ms"])

    def _on_hello(self, e: dict[str, Any]) -> None:
        self.hello = e

    def _on_gpu(self, e: dict[str, Any]) -> None:
        self.gpu = e
        t = float(e.get("t") or self.clock())
        for d in e.get("devices") or []:
            hist = self.gpu_history.setdefault(int(d["index"]), deque(maxlen=self.history))
            hist.append((t, int(d.get("mem_used") or 0), d.get("util")))

    def _on_follow(self, e: dict[str, Any]) -> None:
        self.follow_received = True
        if e.get("run_id") != self.run_id:
            self.run_id = e.get("run_id")
            self.heartbeat = None
            self.heartbeat_error = None
            self.log_lines.clear()
            self.log_total = 0
            self.step_lines.clear()
            self.metrics.clear()
            self.launch_log.clear()
            self.liveness = None
            self.last_step_line_at = None
        self.run_dir = e.get("run_dir")

    def _on_heartbeat(self, e: dict[str, Any]) -> None:
        if e.get("run_id") == self.run_id:
            self.heartbeat = e.get("data")
            self.heartbeat_error = None

    def _on_heartbeat_error(self, e: dict[str, Any]) -> None:
        self.heartbeat_error = str(e.get("error"))  # the last good heartbeat stays

    def _on_line(self, e: dict[str, Any]) -> None:
        if e.get("run_id") != self.run_id:
            return
        text = str(e.get("text", ""))
        name = e.get("file")
        if name == "train.log":
            self.log_lines.append(text)
            self.log_total += 1
            line = parse_step_line(text)
            if line is not None:
                parsed = dataclasses.asdict(line)
                parsed["received"] = e.get("t")
                self.step_lines.append(parsed)
                self.last_step_line_at = float(e.get("t") or self.clock())
        elif name == "metrics.jsonl":
            try:
                m = json.loads(text)
            except ValueError:
                return
            if isinstance(m, dict):
                self.metrics.append(m)
        elif name == "launch.log":
            self.launch_log.append(text)

    def _on_truncated(self, e: dict[str, Any]) -> None:
        self.notes.append((self.clock(), "warning", f"{e.get('file')} {e.get('reason')}"))

    def _on_runs(self, e: dict[str, Any]) -> None:
        self.runs = list(e.get("runs") or [])
        self.alive_run = e.get("alive_run")
        self.runs_received = True

    def _on_liveness(self, e: dict[str, Any]) -> None:
        if e.get("run_id") == self.run_id:
            self.liveness = e

    def _on_log(self, e: dict[str, Any]) -> None:
        self.notes.append((self.clock(), str(e.get("level")), str(e.get("message"))))

    def _on_progress(self, e: dict[str, Any]) -> None:
        self.notes.append((self.clock(), "info", str(e.get("message"))))

    # -- derived ---------------------------------------------------------------------
    def heartbeat_age(self, now: float | None = None) -> float | None:
        hb = self.heartbeat
        if not hb or not isinstance(hb.get("now"), int | float):
            return None
        return max(0.0, self.remote_now(now) - float(hb["now"]))

    def phase(self) -> tuple[str | None, float | None]:
        hb = self.heartbeat
        if not hb:
            return None, None
        started = hb.get("phase_started_at")
        age = self.remote_now() - float(started) if isinstance(started, int | float) else None
        return hb.get("phase"), age

    def current_run(self) -> dict[str, Any] | None:
        return next((r for r in self.runs if r.get("run_id") == self.run_id), None)

    def exit_info(self) -> dict[str, Any] | None:
        if self.liveness and self.liveness.get("exit"):
            return dict(self.liveness["exit"])
        run = self.current_run()
        return run.get("exit") if run else None

    def process_alive(self) -> bool | None:
        if self.liveness is not None:
            return bool(self.liveness.get("alive"))
        run = self.current_run()
        return None if run is None else bool(run.get("alive"))

    def gpu_roles(self) -> dict[int, str]:
        """GPU index -> role(s) from the heartbeat's threads, matched by UUID when known."""
        hb = self.heartbeat or {}
        devices = (self.gpu or {}).get("devices") or []
        by_uuid = {str(d.get("uuid", "")).removeprefix("GPU-"): int(d["index"]) for d in devices}
        ids = hb.get("devices") or {}
        roles: dict[int, set[str]] = {}
        for t in hb.get("threads") or []:
            dev = str(t.get("device", ""))
            if not dev.startswith("cuda"):
                continue
            uuid = str((ids.get(dev) or {}).get("uuid") or "").removeprefix("GPU-")
            index = by_uuid.get(uuid)
            if index is None:
                try:
                    index = int(dev.split(":")[1]) if ":" in dev else 0
                except ValueError:
                    continue
            roles.setdefault(index, set()).add(str(t.get("role")))
        return {i: "+".join(sorted(r)) for i, r in roles.items()}

    def last_metrics(self) -> dict[str, Any] | None:
        return self.metrics[-1] if self.metrics else None

    def to_json(self, now: float | None = None) -> dict[str, Any]:
        """A snapshot for --json (schema in dflash_tui/headless.py)."""
        phase, in_phase = self.phase()
        hb = self.heartbeat or {}
        last = self.step_lines[-1] if self.step_lines else None
        return {
            "target": self.target,
            "link": {
                "state": self.link.state,
                "detail": self.link.detail,
                "rtt_ms": self.link.rtt_ms,
                "attempt": self.link.attempt,
            },
            "run_id": self.run_id,
            "phase": phase,
            "phase_s": in_phase,
            "step": hb.get("step"),
            "tok_s": hb.get("tok_s"),
            "loss": last["loss"] if last else (self.last_metrics() or {}).get("loss"),
            "queues": hb.get("queues"),
            "heartbeat_age_s": self.heartbeat_age(now),
            "heartbeat_error": self.heartbeat_error,
            "alive": self.process_alive(),
            "exit": self.exit_info(),
            "gpus": [
                {
                    **{k: d.get(k) for k in ("index", "name", "mem_used", "mem_total", "util")},
                    "role": self.gpu_roles().get(int(d["index"])),
                }
                for d in (self.gpu or {}).get("devices") or []
            ],
            "gpu_state": (self.gpu or {}).get("state"),
        }

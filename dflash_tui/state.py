"""The state store: folds the link's typed events into what the views show.

Pure Python: no asyncio, no textual, no torch. The headless view and the TUI both read it;
diagnosis rules read it. `apply()` is cheap (a field update, a deque append, an insert into
the bounded heartbeat history) so a view can feed it every event and redraw at its own pace,
using `version` to skip idle redraws.

Every field is a contract record (trainer/contract/) or a link event (dflash_tui/link/events.py):
the views and rules read attributes that mypy checks, never `.get()` chains. A line or event
that is not one, and a heartbeat, metrics row or telemetry line that does not decode, is
counted in `malformed` (with the last reason) and skipped; the last good heartbeat stays.
"""

from __future__ import annotations

import bisect
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from dflash_tui import ranks_view, stages
from dflash_tui.link.events import LinkStatus, Rtt, SinkEvent
from trainer.contract.evaluation import EvalInfo
from trainer.contract.heartbeat import Heartbeat, ThreadInfo, parse_heartbeat, upgrade_note
from trainer.contract.outcomes import RUNNING, UNKNOWN, Outcome, outcome_of
from trainer.contract.phases import FINAL_PHASES, TRAINING
from trainer.contract.protocol import (
    CLOCK_REASON_NAMES,
    Follow,
    GpuDevice,
    GpuProcess,
    GpuSample,
    HeartbeatError,
    HeartbeatEvent,
    Hello,
    HostSample,
    Line,
    Liveness,
    Log,
    ProcsEvent,
    Progress,
    RankHeartbeatEvent,
    RunInfo,
    RunsEvent,
    Truncated,
)
from trainer.contract.records import ExitRecord, MetricsRow, parse_metrics_line
from trainer.contract.steplines import StepLine, parse_step_line
from trainer.contract.telemetry import parse_telemetry_line
from trainer.contract.typed import Unreadable, encode

ROLE_LETTER = {"target": "T", "drafter": "D", "prefetch": "P", "eval": "E"}

# The heartbeat history the rules look back on (GIL, recompiles, allocator retries): every
# live heartbeat and every telemetry.jsonl line, in `now` order, one per `now`, bounded.
HISTORY_WINDOW_S = 3600.0  # newer than this before the newest one
HISTORY_MAX = 2000  # and at most this many (a live heartbeat every <= 2 s: about an hour)


@dataclass
class LinkInfo:
    state: str = "idle"  # idle connecting connected reconnecting refused closed
    detail: str = ""
    since: float = field(default_factory=time.time)
    attempt: int = 0
    retry_in: float | None = None
    rtt_ms: float | None = None
    sessions: int = 0
    failure: str = ""  # why the last try failed (a `connecting` detail names only the host)


class GpuPoint(NamedTuple):
    t: float  # the agent's time of the sample
    mem_used: int
    util: int | None
    # health, where NVML gave it (GpuDevice's fields): what gpu_throttled and
    # gpu_ecc_errors look back on
    sm_clock_mhz: int | None = None
    clock_reasons: int | None = None
    ecc_uncorrected: int | None = None
    # what gpu_wedged looks back on: processes NVML listed, NVML's error for the device
    procs: int = 0
    error: str = ""


def clock_reason_names(reasons: int | None) -> list[str] | None:
    """NVML's throttle-reason bits as names, most serious first; idle and display left out
    (neither slows a kernel). None: NVML gave no reasons."""
    if reasons is None:
        return None
    return [name for bit, name in CLOCK_REASON_NAMES.items() if reasons & bit]


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
        self.hello: Hello | None = None
        self.clock_offset: float | None = None  # local time - agent time (min seen)
        self.gpu: GpuSample | None = None
        self.gpu_history: dict[int, deque[GpuPoint]] = {}
        self.host: HostSample | None = None  # the newest host sample: CPUs, load, memory, disk
        self.procs: ProcsEvent | None = None  # the followed run's process group, newest sample
        self.history = history
        self.run_id: str | None = None
        self.run_dir: str | None = None
        self.heartbeat: Heartbeat | None = None
        self.heartbeat_error: str | None = None
        self.heartbeats: list[Heartbeat] = []  # the bounded history, oldest first
        self.ranks: dict[int, ranks_view.RankSeen] = {}  # processes mode: ranks_view.py
        self.log_lines: deque[str] = deque(maxlen=log_capacity)
        # train.log's byte offset of each kept line (log_lines' twin): where the step log
        # pages back from when it scrolls past the kept tail (dflash_tui/log_pages.py).
        self.log_offsets: deque[int] = deque(maxlen=log_capacity)
        self.log_total = 0  # train.log lines ever received for this run (views count from it)
        self.step_lines: deque[StepLine] = deque(maxlen=log_capacity)
        self.last_step_line_at: float | None = None  # agent time the last step line arrived
        self.metrics: deque[MetricsRow] = deque(maxlen=history * 10)
        self.launch_log: deque[str] = deque(maxlen=500)
        self.runs: list[RunInfo] = []
        self.runs_received = False
        self.alive_run: str | None = None
        self.liveness: Liveness | None = None
        self.notes: deque[tuple[float, str, str]] = deque(maxlen=200)
        self.follow_received = False
        self.follows = 0  # fresh follows so far: a view keyed on it redraws from scratch
        self.malformed = 0  # lines, events and records skipped as unreadable
        self.malformed_last: str | None = None  # why the last one was

    # -- time ------------------------------------------------------------------------
    def remote_now(self, now: float | None = None) -> float:
        """The agent's clock now: ages of remote timestamps must not depend on clock skew."""
        now = self.clock() if now is None else now
        return now - (self.clock_offset or 0.0)

    def _seen(self, t: float) -> None:
        offset = self.clock() - t
        # The smallest offset is the one with the least transit delay in it.
        if self.clock_offset is None or offset < self.clock_offset:
            self.clock_offset = offset

    # -- events ----------------------------------------------------------------------
    def apply(self, event: SinkEvent) -> None:
        if isinstance(event, LinkStatus):
            self._on_link(event)
        elif isinstance(event, Rtt):
            self.link.rtt_ms = event.rtt_ms
        elif isinstance(event, Unreadable):
            self._skipped(event)
        else:
            if event.t:
                self._seen(event.t)
            if isinstance(event, Hello):
                self.hello = event
            elif isinstance(event, GpuSample):
                self._on_gpu(event)
            elif isinstance(event, HostSample):
                self.host = event
            elif isinstance(event, ProcsEvent):
                if event.run_id == self.run_id:
                    self.procs = event
            elif isinstance(event, Follow):
                self._on_follow(event)
            elif isinstance(event, HeartbeatEvent):
                self._on_heartbeat(event)
            elif isinstance(event, HeartbeatError):
                self.heartbeat_error = event.error  # the last good heartbeat stays
            elif isinstance(event, RankHeartbeatEvent):
                if event.run_id == self.run_id and (bad := ranks_view.fold(self.ranks, event)):
                    self._skipped(bad)
            elif isinstance(event, Line):
                self._on_line(event)
            elif isinstance(event, Truncated):
                self.notes.append((self.clock(), "warning", f"{event.file} {event.reason}"))
            elif isinstance(event, RunsEvent):
                self.runs = list(event.runs)
                self.alive_run = event.alive_run
                self.runs_received = True
            elif isinstance(event, Liveness):
                if event.run_id == self.run_id:
                    self.liveness = event
            elif isinstance(event, Log):
                self.notes.append((self.clock(), event.level, event.message))
            elif isinstance(event, Progress):
                self.notes.append((self.clock(), "info", event.message))
            else:  # Result: the link hands it to the request that waits for it
                return
        self.version += 1

    def _skipped(self, why: Unreadable) -> None:
        self.malformed += 1
        self.malformed_last = str(why)

    def _on_link(self, e: LinkStatus) -> None:
        if e.state != self.link.state:
            self.link.since = self.clock()
        self.link.state = e.state
        self.link.detail = e.detail
        self.link.attempt = e.attempt
        self.link.retry_in = e.retry_in
        if e.state in ("reconnecting", "refused"):
            self.link.failure = e.detail
        if e.state == "connected":
            self.link.failure = ""
            self.link.sessions += 1
            self.clock_offset = None  # a new agent, maybe a new host clock

    def _on_gpu(self, e: GpuSample) -> None:
        self.gpu = e
        t = e.t or self.clock()
        for d in e.devices:
            hist = self.gpu_history.setdefault(d.index, deque(maxlen=self.history))
            hist.append(
                GpuPoint(
                    t,
                    d.mem_used,
                    d.util,
                    d.sm_clock_mhz,
                    d.clock_reasons,
                    d.ecc_uncorrected,
                    len(d.processes),
                    d.error,
                )
            )

    def _on_follow(self, e: Follow) -> None:
        self.follow_received = True
        # Another run, or this one followed afresh (its lines come again from the tail):
        # nothing of what was folded before may stay. A resumed follow (a reconnect)
        # continues where the last session stopped, so everything stays.
        if e.run_id != self.run_id or not e.resumed:
            self.follows += 1
            self.run_id = e.run_id
            self.heartbeat = None
            self.heartbeat_error = None
            self.heartbeats.clear()
            self.ranks.clear()
            self.log_lines.clear()
            self.log_offsets.clear()
            self.log_total = 0
            self.step_lines.clear()
            self.metrics.clear()
            self.launch_log.clear()
            self.liveness = None
            self.procs = None
            self.last_step_line_at = None
        self.run_dir = e.run_dir

    def _on_heartbeat(self, e: HeartbeatEvent) -> None:
        if e.run_id != self.run_id:
            return
        hb = parse_heartbeat(e.data)
        if isinstance(hb, Unreadable):
            self._skipped(hb)
            self.heartbeat_error = f"heartbeat unreadable: {hb.why}"  # the last good one stays
            return
        self.heartbeat = hb
        self.heartbeat_error = None
        self._remember(hb)
        for bad in ranks_view.fold_relayed(self.ranks, hb.ranks):  # other hosts' ranks
            self._skipped(bad)

    def _remember(self, hb: Heartbeat) -> None:
        """Into the history: in `now` order, once per `now`, within the window and count."""
        beats = self.heartbeats
        i = bisect.bisect_left(beats, hb.now, key=lambda b: b.now)
        if i < len(beats) and beats[i].now == hb.now:
            return  # telemetry.jsonl repeats what the live heartbeat said (or a rewrite does)
        beats.insert(i, hb)
        edge = beats[-1].now - HISTORY_WINDOW_S
        drop = max(len(beats) - HISTORY_MAX, bisect.bisect_left(beats, edge, key=lambda b: b.now))
        if drop > 0:
            del beats[:drop]

    def _on_line(self, e: Line) -> None:
        if e.run_id != self.run_id:
            return
        if e.file == "train.log":
            self.log_lines.append(e.text)
            self.log_offsets.append(e.offset)
            self.log_total += 1
            line = parse_step_line(e.text)
            if line is not None:
                self.step_lines.append(line)
                self.last_step_line_at = e.t or self.clock()
        elif e.file == "metrics.jsonl":
            row = parse_metrics_line(e.text)
            if isinstance(row, Unreadable):
                self._skipped(row)
            else:
                self.metrics.append(row)
        elif e.file == "telemetry.jsonl":
            hb = parse_telemetry_line(e.text)
            if isinstance(hb, Unreadable):
                self._skipped(hb)
            elif hb.run_id == self.run_id:
                self._remember(hb)
        elif e.file == "launch.log":
            self.launch_log.append(e.text)

    # -- derived ---------------------------------------------------------------------
    def log_start(self) -> int | None:
        """train.log's byte offset of the oldest kept line (0: the store has it from its
        first line); None before any line."""
        return self.log_offsets[0] if self.log_offsets else None

    def heartbeat_age(self, now: float | None = None) -> float | None:
        if self.heartbeat is None:
            return None
        return max(0.0, self.remote_now(now) - self.heartbeat.now)

    def phase(self) -> tuple[str | None, float | None]:
        hb = self.heartbeat
        if hb is None:
            return None, None
        age = self.remote_now() - hb.phase_started_at if hb.phase_started_at else None
        return hb.phase, age

    def current_run(self) -> RunInfo | None:
        return next((r for r in self.runs if r.run_id == self.run_id), None)

    def exit_info(self) -> ExitRecord | None:
        if self.liveness is not None and self.liveness.exit is not None:
            return self.liveness.exit
        run = self.current_run()
        return run.exit if run else None

    def process_alive(self) -> bool | None:
        if self.liveness is not None:
            return self.liveness.alive
        run = self.current_run()
        return None if run is None else run.alive

    def ended(self) -> bool:
        """The run is over: an exit record, a dead process, or a final phase."""
        hb = self.heartbeat
        return (
            self.exit_info() is not None
            or self.process_alive() is False
            or (hb is not None and hb.phase in FINAL_PHASES)
        )

    def outcome(self) -> Outcome | None:
        """How the followed run ended (trainer/contract/outcomes.py); None while it runs."""
        if self.run_id is None or not self.ended():
            return None
        # The agent's word first: it also read the checkpoints and the logs' last words.
        listed = self.current_run()
        if listed and listed.outcome and listed.outcome.kind not in (RUNNING, UNKNOWN):
            return listed.outcome
        alive = self.process_alive() is True and self.exit_info() is None
        got = outcome_of(alive, self.heartbeat, self.exit_info())
        return None if got.kind in (RUNNING, UNKNOWN) else got

    def shown_phase(self) -> tuple[str | None, float | None]:
        """What the status line and header say: the phase while the run lives, how it ended
        once it did (a run stopped at step 51 says `stopped`, whatever its last phase)."""
        phase, age = self.phase()
        outcome = self.outcome()
        if outcome is not None:
            return outcome.word, age if phase in FINAL_PHASES else None
        hb = self.heartbeat
        if phase == TRAINING and hb is not None:
            # Training's time counts from its first visit: a checkpoint is a pause in it,
            # not a new start (the header said `training 12s` after every save).
            first = next((v for v in hb.phase_history if v.phase == TRAINING), None)
            if first is not None and first.started_at:
                age = max(0.0, self.remote_now() - first.started_at)
        return phase, age

    def heartbeat_note(self) -> str | None:
        """`heartbeat schema 3: upgrade dflash-tui …` for a heartbeat newer than this reader."""
        return upgrade_note(self.heartbeat) if self.heartbeat is not None else None

    # -- GPUs --------------------------------------------------------------------------
    def gpu_devices(self) -> dict[int, GpuDevice]:
        return {d.index: d for d in self.gpu.devices} if self.gpu else {}

    def gpu_index(self, device: str) -> int | None:
        """The NVML index of a trainer device ("cuda:3"): by UUID when the heartbeat has it
        (the trainer's cuda:N is renumbered by CUDA_VISIBLE_DEVICES), else N."""
        if not device.startswith("cuda"):
            return None
        ids = self.heartbeat.devices if self.heartbeat else {}
        uuid = (ids[device].uuid or "") if device in ids else ""
        if uuid:
            by_uuid = {d.uuid.removeprefix("GPU-"): i for i, d in self.gpu_devices().items()}
            index = by_uuid.get(uuid.removeprefix("GPU-"))
            if index is not None:
                return index
        try:
            return int(device.split(":")[1]) if ":" in device else 0
        except ValueError:
            return None

    def thread_gpu(self, thread: ThreadInfo) -> int | None:
        """The sampled GPU a thread runs on; None without one (or without GPU samples)."""
        index = self.gpu_index(thread.device)
        return index if index in self.gpu_devices() else None

    def run_pids(self) -> set[int]:
        """The followed run's pids as the agent's namespace numbers them: the trainer (its
        heartbeat), its process group (the `procs` sample), a job's ranks."""
        pids = set()
        if self.heartbeat is not None:
            pids.add(self.heartbeat.pid)
        if self.procs is not None and self.procs.run_id == self.run_id:
            pids.update(p.pid for p in self.procs.procs)
        pids.update(r.beat.pid for r in self.ranks.values() if r.beat is not None)
        pids.discard(0)
        return pids

    def this_run(self, p: GpuProcess) -> bool | None:
        """Whether a GPU process is the followed run's; None for a pid of another pid
        namespace (NVML in a container may list the host's), which cannot be matched."""
        return p.pid in self.run_pids() if p.local else None

    def gpu_roles(self) -> dict[int, str]:
        """GPU index -> role(s) from the heartbeat's threads ("prefetch+target")."""
        roles: dict[int, set[str]] = {}
        for t in self.heartbeat.threads if self.heartbeat else []:
            index = self.gpu_index(t.device)
            if index is not None:
                roles.setdefault(index, set()).add(t.role)
        return {i: "+".join(sorted(r)) for i, r in roles.items()}

    def host_age(self, now: float | None = None) -> float | None:
        """Seconds since the newest host sample, on the agent's clock; None without one."""
        if self.host is None:
            return None
        return max(0.0, self.remote_now(now) - self.host.t)

    def eval_info(self) -> EvalInfo | None:
        """Held-out τ during training as the heartbeat says it (trainer/contract/evaluation.py):
        the latest result and the history. None: the run evaluates nothing, or an older
        trainer. dflash_tui/evaluation.py computes what the views show from it."""
        return self.heartbeat.eval if self.heartbeat is not None else None

    def last_metrics(self) -> MetricsRow | None:
        return self.metrics[-1] if self.metrics else None

    def last_loss(self) -> float | None:
        if self.step_lines:
            return self.step_lines[-1].loss
        last = self.last_metrics()
        return last.loss if last else None

    def to_json(self, now: float | None = None) -> dict[str, Any]:
        """A snapshot for --json (schema in dflash_tui/headless.py)."""
        phase, in_phase = self.phase()
        hb = self.heartbeat
        roles = self.gpu_roles()
        outcome = self.outcome()
        rows = stages.of_heartbeat(hb)
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
            "step": hb.step if hb else None,
            "tok_s": hb.tok_s if hb else None,
            "loss": self.last_loss(),
            "queues": encode(hb.queues) if hb else None,
            "phase_progress": encode(hb.phase_progress) if hb else None,
            "compile": encode(hb.compile) if hb else None,
            "graphs": encode(hb.graphs) if hb else None,
            "stages": stages.to_json(rows),
            "busiest": stages.busiest_json(rows),
            "eval": encode(self.eval_info()),
            "heartbeat_age_s": self.heartbeat_age(now),
            "heartbeat_error": self.heartbeat_error,
            "ranks": ranks_view.to_json(self.ranks),
            "heartbeat_note": self.heartbeat_note(),
            "alive": self.process_alive(),
            "exit": encode(self.exit_info()),
            "outcome": {"kind": outcome.kind, "summary": outcome.summary} if outcome else None,
            "malformed": self.malformed,
            "gpus": [
                {
                    "index": d.index,
                    "name": d.name,
                    "mem_used": d.mem_used,
                    "mem_total": d.mem_total,
                    "util": d.util,
                    "role": roles.get(d.index),
                    "sm_clock_mhz": d.sm_clock_mhz,
                    "sm_clock_max_mhz": d.sm_clock_max_mhz,
                    "clock_reasons": clock_reason_names(d.clock_reasons),
                    "ecc_uncorrected": d.ecc_uncorrected,
                    "power_w": d.power_w,
                    "power_limit_w": d.power_limit_w,
                    "temp_c": d.temp_c,
                    "pci_bus_id": d.pci_bus_id,
                    "error": d.error,
                    "processes": [
                        {
                            "pid": p.pid,
                            "user": p.user,
                            "mem_used": p.mem_used,
                            "command": p.command,
                            "local": p.local,
                            "this_run": self.this_run(p),
                        }
                        for p in d.processes
                    ],
                }
                for d in (self.gpu.devices if self.gpu else [])
            ],
            "gpu_state": self.gpu.state if self.gpu else None,
            "gpu_xids": [encode(x) for x in self.gpu.xids] if self.gpu else [],
            "kernel_log": self.gpu.kernel_log if self.gpu else "",
            "host": encode(self.host),
            "procs": encode(self.procs),
        }

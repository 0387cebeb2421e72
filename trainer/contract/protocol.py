"""The agent's protocol: the events it streams and the commands it takes, as records.

JSON lines both ways over one channel (the agent's stdout and stdin). Every event carries
`type` and `t` (the agent's unix time); every command carries `cmd` and `id`, and is answered
by exactly one `result` event with that id (`progress` events may come before it).

The monitor decodes each event at the boundary (`decode_event`): a line that is not a known,
well-formed event becomes an `Unreadable` value that is counted and dropped, never an
exception in the link. The agent decodes each command the same way (`decode_command`).

Client timeouts live here, next to the commands, so the CLI and the TUI (dflash_tui/control.py
builds every command) cannot disagree on them.
"""

from __future__ import annotations

import dataclasses
import json
import math
from typing import Any, TypeVar

from trainer.contract.checkpoints import CheckpointUse, ResumePoint
from trainer.contract.comparable import RunSignature
from trainer.contract.environment import Environment, Preflight
from trainer.contract.evaluation import EvalInfo, EvalPoint
from trainer.contract.nodes import NodePlace
from trainer.contract.outcomes import Outcome
from trainer.contract.records import ExitRecord
from trainer.contract.typed import Invalid, Unreadable, decode, encode

T = TypeVar("T")
# 2: the first versioned protocol; 3: `rank_heartbeat` (a processes-mode job's ranks);
# 4: `Launch.node`/`Restart.node` (one host of a job over several: nodes.py), `Kill.ended_ok`.
PROTOCOL_VERSION = 4
RELEASE_CHECK_S = 120.0  # restart --deploy: the new release's import check on the host
MAX_LINE_BYTES = 8 << 20  # one event or command line; longer ones are refused, not fatal
MAX_TEXT_BYTES = 64 << 10  # one followed file line in a `line` event: longer ones are cut
TAIL_BYTES = 256 * 1024  # where a follow without offsets starts: this far from a file's end
FOLLOWED_FILES = ("train.log", "metrics.jsonl", "launch.log", "telemetry.jsonl")
# What a monitor follows from byte 0 (FollowRun.from_start): one row per logged step, so a
# past run's plots start at its first step; train.log is paged back on demand instead.
FROM_START_FILES = ("metrics.jsonl",)


# -- events (agent -> monitor) -------------------------------------------------------------
@dataclasses.dataclass(kw_only=True)
class Event:
    t: float = 0.0  # the agent's clock when it sent the event

    @property
    def type(self) -> str:
        return EVENT_NAMES[type(self)]

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = encode(self)
        data["type"] = self.type
        return data

    def invalid(self) -> str | None:
        """Why a well-typed event still cannot be the agent's (a NaN load, a negative size);
        None for a sound one. `decode_event` refuses it as Unreadable."""
        # A NaN time would be fresh for ever (an age of NaN compares false with any limit).
        return None if math.isfinite(self.t) else f"t {self.t}: not a time"


@dataclasses.dataclass
class Deployed:
    sha256: str
    release: str = ""
    at: float = 0.0
    bytes: int = 0


@dataclasses.dataclass(kw_only=True)
class Hello(Event):
    version: int
    pid: int
    host: str
    python: str = ""
    python_version: str = ""
    run_root: str = ""
    remote_dir: str = ""
    gpu_backend: str = "none"  # nvml | nvidia-smi | none
    gpu_reason: str = ""
    pyspy: bool = False
    deployed: Deployed | None = None


@dataclasses.dataclass
class GpuProcess:
    pid: int
    mem_used: int = 0
    local: bool = True  # the pid exists in the agent's pid namespace


@dataclasses.dataclass
class GpuDevice:
    index: int
    uuid: str = ""
    name: str = ""
    mem_used: int = 0
    mem_total: int = 0
    util: int | None = None  # %
    power_w: float | None = None
    temp_c: int | None = None
    processes: list[GpuProcess] = dataclasses.field(default_factory=list)
    # Health (NVML only; None where the board or driver cannot say): checked at the
    # boundary by `_drop_bad_health`, a bad value drops the field, not the sample.
    sm_clock_mhz: int | None = None
    sm_clock_max_mhz: int | None = None
    clock_reasons: int | None = None  # NVML's clocks-event ("throttle") reasons bitmask
    ecc_uncorrected: int | None = None  # volatile: since the driver loaded
    power_limit_w: float | None = None  # the enforced limit


# Clock event reasons (nvml.h's nvmlClocksEventReason*): the bits the monitor names.
CLOCK_IDLE = 0x1
CLOCK_APP_SETTING = 0x2
CLOCK_POWER_CAP = 0x4
CLOCK_HW_SLOWDOWN = 0x8
CLOCK_SYNC_BOOST = 0x10
CLOCK_SW_THERMAL = 0x20
CLOCK_HW_THERMAL = 0x40
CLOCK_POWER_BRAKE = 0x80
CLOCK_REASON_NAMES = {  # most serious first; idle and display clocks slow no kernel
    CLOCK_HW_THERMAL: "hw thermal",
    CLOCK_SW_THERMAL: "sw thermal",
    CLOCK_HW_SLOWDOWN: "hw slowdown",
    CLOCK_POWER_BRAKE: "power brake",
    CLOCK_POWER_CAP: "power cap",
    CLOCK_SYNC_BOOST: "sync boost",
    CLOCK_APP_SETTING: "app clocks",
}
# The reasons that are a fault (heat, the board's own slowdown signal, an external power
# brake), as against the power cap a sustained load normally runs into.
CLOCK_SLOWDOWNS = CLOCK_HW_THERMAL | CLOCK_SW_THERMAL | CLOCK_HW_SLOWDOWN | CLOCK_POWER_BRAKE

# What a health reading may be, at most: anything else from the host is dropped.
_HEALTH_LIMITS: dict[str, tuple[type, float]] = {
    "sm_clock_mhz": (int, 10_000),  # MHz: no GPU clocks at 10 GHz
    "sm_clock_max_mhz": (int, 10_000),
    "clock_reasons": (int, (1 << 64) - 1),
    "ecc_uncorrected": (int, (1 << 64) - 1),
    "power_limit_w": (float, 10_000.0),
}


def _health_ok(value: Any, kind: type, limit: float) -> bool:
    if value is None:
        return True
    if isinstance(value, bool) or not isinstance(value, int if kind is int else int | float):
        return False
    if isinstance(value, float) and not math.isfinite(value):
        return False
    return 0 <= value <= limit  # compared as it is: an int of 400 digits is no float


def _drop_bad_health(data: Any) -> Any:
    """A gpu event with every health reading of the wrong type or out of range removed (it
    reads as None): one odd reading from a driver must not cost the whole sample."""
    devices = data.get("devices") if isinstance(data, dict) else None
    if not isinstance(devices, list):
        return data
    clean = [
        {k: v for k, v in d.items() if k not in _HEALTH_LIMITS or _health_ok(v, *_HEALTH_LIMITS[k])}
        if isinstance(d, dict)
        else d
        for d in devices
    ]
    return {**data, "devices": clean}


@dataclasses.dataclass(kw_only=True)
class GpuSample(Event):
    backend: str  # nvml | nvidia-smi | none
    devices: list[GpuDevice] = dataclasses.field(default_factory=list)
    state: str | None = None  # None: a sample; "no_gpu" | "error": why there is none
    reason: str = ""


@dataclasses.dataclass
class DiskSpace:
    path: str  # the folder statted: the run root, or the nearest folder above it that exists
    free: int  # bytes the agent's user may still write there (statvfs f_bavail)
    total: int


MAX_HOST_BYTES = 1 << 60  # an exabyte: no real host's memory or disk is larger
MAX_CPUS = 1 << 16
MAX_LOAD = 1e6


@dataclasses.dataclass(kw_only=True)
class HostSample(Event):
    """The training host as the agent sees it every few seconds (dflash_tui/agent/host.py)."""

    cpus: int  # CPUs the agent may run on (sched_getaffinity), else the host's count
    load: list[float]  # load averages over 1, 5 and 15 minutes; empty: the host has none
    cpu_pct: float | None = None  # host CPU use since the previous sample, % of all CPUs
    mem_total: int | None = None  # bytes (/proc/meminfo MemTotal)
    mem_available: int | None = None  # bytes (MemAvailable)
    disk: DiskSpace | None = None  # None: statvfs failed

    def invalid(self) -> str | None:
        if (why := super().invalid()) is not None:
            return why
        if not 1 <= self.cpus <= MAX_CPUS:
            return f"cpus {self.cpus}: not a host's"
        if len(self.load) not in (0, 3) or not all(0.0 <= x <= MAX_LOAD for x in self.load):
            return f"load {self.load}: not three load averages"  # NaN fails both bounds
        if self.cpu_pct is not None and not 0.0 <= self.cpu_pct <= 100.0:
            return f"cpu_pct {self.cpu_pct}: not a share"
        mem = (self.mem_total, self.mem_available)
        if (mem[0] is None) != (mem[1] is None):
            return "memory: total and available come together"
        total, available = mem
        if (
            total is not None
            and available is not None
            and not 0 <= available <= total <= MAX_HOST_BYTES
        ):
            return f"memory: {available} available of {total}: not a host's"
        d = self.disk
        if d is not None and not 0 <= d.free <= d.total <= MAX_HOST_BYTES:
            return f"disk: {d.free} free of {d.total}: not a file system's"
        return None


# A run's process group as the agent samples it (dflash_tui/agent/proc_table.py): at most
# MAX_PROCS processes, each checked at the boundary; a bad entry is dropped, not the sample.
MAX_PROCS = 256
MAX_PROC_NAME = 64  # /proc/PID/comm is 15 characters; a command line is cut to this
PROC_STATES = frozenset("RSDZTtWXxKPI")  # /proc/PID/stat's state letters


@dataclasses.dataclass
class ProcInfo:
    """One process of the run's group: what `signal_process` names it by (pid and start),
    and what the thread/process table shows."""

    pid: int
    start: int  # clock ticks after boot (/proc/PID/stat field 22): with the pid, the process
    ppid: int = 0
    state: str = "?"  # one of PROC_STATES
    name: str = ""  # its command line, cut to MAX_PROC_NAME (the comm when it has none)
    cpu_pct: float | None = None  # since the previous sample, % of one CPU; None: first seen
    rss: int = 0  # bytes resident
    threads: int = 0

    def invalid(self) -> str | None:
        if not 1 <= self.pid <= 1 << 22 or not 0 <= self.ppid <= 1 << 22:  # pid_max's limit
            return f"pid {self.pid} (ppid {self.ppid}): not a pid"
        if self.start < 0:
            return f"pid {self.pid}: start {self.start}: not a time"
        if self.state not in PROC_STATES:
            return f"pid {self.pid}: state {self.state[:8]!r}: not a process state"
        if len(self.name) > MAX_PROC_NAME:
            return f"pid {self.pid}: a name of {len(self.name)} characters"
        if self.cpu_pct is not None and not 0.0 <= self.cpu_pct <= 100.0 * MAX_CPUS:
            return f"pid {self.pid}: cpu_pct {self.cpu_pct}: not a share"  # NaN fails too
        if not 0 <= self.rss <= MAX_HOST_BYTES:
            return f"pid {self.pid}: rss {self.rss}: not a process's"
        if not 0 <= self.threads <= 1 << 22:
            return f"pid {self.pid}: {self.threads} threads"
        return None


def _sound_proc(entry: Any) -> bool:
    try:
        return decode(ProcInfo, entry, "procs[]").invalid() is None
    except Invalid:
        return False


def _drop_bad_procs(data: Any) -> Any:
    """A procs event with every entry that is not a sound ProcInfo removed (an unsound
    wrapper reads as None): one odd process (or a hostile line) must not cost the table the
    others."""
    if not isinstance(data, dict):
        return data
    procs = data.get("procs")
    if isinstance(procs, list) and len(procs) <= MAX_PROCS:  # too many: refused whole
        data = {**data, "procs": [entry for entry in procs if _sound_proc(entry)]}
    if data.get("wrapper") is not None and not _sound_proc(data["wrapper"]):
        data = {k: v for k, v in data.items() if k != "wrapper"}
    return data


@dataclasses.dataclass(kw_only=True)
class ProcsEvent(Event):
    """The followed run's process group every few seconds: only processes whose group is
    the one `identity.prove` proved for the run. Empty with `note` when nothing is proven
    (the run ended, or its process cannot be proven to be it)."""

    run_id: str
    pgid: int = 0  # 0: nothing proven
    leader: int = 0  # the proven run process (the trainer)
    procs: list[ProcInfo] = dataclasses.field(default_factory=list)
    # The launch wrapper (agent/wrap.py), the trainer's parent, outside the group: shown, not
    # signalled. None: a run started by hand, or it is gone.
    wrapper: ProcInfo | None = None
    note: str = ""

    def invalid(self) -> str | None:
        if (why := super().invalid()) is not None:
            return why
        if not 0 <= self.pgid <= 1 << 22 or not 0 <= self.leader <= 1 << 22:
            return f"pgid {self.pgid} (leader {self.leader}): not a process group"
        if len(self.procs) > MAX_PROCS:
            return f"{len(self.procs)} processes (at most {MAX_PROCS})"
        if self.wrapper is not None and (why := self.wrapper.invalid()) is not None:
            return f"wrapper: {why}"
        return None


@dataclasses.dataclass
class RunEval:
    """A run's held-out eval as the runs list carries it: its heartbeat's `eval`
    (trainer/contract/evaluation.py) without the history, and the settings two runs' τ must
    share to be compared (with the runs' `comparable` signatures: dflash_tui/facts.py)."""

    held_out: int = 0  # samples kept out of training
    prompts: int = 0  # per eval
    new_tokens: int = 0  # per prompt
    data: str = ""  # config.json's data.path: the held-out samples are that data's
    prompt_len: int = 0  # config.json's eval.prompt_len: a prompt's last tokens, at most
    evals: int = 0  # evals in the heartbeat's history
    best: EvalPoint | None = None  # EvalInfo.best()
    last: EvalPoint | None = None  # the newest eval in the history
    error: str | None = None  # the last eval failed: why (the host's words)

    def settings(self) -> tuple[int, int, int, str, int]:
        return (self.held_out, self.prompts, self.new_tokens, self.data, self.prompt_len)

    @classmethod
    def of(cls, info: EvalInfo, data: str = "", prompt_len: int = 0) -> RunEval:
        return cls(
            held_out=info.held_out,
            prompts=info.prompts,
            new_tokens=info.new_tokens,
            data=data,
            prompt_len=prompt_len,
            evals=len(info.history),
            best=info.best(),
            last=info.history[-1] if info.history else None,
            error=info.error,
        )


@dataclasses.dataclass
class RunInfo:
    """One run under the run root, as the runs list shows it."""

    run_id: str
    created: float = 0.0
    name: str | None = None
    phase: str | None = None
    step: int | None = None
    alive: bool = False
    exit: ExitRecord | None = None
    outcome: Outcome | None = None
    best_tok_s: float | None = None
    last_tok_s: float | None = None
    steps: int = 0
    error: str | None = None
    phases: dict[str, float] = dataclasses.field(default_factory=dict)  # visit key -> s
    target_load_s: float | None = None  # the whole weight load (it overlaps compiling)
    role_memory: dict[str, int] = dataclasses.field(default_factory=dict)  # role -> peak B
    signature: RunSignature | None = None
    schema: int | None = None  # the heartbeat's schema
    unreadable: list[str] = dataclasses.field(default_factory=list)  # files that were not
    environment: Environment | None = None  # config.json run.environment (None: older run)
    preflight: Preflight | None = None  # config.json run.preflight
    # Where a restart would continue: its newest good checkpoint (or, with none of its own, its
    # parent's); None from an agent that did not read the checkpoints.
    resume: ResumePoint | None = None
    # Held-out τ during training (the heartbeat's `eval`); None: the run evaluated nothing,
    # an older trainer, or an older agent.
    eval: RunEval | None = None
    # Its checkpoints on disk, for what the next ones need (disk_short); None: none written
    # yet, or an older agent.
    checkpoints: CheckpointUse | None = None


@dataclasses.dataclass(kw_only=True)
class RunsEvent(Event):
    runs: list[RunInfo] = dataclasses.field(default_factory=list)
    alive_run: str | None = None

    def invalid(self) -> str | None:
        if (why := super().invalid()) is not None:
            return why
        for r in self.runs:
            why = r.checkpoints.invalid() if r.checkpoints is not None else None
            if why is not None:
                return f"{r.run_id}: {why}"
        return None


@dataclasses.dataclass(kw_only=True)
class Follow(Event):
    run_id: str | None
    run_dir: str | None = None
    # True: the follow continues at the offsets the monitor sent for this run (a reconnect),
    # so what it has is kept; False: a fresh follow, each file from its tail (or its start),
    # so a monitor forgets what it had of the run and its offsets (lines come again).
    resumed: bool = False


@dataclasses.dataclass(kw_only=True)
class HeartbeatEvent(Event):
    run_id: str
    data: Any  # the heartbeat as written; the store parses it (parse_heartbeat)


@dataclasses.dataclass(kw_only=True)
class HeartbeatError(Event):
    run_id: str
    error: str


@dataclasses.dataclass(kw_only=True)
class RankHeartbeatEvent(Event):
    """heartbeat-rank{R}.json of a processes-mode job (trainer/contract/ranks.py): the file
    as written, which the store parses with the contract's reader, or why it is unreadable."""

    run_id: str
    rank: int
    data: Any = None
    error: str | None = None

    def invalid(self) -> str | None:
        if not 0 <= self.rank < (1 << 16):
            return f"rank {self.rank}: not a rank"
        return super().invalid()


@dataclasses.dataclass(kw_only=True)
class Line(Event):
    run_id: str
    file: str
    offset: int  # bytes [offset, end) of the file, without the newline
    end: int
    text: str


@dataclasses.dataclass(kw_only=True)
class Truncated(Event):
    run_id: str
    file: str
    size: int
    reason: str  # replaced (reading restarts at 0) | truncated (at the new end)


@dataclasses.dataclass(kw_only=True)
class Liveness(Event):
    run_id: str
    alive: bool
    pid: int | None = None
    pgid: int | None = None
    exit: ExitRecord | None = None


@dataclasses.dataclass(kw_only=True)
class Progress(Event):
    id: int | None = None
    message: str


@dataclasses.dataclass(kw_only=True)
class Result(Event):
    id: int | None = None
    ok: bool
    data: Any = None
    error: str | None = None
    traceback: str | None = None
    # The command named something that is not there or not valid: the CLI exits 2, not 1.
    bad_input: bool = False


@dataclasses.dataclass(kw_only=True)
class Log(Event):
    level: str
    message: str


EVENTS: dict[str, type[Event]] = {
    "hello": Hello,
    "gpu": GpuSample,
    "host": HostSample,
    "procs": ProcsEvent,
    "runs": RunsEvent,
    "follow": Follow,
    "heartbeat": HeartbeatEvent,
    "heartbeat_error": HeartbeatError,
    "rank_heartbeat": RankHeartbeatEvent,
    "line": Line,
    "truncated": Truncated,
    "liveness": Liveness,
    "progress": Progress,
    "result": Result,
    "log": Log,
}
EVENT_NAMES: dict[type, str] = {cls: name for name, cls in EVENTS.items()}


def _decode_tagged(data: Any, tag: str, table: dict[str, type[T]], what: str) -> T | Unreadable:
    """`data` as the record its `tag` key names in `table`, or why it is not one."""
    if not isinstance(data, dict):
        return Unreadable(what, f"not a JSON object ({type(data).__name__})")
    name = data.get(tag)
    cls = table.get(name) if isinstance(name, str) else None
    if cls is None:
        return Unreadable(what, f"unknown {what} {str(name)[:40]!r}")
    try:
        return decode(cls, data, str(name))
    except Invalid as e:
        return Unreadable(f"{name} {what}", str(e))


def decode_event(data: Any) -> Event | Unreadable:
    """An agent event from parsed JSON, or why it is not one: well-typed and sound."""
    if isinstance(data, dict) and data.get("type") == "gpu":
        data = _drop_bad_health(data)
    if isinstance(data, dict) and data.get("type") == "procs":
        data = _drop_bad_procs(data)
    event = _decode_tagged(data, "type", EVENTS, "event")
    if isinstance(event, Unreadable):
        return event
    why = event.invalid()
    return Unreadable(f"{event.type} event", why) if why is not None else event


def decode_event_line(raw: bytes | str) -> Event | Unreadable:
    if len(raw) > MAX_LINE_BYTES:
        return Unreadable("event", f"a line of {len(raw)} bytes (at most {MAX_LINE_BYTES})")
    try:
        data = json.loads(raw)
    except (ValueError, RecursionError) as e:
        return Unreadable("event", f"not JSON ({str(e)[:120]})")
    return decode_event(data)


# -- commands (monitor -> agent) -----------------------------------------------------------
@dataclasses.dataclass(kw_only=True)
class Command:
    id: int = 0

    @property
    def cmd(self) -> str:
        """The command's name on the wire (the `cmd` key). Not `name`: Launch and ReadFile
        have a field of that name (the run's, the file's), which would shadow it."""
        return COMMAND_NAMES[type(self)]

    def client_timeout(self) -> float:
        """Seconds the monitor waits for the result."""
        return 60.0

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = encode(self)
        data["cmd"] = self.cmd
        return data


@dataclasses.dataclass(kw_only=True)
class Ping(Command):
    def client_timeout(self) -> float:
        return 5.0


@dataclasses.dataclass(kw_only=True)
class FollowRun(Command):
    run_id: str = "latest"  # or a run id; "latest" switches when a new run starts
    offsets: dict[str, int] = dataclasses.field(default_factory=dict)  # file -> next byte
    offsets_run_id: str | None = None  # the run those offsets were read from
    # Files read from byte 0 rather than from their tail when no offset is given for them
    # (metrics.jsonl: a past run's plots from its first step); a name not followed is ignored.
    from_start: list[str] = dataclasses.field(default_factory=list)

    def client_timeout(self) -> float:
        return 30.0


@dataclasses.dataclass(kw_only=True)
class ListRuns(Command):
    pass


@dataclasses.dataclass(kw_only=True)
class Launch(Command):
    config_toml: str
    overrides: list[str] = dataclasses.field(default_factory=list)
    name: str = "run"
    start_timeout_s: float = 30.0
    # One host of a job over several: this run id exactly (refused if its dir exists) and the
    # node's place, put in the trainer's environment. None: a run of this host alone.
    node: NodePlace | None = None

    def client_timeout(self) -> float:
        return self.start_timeout_s + 90.0


@dataclasses.dataclass(kw_only=True)
class Kill(Command):
    run_id: str | None = None  # None: the alive run
    timeout_s: float = 60.0  # SIGTERM -> SIGKILL
    drain_timeout_s: float = 120.0  # waiting for GPU memory to be released
    # A named run that has already ended is an answer (`Killed.not_running` says how it
    # ended), not an error: one host's part of a job may end before its kill arrives.
    ended_ok: bool = False

    def client_timeout(self) -> float:
        return self.timeout_s + self.drain_timeout_s + 30.0


@dataclasses.dataclass(kw_only=True)
class Restart(Kill):
    start_timeout_s: float = 30.0
    # False: continue from the run's newest good checkpoint (trainer/contract/checkpoints.py)
    # in a new run dir; True: the same config from step 0.
    fresh: bool = False
    # One host of a job over several: the new run's id and place (Launch.node). Node 0
    # resumes as above; another node launches the run's config fresh (no --resume): it gets
    # the position and the drafter from node 0 over torch.distributed.
    node: NodePlace | None = None
    # The overrides to launch with instead of the parent's (launch.json's): the operator
    # dropped or edited one (a run that died before it started). None: the parent's.
    overrides: list[str] | None = None
    # > 0: continue the run's final checkpoint for this many more steps (train.max_steps
    # raised by it, the data position carried on); the LR holds the schedule's final value
    # unless `new_schedule` (warmup, then cosine over the new steps).
    more_steps: int = 0
    new_schedule: bool = False
    # `restart --deploy`: the code sha256 of a release deployed without switching `current`
    # (Deploy.make_current False). The agent import-checks it before anything is stopped
    # (refused, the run left alone, when it does not import), then makes it current and
    # launches from it. None: the current release.
    release: str | None = None

    def client_timeout(self) -> float:
        # A restart also waits for the new run's first heartbeat (and a release's check).
        check = RELEASE_CHECK_S if self.release is not None else 0.0
        return super().client_timeout() + self.start_timeout_s + 120.0 + check


@dataclasses.dataclass(kw_only=True)
class DumpStacks(Command):
    run_id: str | None = None
    pyspy: bool = True
    timeout_s: float = 5.0  # for the trainer to write its dump

    def client_timeout(self) -> float:
        return self.timeout_s + 55.0  # py-spy may take a while on a busy process


# What a row of the thread/process table may send to one process of the run's group.
PROCESS_SIGNALS = ("SIGTERM", "SIGKILL", "SIGUSR2")


@dataclasses.dataclass(kw_only=True)
class SignalProcess(Command):
    """One signal to one process of the run's proven group, named by pid and the start time
    its procs sample reported: the agent refuses it unless the run is proven
    (identity.prove) and that pid still lives, started then, in the run's group."""

    run_id: str | None = None  # None: the followed run
    pid: int
    start: int
    signal: str  # one of PROCESS_SIGNALS

    def client_timeout(self) -> float:
        return 15.0


@dataclasses.dataclass(kw_only=True)
class ClearCompileCache(Command):
    def client_timeout(self) -> float:
        return 120.0


@dataclasses.dataclass(kw_only=True)
class Deploy(Command):
    tar_b64: str
    sha256: str
    # False: unpack and check the release only; `current` (what launches and restarts use)
    # stays where it is until a `Restart.release` makes it current (`restart --deploy`).
    make_current: bool = True

    def client_timeout(self) -> float:
        return 120.0


# Portable compile-cache artifacts (trainer/runtime/compile/artifacts.py) move in chunks: one line
# carries at most MAX_LINE_BYTES, and a blob can be larger.
ARTIFACT_CHUNK = 512 << 10  # raw bytes per chunk: its base64 stays under typed.MAX_STR


@dataclasses.dataclass(kw_only=True)
class PullArtifacts(Command):
    """One chunk of a GPU run's saved artifact (`<compile cache>/artifacts/NAME`); without a
    name, the list of them (name, size, sha256)."""

    name: str | None = None
    offset: int = 0


@dataclasses.dataclass(kw_only=True)
class PushArtifacts(Command):
    """One chunk of an artifact for `<remote dir>/compile-artifacts/NAME`: written to a part
    file at `offset`, moved into place once `size` bytes are there and hash to `sha256`."""

    name: str
    offset: int
    size: int
    sha256: str
    chunk_b64: str


@dataclasses.dataclass(kw_only=True)
class ExportDrafter(Command):
    """The run's drafter as SpecForge and SGLang load it, into `<remote dir>/exports/`."""

    run_id: str | None = None  # None: the alive run, else the latest
    step: int | None = None  # None: the newest good checkpoint
    dtype: str = "bfloat16"
    timeout_s: float = 900.0  # a large drafter's weights are gigabytes

    def client_timeout(self) -> float:
        return self.timeout_s + 30.0


@dataclasses.dataclass(kw_only=True)
class ReadFile(Command):
    run_id: str | None = None  # None: the followed run
    name: str
    tail_bytes: int = 1 << 20
    # A page by byte range instead of the tail: the complete lines of [start, end), at most
    # tail_bytes of them (the ones nearest `end` when only `end` is given, else nearest
    # `start`). The answer adds `start` (its first line's offset), `end` and `size`.
    start: int | None = None
    end: int | None = None
    # Paging back through a file longer than one answer (a replay's telemetry.jsonl): the
    # `tail_bytes` before byte `before` (None: the file's end); `lines`: only the whole lines
    # that start in that range. The answer's `start` (where its text begins) is the next
    # page's `before`; its `size` is the file's, to see a rewrite between pages.
    before: int | None = None
    lines: bool = False


COMMANDS: dict[str, type[Command]] = {
    "ping": Ping,
    "follow": FollowRun,
    "list_runs": ListRuns,
    "launch": Launch,
    "kill": Kill,
    "restart": Restart,
    "dump_stacks": DumpStacks,
    "clear_compile_cache": ClearCompileCache,
    "deploy": Deploy,
    "read_file": ReadFile,
    "pull_artifacts": PullArtifacts,
    "push_artifacts": PushArtifacts,
    "export": ExportDrafter,
    "signal_process": SignalProcess,
}
COMMAND_NAMES: dict[type, str] = {cls: name for name, cls in COMMANDS.items()}
# Answered inline by the agent's loop; the others run on a thread of their own so that a
# kill that waits a minute never stalls the stream.
QUICK_COMMANDS = ("ping", "follow", "list_runs", "read_file")


def decode_command(data: Any) -> Command | Unreadable:
    """A command from parsed JSON, or why it is not one."""
    return _decode_tagged(data, "cmd", COMMANDS, "command")

"""heartbeat.json: what the trainer is doing right now, replaced atomically every <= 2 s.

Written by the trainer's heartbeat thread (trainer/reporting/heartbeat.py) from these records, read
by the agent and the monitor through `parse_heartbeat`/`read_heartbeat`. `now` (written by the
heartbeat thread) and `last_step_at` (written by the training loop) are separate on purpose:
a fresh `now` with an old `last_step_at` is a stuck loop, not a dead process.

Schema history (ARCHITECTURE.md, "Versioning"):
  1  the first contract (commit c119aa7 and before).
  2  `stopped` is a final phase of its own (schema 1 said `finished` for a stopped run);
     `target_load` (the span of the weight load that overlaps compiling), `last_checkpoint`,
     `proc_start` (the trainer's start time in clock ticks, /proc/PID/stat field 22: with the
     pid it names the process, whatever reuses the pid later).
     Later under schema 2 (optional, so no bump: older readers ignore it): `preflight`,
     the fast-kernel preflight (trainer/contract/environment.py), and `data`
     (how the data loaded: tokenization cache hit or miss, the load's time, lines, samples,
     tokens; packing and the padding share of recent batches); `ThreadInfo.stages_ms`,
     where each pipeline thread's loop spends its time (`STAGE_*`); compile progress
     (`CompileInfo.current`, `expected_graphs`, `last_s`); `eval`, held-out acceptance
     length during training (trainer/contract/evaluation.py); `failed_rank`, in a
     processes-mode job (runtime.mode = "processes") the rank found failed first, each
     rank's own state in heartbeat-rank{R}.json (trainer/contract/ranks.py); `graphs`, per
     place the trainer captures CUDA graphs, whether they work (trainer/contract/graphs.py);
     `checkpoints`, the forecast size of a checkpoint, how often and how many are kept, and
     the newest save that failed (trainer/contract/checkpoints.py `CheckpointPlan`);
     `queues.routing`, runtime.routing ("fixed" when absent): under "shared" `queues` holds
     one q_pre and one q_hs, each fed to every target or drafter.
     `ranks`, in the writer's heartbeat of a processes-mode job over several hosts, the
     ranks of the other hosts as they last reached it (trainer/contract/ranks.py
     `relayed_ranks` reads them).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from trainer.contract.checkpoints import CheckpointPlan
from trainer.contract.environment import Preflight
from trainer.contract.evaluation import EvalInfo
from trainer.contract.graphs import GraphInfo
from trainer.contract.phases import (
    FINAL_PHASES,
    LOADING_TARGET,
    PHASES,
    TARGET_WAIT,
    PhaseVisit,
    current_visit,
    phase_spans,
)
from trainer.contract.typed import Invalid, Unreadable, decode, encode, parse_json, read_bounded

SCHEMA_VERSION = 2
OLDEST_SCHEMA = 1  # the oldest heartbeat this reader understands
MAX_HEARTBEAT_BYTES = 4 << 20  # a heartbeat is a few KB; anything this big is not one

# Thread roles, and the states the pipeline writes while it blocks on a queue
# (trainer/runtime/pipeline.py writes them, diagnosis reads them: one spelling).
# "receiver": a processes-mode drafter rank's thread that takes the targets' features in.
ROLES = ("main", "prefetch", "target", "drafter", "heartbeat", "probe", "receiver")
WAIT_PRE_FULL = "waiting: q_pre full"
WAIT_PRE_EMPTY = "waiting: q_pre empty"
WAIT_HS_EMPTY = "waiting: q_hs empty"
WAIT_HS_FULL = "waiting: q_hs full"
WAIT_REPLICAS = "waiting for replicas"
SAVING_CHECKPOINT = "checkpoint"  # the thread that writes a checkpoint, while it does

# The stages of a pipeline thread's loop, timed per iteration (ThreadInfo.stages_ms, moving
# medians in ms; trainer/reporting/stages.py). A name that starts with "wait" is time the thread (on
# a GPU: its stream) spent with nothing to do; `host` is a GPU stream waiting for Python.
STAGE_BUILD = "build batch"  # prefetch: collate, anchors, pin
STAGE_WAIT_PRE = "wait q_pre"  # prefetch: q_pre full; target: q_pre empty
STAGE_FORWARD = "forward"  # target: the frozen target's features; drafter: its forward
STAGE_TRANSFER = "transfer"  # target: features and blocks to the drafter's device
STAGE_MASK = "mask"  # target: the drafter's attention mask
STAGE_WAIT_HS = "wait q_hs"  # target: q_hs full; drafter: q_hs empty (features not there)
STAGE_BACKWARD = "backward"
STAGE_WAIT_REPLICAS = "wait replicas"  # drafter: the step's barrier
STAGE_OPTIMIZER = "optimizer"  # replica 0: gradient average, clip, AdamW, broadcast
STAGE_CHECKPOINT = "checkpoint"  # the copy to host memory (the write has its own thread)
STAGE_HOST = "host"


def is_wait(stage: str) -> bool:
    return stage.startswith("wait") or stage == STAGE_HOST


# Each role's loop in the order it runs (JSON sorts keys: views put them back in this order).
ROLE_STAGES = {
    "prefetch": (STAGE_BUILD, STAGE_WAIT_PRE),
    "target": (STAGE_WAIT_PRE, STAGE_FORWARD, STAGE_TRANSFER, STAGE_MASK, STAGE_WAIT_HS),
    "drafter": (
        STAGE_WAIT_HS,
        STAGE_FORWARD,
        STAGE_BACKWARD,
        STAGE_WAIT_REPLICAS,
        STAGE_OPTIMIZER,
        STAGE_CHECKPOINT,
    ),
}


def ordered_stages(role: str, stages_ms: dict[str, float]) -> list[tuple[str, float]]:
    """(stage, ms) in the role's loop order; `host` and names this reader does not know (a
    newer trainer) after them."""
    order = (*ROLE_STAGES.get(role, ()), STAGE_HOST)
    rank = {name: i for i, name in enumerate(order)}
    return sorted(stages_ms.items(), key=lambda kv: (rank.get(kv[0], len(rank)), kv[0]))


@dataclasses.dataclass
class PhaseProgress:
    done: int = 0
    total: int | None = None
    unit: str = ""


@dataclasses.dataclass
class QueueDepth:
    depth: int
    capacity: int


@dataclasses.dataclass
class Queues:
    """fixed routing: one q_pre per target, one q_hs per drafter (its T private queues
    summed). shared: one of each, which every target and every drafter takes from."""

    q_pre: list[QueueDepth] = dataclasses.field(default_factory=list)
    q_hs: list[QueueDepth] = dataclasses.field(default_factory=list)
    # runtime.routing (optional: a heartbeat without it is of a trainer that had only "fixed")
    routing: str = "fixed"

    @property
    def shared(self) -> bool:
        return self.routing == "shared"


@dataclasses.dataclass
class ThreadInfo:
    name: str
    role: str
    device: str
    state: str
    since: float  # unix time the thread entered `state`
    cpu_pct: float = 0.0
    ident: int = 0  # threading.get_ident(): faulthandler's "Thread 0x…" (0: not recorded)
    # {stage: median ms per iteration of the thread's loop}, in loop order; empty: not timed
    # (not a pipeline thread, no iteration done yet, or an older trainer).
    stages_ms: dict[str, float] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass
class DeviceMemory:
    """Bytes; a CPU device reports the process RSS in all three sizes."""

    allocated: int = 0
    reserved: int = 0
    peak: int = 0
    alloc_retries: int = 0


@dataclasses.dataclass
class DeviceId:
    """Matches a torch device to NVML's physical GPU whatever CUDA_VISIBLE_DEVICES did."""

    uuid: str | None = None
    name: str = ""


@dataclasses.dataclass
class CompileInfo:
    graphs: int = 0
    recompiles: int = 0  # graphs compiled after warm-up
    warmup_s: float | None = None
    cache_dir: str = ""
    cache_hits: int | None = None  # Inductor and AOTAutograd on-disk caches, after warm-up
    cache_misses: int | None = None  # misses = kernels generated
    cache_bypasses: int | None = None
    breakdown: dict[str, float] = dataclasses.field(default_factory=dict)  # slowest stages, s
    last_recompile: str | None = None  # which function recompiled, and the guard that failed
    # While compiling (the warm-up): the graph being compiled now ("graph 4: backward of
    # 1/0, bucket 4096 on cuda:0"), since when; the graphs done (forward and backward
    # compiles, which phase_progress counts too); what the same graphs took the last time
    # (the same code, shapes and devices, from the compile cache's history) and whether that
    # compile cache was empty then ("cold") or not ("warm").
    current: str | None = None
    current_since: float | None = None
    done: int = 0
    expected: int | None = None  # None: never compiled before with this cache
    last_s: float | None = None
    last_cache: str | None = None


@dataclasses.dataclass
class GilProbe:
    """How late a thread that sleeps `probe_sleep_ms` wakes up: GIL pressure."""

    probe_sleep_ms: float = 0.0
    p50_ms: float = 0.0
    p99_ms: float = 0.0
    samples: int = 0


@dataclasses.dataclass
class WandbInfo:
    mode: str = "disabled"  # offline | online | disabled | absent (not installed)
    id: str | None = None
    url: str | None = None


@dataclasses.dataclass
class ErrorInfo:
    thread: str
    message: str
    traceback: str = ""


@dataclasses.dataclass
class Span:
    started_at: float
    ended_at: float | None = None  # None: still going

    def seconds(self, now: float) -> float:
        return max(0.0, (self.ended_at if self.ended_at is not None else now) - self.started_at)


@dataclasses.dataclass
class CheckpointInfo:
    step: int
    path: str  # relative to the run dir
    at: float


@dataclasses.dataclass
class DataInfo:
    """How the training data was loaded (trainer/data/tokenized.py) and what a batch is made of."""

    cache: str = ""  # hit | miss | rebuilt (a bad entry was replaced) | off
    seconds: float = 0.0  # reading and tokenizing, or reading the cache
    lines: int = 0
    samples: int = 0
    skipped: int = 0  # unusable lines
    truncated: int = 0  # samples cut to the largest bucket
    tokens: int = 0
    workers: int = 0  # processes that tokenized; 0 on a cache hit
    entry: str = ""  # the cache file
    packing: bool = False  # several documents per row (trainer/data/packing.py)
    truncated_tokens: int = 0  # the tokens the truncation removed
    # Of the batch positions of the recent steps, the share that were padding; None before
    # the second step.
    padding: float | None = None


@dataclasses.dataclass
class Heartbeat:
    schema: int
    run_id: str
    pid: int
    host: str
    now: float  # unix time this heartbeat was written, by the heartbeat thread
    phase: str
    pgid: int = 0  # 0: not recorded (use pid)
    started_at: float = 0.0
    phase_started_at: float = 0.0
    phase_progress: PhaseProgress | None = None
    phase_history: list[PhaseVisit] = dataclasses.field(default_factory=list)  # oldest first
    step: int = 0  # optimizer steps done
    total_steps: int = 0
    last_step_at: float | None = None  # written by the training loop
    tok_s: float = 0.0  # over the last ~10 s of steps
    tokens: int = 0
    epoch: float = 0.0
    queues: Queues = dataclasses.field(default_factory=Queues)
    threads: list[ThreadInfo] = dataclasses.field(default_factory=list)
    memory: dict[str, DeviceMemory] = dataclasses.field(default_factory=dict)
    devices: dict[str, DeviceId] = dataclasses.field(default_factory=dict)
    compile: CompileInfo = dataclasses.field(default_factory=CompileInfo)
    code_sha256: str = ""
    gil: GilProbe = dataclasses.field(default_factory=GilProbe)
    wandb: WandbInfo | None = None  # None: a trainer that does not report wandb
    error: ErrorInfo | None = None
    exit_code: int | None = None  # set once the process decided how it will exit
    # schema 2
    target_load: Span | None = None
    last_checkpoint: CheckpointInfo | None = None
    proc_start: int | None = None
    data: DataInfo | None = None  # None: an older trainer, or before the data has loaded
    preflight: Preflight | None = None  # None: not run yet, or an older trainer
    eval: EvalInfo | None = None  # None: the run evaluates nothing, or an older trainer
    # A processes-mode job that failed: the rank found failed first (its heartbeat-rank{R}.json
    # says why); None: nothing failed, a threads-mode run, or an older trainer.
    failed_rank: int | None = None
    # {place: its CUDA graphs} ("eval": the held-out eval's decode step, in use or why not);
    # empty: the run has no such place (it evaluates nothing), or an older trainer.
    graphs: dict[str, GraphInfo] = dataclasses.field(default_factory=dict)
    # What the checkpoints will take and the newest that failed; None: before the drafter is
    # built, or an older trainer.
    checkpoints: CheckpointPlan | None = None
    # A processes-mode job over several hosts, the writer's heartbeat only: each rank of the
    # other hosts as it last reached the writer (trainer/distributed/rank_relay.py),
    # {"R": {"received": the writer's clock, "beat": its heartbeat-rank R}}. Any: each entry
    # is checked on its own (ranks.relayed_ranks), so one bad rank spoils only itself.
    # Empty: one host, any other process, or an older trainer.
    ranks: dict[str, Any] = dataclasses.field(default_factory=dict)

    @property
    def process_group(self) -> int:
        return self.pgid or self.pid

    @property
    def final(self) -> bool:
        return self.phase in FINAL_PHASES

    @property
    def newer_schema(self) -> bool:
        """Written by a newer trainer: some fields may be missing from this view."""
        return self.schema > SCHEMA_VERSION

    @property
    def visit(self) -> str | None:
        """The visit key of the current phase ("loading_target#2" while waiting for weights)."""
        return current_visit(self.phase_history)

    def threads_of(self, role: str) -> list[ThreadInfo]:
        return [t for t in self.threads if t.role == role]

    def in_state_s(self, thread: ThreadInfo) -> float:
        return max(0.0, self.now - thread.since)

    def role_peaks(self) -> dict[str, int]:
        """{role: the largest peak bytes over that role's devices}: what a healthy run of
        this shape needs per role (the runs list carries it; `expected memory` reads it)."""
        peaks = {dev: mem.peak or mem.reserved for dev, mem in self.memory.items()}
        out: dict[str, int] = {}
        for t in self.threads:
            if t.role in ("target", "drafter") and t.device in peaks:
                out[t.role] = max(out.get(t.role, 0), peaks[t.device])
        return out

    def target_load_s(self) -> float | None:
        """How long the target's weights took to load, start to end; None while loading or
        when unknown. Schema 1 has no `target_load`: its span runs from the first
        loading_target visit to the end of the wait, when there was a wait."""
        if self.target_load is not None:
            if self.target_load.ended_at is None:
                return None
            return self.target_load.seconds(self.now)
        spans = phase_spans(self.phase_history)
        first = next((s for s in spans if s.key == LOADING_TARGET), None)
        wait = next((s for s in spans if s.key == TARGET_WAIT), None)
        if first is None or wait is None or wait.ended_at is None:
            return None
        return wait.ended_at - first.started_at

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = encode(self)
        return data


def upgrade_note(hb: Heartbeat) -> str | None:
    """What a view says about a heartbeat from a newer trainer."""
    if not hb.newer_schema:
        return None
    return f"heartbeat schema {hb.schema}: upgrade dflash-tui (this one reads {SCHEMA_VERSION})"


def parse_heartbeat(data: Any, what: str = "heartbeat.json") -> Heartbeat | Unreadable:
    """A heartbeat from parsed JSON, or why it is not one."""
    if not isinstance(data, dict):
        return Unreadable(what, f"not a JSON object ({type(data).__name__})")
    schema = data.get("schema")
    if isinstance(schema, bool) or not isinstance(schema, int) or schema < OLDEST_SCHEMA:
        return Unreadable(what, f"schema {schema!r}: not a dflash heartbeat this reader knows")
    newer = schema > SCHEMA_VERSION
    try:
        hb = decode(Heartbeat, data, lenient=newer)
    except Invalid as e:
        note = f" (schema {schema}: upgrade dflash-tui)" if newer else ""
        return Unreadable(what, f"{e}{note}")
    if hb.phase not in PHASES and not newer:
        return Unreadable(what, f"unknown phase {hb.phase!r}")
    if hb.checkpoints is not None and (why := hb.checkpoints.invalid()) is not None:
        return Unreadable(what, why)
    return hb


def parse_heartbeat_text(raw: bytes | str, what: str = "heartbeat.json") -> Heartbeat | Unreadable:
    data = parse_json(raw, what, MAX_HEARTBEAT_BYTES)
    return data if isinstance(data, Unreadable) else parse_heartbeat(data, what)


def read_heartbeat(path: str | Path) -> Heartbeat | Unreadable | None:
    """The heartbeat in `path`; None when there is none (yet)."""
    raw = read_bounded(path, MAX_HEARTBEAT_BYTES)
    return (
        raw
        if raw is None or isinstance(raw, Unreadable)
        else parse_heartbeat_text(raw, Path(path).name)
    )

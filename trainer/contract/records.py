"""The run dir's other files as records: launch.json, exit.json, metrics.jsonl rows, config.json.

Each has one validating reader that returns the record, `Unreadable` (torn, foreign, hostile)
or None (not there). exit.json has one writer, `write_exit`: the launcher wrapper and the
agent both call it, so every exit record has the same fields.

exit.json history: schema 2 added total_steps, checkpoint, oom; schema 3 added failed_rank
(a processes-mode job: the rank found failed first). Older files still read (the new
fields default to None).
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import secrets
from pathlib import Path
from typing import Any, TypeVar

from trainer.contract.evaluation import EvalResult
from trainer.contract.heartbeat import DeviceMemory
from trainer.contract.nodes import NodePlace
from trainer.contract.steplines import StepLine, step_line
from trainer.contract.typed import Invalid, Unreadable, decode, encode, parse_json, read_bounded

# File names of a run dir (RUN_ROOT/<run_id>/).
CONFIG = "config.json"  # the resolved config, written first by the trainer
LAUNCH = "launch.json"  # written by the agent when it launches a run (absent for a run by hand)
LAUNCH_LOG = "launch.log"  # the launcher wrapper's own output
LAUNCH_CONFIG = "launch-config.toml"  # the config text a launch shipped (restart reuses it)
TRAIN_LOG = "train.log"
METRICS = "metrics.jsonl"
HEARTBEAT = "heartbeat.json"
TELEMETRY = "telemetry.jsonl"  # heartbeat history (trainer/contract/telemetry.py)
EXIT = "exit.json"  # written by the launcher wrapper when the trainer exits
CHECKPOINTS = "checkpoints"
# In the run root, not a run dir: flock-ed by every live run for its whole life (the agent's
# launch takes it and hands it down; `python -m trainer` started by hand takes it itself),
# and which run holds it. A signal goes only to a process proven to hold it (agent/identity).
LAUNCH_LOCK = ".launch.lock"
ACTIVE = ".active.json"  # {run_id, wrapper_pid}: the run holding the lock
RUN_FILES = (CONFIG, LAUNCH)  # a folder with either is a run (a run that died at start has
# only launch.json, launch.log and exit.json)

MAX_RECORD_BYTES = 4 << 20

R = TypeVar("R")


@dataclasses.dataclass
class LaunchRecord:
    run_id: str
    argv: list[str] = dataclasses.field(default_factory=list)
    overrides: list[str] = dataclasses.field(default_factory=list)
    name: str = "run"
    python: str = ""
    release: str = ""
    launched_at: float = 0.0
    agent_pid: int | None = None
    # Added by the wrapper once the trainer started:
    pid: int | None = None
    pgid: int | None = None
    wrapper_pid: int | None = None
    started_at: float | None = None
    proc_start: int | None = None  # the trainer's start time, clock ticks (/proc/PID/stat 22)
    # A restart that resumes: the run it continues and the checkpoint (relative to that run's
    # dir) it starts from; None for a fresh start.
    resumed_from: str | None = None
    checkpoint: str | None = None
    # One node of a job over several hosts (`dflash-tui launch GROUP`): its place, as put in
    # the trainer's environment; None for a run of one host (and from older agents).
    node: NodePlace | None = None


def override_key(override: str) -> str:
    """`train.lr=1e-4` -> `train.lr` (the trainer's own split: the first `=`)."""
    return override.split("=", 1)[0].strip()


def named_overrides(overrides: list[str], text: str) -> list[int]:
    """The indexes of the overrides whose key `text` (a run's error line) names as a whole
    key: `config: train.lr = abc: …` names `train.lr`, never `train.lr_min`'s."""
    hits = []
    for i, o in enumerate(overrides):
        key = override_key(o)
        if key and re.search(rf"(?<![\w.]){re.escape(key)}(?![\w.])", text):
            hits.append(i)
    return hits


@dataclasses.dataclass
class OomCheck:
    """After a SIGKILL, what the launch wrapper found of the kernel's OOM killer
    (dflash_tui/agent/oom.py), read as the trainer died: its memory cgroup's count, the
    kernel log's lines. Said to the operator as found, including what could not be read."""

    events: str = ""  # the cgroup file: v2 memory.events, v1 memory.oom_control; "": none found
    oom_kills: int | None = None  # its oom_kill count's rise since launch; None: not read
    events_error: str = ""  # why the count was not read
    kernel: list[str] = dataclasses.field(default_factory=list)  # log lines of this pid's kill
    kernel_error: str = ""  # why the kernel log was not read ("": it was)

    def oom_killed(self) -> bool:
        return (self.oom_kills or 0) > 0 or bool(self.kernel)


@dataclasses.dataclass
class FailedRank:
    """A processes-mode job's rank found failed first, as its heartbeat-rank{R}.json said."""

    rank: int
    role: str = ""  # target | drafter
    index: int = 0  # the role's index
    host: str = ""
    error: str = ""  # its own error message ("": it ended without one, e.g. SIGKILL)

    def describe(self) -> str:
        """`rank 2 (drafter 0) on HOST: RuntimeError: …`"""
        where = f" on {self.host}" if self.host else ""
        what = f" ({self.role} {self.index})" if self.role else ""
        return f"rank {self.rank}{what}{where}" + (f": {self.error}" if self.error else "")


@dataclasses.dataclass
class ExitRecord:
    run_id: str
    exit_code: int | None = None  # None when a signal ended it
    signal: str | None = None  # "SIGKILL", …
    error: str | None = None  # the trainer's error message, or why it could not start
    started_at: float | None = None
    ended_at: float | None = None
    final_phase: str | None = None  # the last heartbeat's phase
    step: int | None = None  # the last heartbeat's step
    total_steps: int | None = None  # … of how many (schema 2)
    checkpoint: str | None = None  # the last checkpoint, relative to the run dir (schema 2)
    oom: OomCheck | None = None  # after a SIGKILL (schema 2; None: not looked, an older wrapper)
    failed_rank: FailedRank | None = None  # schema 3; None: none failed, threads mode, older

    def describe(self) -> str:
        """How the process ended, in a few words (the run's outcome says more)."""
        if self.failed_rank is not None:
            return self.failed_rank.describe()
        if self.error:
            return self.error
        if self.signal:
            return f"killed by {self.signal}"
        return f"exit code {self.exit_code}"


@dataclasses.dataclass
class MetricsRow:
    """One line of metrics.jsonl: every step-line field at full precision, and more."""

    step: int
    time: float = 0.0  # unix time it was logged
    elapsed_s: float = 0.0
    loss: float = float("nan")
    acc: float = 0.0
    streak: float = 0.0
    lr: float = 0.0
    noise: float = 0.0
    tgt_bps: float = 0.0
    dft_bps: float = 0.0
    tok_s: float = 0.0
    q_pre: list[int] = dataclasses.field(default_factory=list)
    q_hs: list[int] = dataclasses.field(default_factory=list)
    epoch: float = 0.0
    eta_s: float | None = None
    topk: float = 0.0
    tokens: int = 0
    memory: dict[str, DeviceMemory] = dataclasses.field(default_factory=dict)
    # Of the batch positions since the last row, the share that were padding (tok_s counts
    # real tokens only); None: an older trainer.
    padding: float | None = None
    # {thread name: {stage: median ms per iteration}} at the row's time (ThreadInfo.stages_ms)
    stages_ms: dict[str, dict[str, float]] = dataclasses.field(default_factory=dict)
    # The held-out eval that finished since the row before (trainer/contract/evaluation.py).
    eval: EvalResult | None = None
    # The largest total gradient norm before clipping of the optimizer steps since the row
    # before; None: an older trainer. NaN/inf are kept (a poisoned step's norm is NaN: the
    # rules skip what is not finite); a negative one, which no norm is, is dropped to None.
    grad_norm: float | None = None

    def __post_init__(self) -> None:
        if self.grad_norm is not None and self.grad_norm < 0:
            self.grad_norm = None

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = encode(self)
        return data

    def step_line(self) -> StepLine:
        """The human line for this row (rounded as printed)."""
        return step_line(
            self.elapsed_s, self.step, self.loss, self.acc, self.streak, self.lr, self.noise,
            self.tgt_bps, self.dft_bps, self.tok_s, self.q_pre, self.q_hs, self.epoch,
            self.eta_s,
        )  # fmt: skip


def _load(raw: bytes | str, cls: type[R], what: str) -> R | Unreadable:
    data = parse_json(raw, what, MAX_RECORD_BYTES)
    if isinstance(data, Unreadable):
        return data
    try:
        return decode(cls, data)
    except Invalid as e:
        return Unreadable(what, str(e))


def _read(path: str | Path, cls: type[R]) -> R | Unreadable | None:
    raw = read_bounded(path, MAX_RECORD_BYTES)
    return raw if raw is None or isinstance(raw, Unreadable) else _load(raw, cls, Path(path).name)


def read_launch(run_dir: str | Path) -> LaunchRecord | Unreadable | None:
    return _read(Path(run_dir) / LAUNCH, LaunchRecord)


def read_exit(run_dir: str | Path) -> ExitRecord | Unreadable | None:
    return _read(Path(run_dir) / EXIT, ExitRecord)


def parse_launch(text: str) -> LaunchRecord | Unreadable:
    """launch.json's text as another reads it (the monitor, through the agent's read_file)."""
    return _load(text, LaunchRecord, LAUNCH)


def parse_metrics_line(text: str) -> MetricsRow | Unreadable:
    return _load(text, MetricsRow, METRICS)


def read_config(run_dir: str | Path) -> dict[str, Any] | Unreadable | None:
    """config.json as a dict of sections (its keys are the trainer's Config; `comparable`
    reads the ones it needs through `signature_of`)."""
    raw = read_bounded(Path(run_dir) / CONFIG, MAX_RECORD_BYTES)
    if raw is None or isinstance(raw, Unreadable):
        return raw
    data = parse_json(raw, CONFIG, MAX_RECORD_BYTES)
    if isinstance(data, Unreadable):
        return data
    if not isinstance(data, dict):
        return Unreadable(CONFIG, f"not a JSON object ({type(data).__name__})")
    return data


def write_json_atomic(path: str | Path, obj: Any) -> None:
    """Temp file + rename: a reader never sees half a file."""
    tmp = f"{path}.{secrets.token_hex(4)}.tmp"
    with open(tmp, "w") as f:
        json.dump(obj, f, indent=1, sort_keys=True)
        f.write("\n")
    os.replace(tmp, path)


def write_exit(run_dir: str | Path, record: ExitRecord) -> None:
    """The one writer of exit.json."""
    write_json_atomic(Path(run_dir) / EXIT, encode(record))


def write_launch(run_dir: str | Path, record: LaunchRecord) -> None:
    write_json_atomic(Path(run_dir) / LAUNCH, encode(record))

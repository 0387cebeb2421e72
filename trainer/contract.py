"""The run dir contract between trainer and monitor. Standard library only.

The monitor (dflash_tui) imports this module and nothing else from `trainer`, so that it
never needs torch. Everything a reader must agree on with the writer lives here: the
heartbeat schema, the phases, the step-line grammar, and the code hash.

Heartbeat (`heartbeat.json`, schema version 1), replaced atomically every <= 2 s by the
trainer's heartbeat thread:

    schema            int, HEARTBEAT_SCHEMA
    run_id            str, the run dir's name
    pid, pgid         int
    host              str
    now               float, unix time this heartbeat was written (by the heartbeat thread)
    started_at        float, unix time the process started
    phase             one of PHASES
    phase_started_at  float
    phase_progress    {"done": int, "total": int, "unit": str} or null
    phase_history     [{"phase": str, "started_at": float}], oldest first
    step              int, optimizer steps done
    total_steps       int
    last_step_at      float or null, unix time of the last optimizer step (written by the loop;
                      a fresh `now` with an old `last_step_at` means a stuck loop, not a dead
                      process)
    tok_s             float, tokens/s over the last ~10 s of steps
    tokens            int, real tokens trained on
    epoch             float, epochs done (fractional)
    queues            {"q_pre": [{"depth": int, "capacity": int}, ...] one per target,
                       "q_hs": [{"depth": int, "capacity": int}, ...] one per drafter}
    threads           [{"name", "role", "device", "state", "since": float, "cpu_pct": float}]
                      role in ROLES; `since` = unix time the thread entered `state`
    memory            {device: {"allocated", "reserved", "peak", "alloc_retries"}} bytes;
                      a CPU device reports the process RSS
    devices           {device: {"uuid": "GPU-…" | null, "name": str}}: matches a torch device
                      to NVML's physical GPU whatever CUDA_VISIBLE_DEVICES renumbered
    compile           {"graphs": int, "recompiles": int (graphs compiled after warm-up),
                       "warmup_s": float or null, "cache_dir": str, and after warm-up
                       "cache_hits", "cache_misses", "cache_bypasses": int (Inductor and
                       AOTAutograd on-disk caches; misses = kernels generated) and
                       "breakdown": {stage: seconds}, the slowest compile stages;
                       "last_recompile": str, which function recompiled and the guard
                       that failed (set when a recompile happens)}
    code_sha256       str, `code_hash()` of the running trainer package
    gil               {"probe_sleep_ms": float, "p50_ms": float, "p99_ms": float,
                       "samples": int}: how late a thread that sleeps wakes up (GIL pressure)
    wandb             {"mode": str, "id": str|null, "url": str|null} or {"mode": "absent"}
    error             {"thread": str, "message": str, "traceback": str} or null
    exit_code         int or null, set once the process decided how it will exit
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path
from typing import Any

HEARTBEAT_SCHEMA = 1

PHASES = (
    "starting",
    "loading_target",
    "loading_data",
    "compiling",
    "warmup",
    "training",
    "checkpointing",
    "stopping",
    "finished",
    "crashed",
)
FINAL_PHASES = ("finished", "crashed")
ROLES = ("main", "prefetch", "target", "drafter", "heartbeat", "probe")

STEP_LINE = re.compile(
    r"^\[(?P<minutes>\d+)m\] step=(?P<step>\d+) loss=(?P<loss>[-\d.naif]+) "
    r"acc=(?P<acc>[\d.]+) streak=(?P<streak>[\d.]+) lr=(?P<lr>[-+\d.e]+) "
    r"noise=(?P<noise>[\d.]+) \| tgt=(?P<tgt_bps>[\d.]+)b/s dft=(?P<dft_bps>[\d.]+)b/s "
    r"\((?P<tok>[\d.]+)(?P<tok_unit>[KM]?)tok/s\) \| q_pre=\[(?P<q_pre>[\d, ]*)\] "
    r"q_hs=\[(?P<q_hs>[\d, ]*)\] \| epoch~(?P<epoch>[\d.]+) ETA=(?P<eta>\S+)$"
)
_UNIT = {"": 1.0, "K": 1e3, "M": 1e6}


def parse_step_line(line: str) -> dict[str, Any] | None:
    """Fields of one step line, or None when the line is something else."""
    m = STEP_LINE.match(line.rstrip("\n"))
    if m is None:
        return None
    g = m.groupdict()

    def ints(text: str) -> list[int]:
        return [int(x) for x in text.split(",") if x.strip()]

    return {
        "elapsed_min": int(g["minutes"]),
        "step": int(g["step"]),
        "loss": float(g["loss"]),
        "acc": float(g["acc"]),
        "streak": float(g["streak"]),
        "lr": float(g["lr"]),
        "noise": float(g["noise"]),
        "tgt_bps": float(g["tgt_bps"]),
        "dft_bps": float(g["dft_bps"]),
        "tok_s": float(g["tok"]) * _UNIT[g["tok_unit"]],
        "q_pre": ints(g["q_pre"]),
        "q_hs": ints(g["q_hs"]),
        "epoch": float(g["epoch"]),
        "eta": g["eta"],
    }


def code_hash(package_dir: str | Path) -> str:
    """sha256 over the package's *.py files: relative path and bytes, in path order.

    Deploy computes it over what it ships, the trainer over what it runs: equal hashes mean
    the running code is the deployed code.
    """
    root = Path(package_dir)
    h = hashlib.sha256()
    for path in sorted(p for p in root.rglob("*.py") if "__pycache__" not in p.parts):
        h.update(path.relative_to(root).as_posix().encode())
        h.update(b"\0")
        h.update(path.read_bytes())
        h.update(b"\0")
    return h.hexdigest()


class HeartbeatError(ValueError):
    pass


def read_heartbeat(path: str | Path) -> dict[str, Any] | None:
    """The heartbeat as a dict; None when the file does not exist (yet)."""
    try:
        text = Path(path).read_text()
    except FileNotFoundError:
        return None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise HeartbeatError(f"{path}: not JSON ({e})") from None
    if not isinstance(data, dict):
        raise HeartbeatError(f"{path}: not a JSON object")
    return check_heartbeat(data, str(path))


def check_heartbeat(data: dict[str, Any], where: str = "heartbeat") -> dict[str, Any]:
    version = data.get("schema")
    if version != HEARTBEAT_SCHEMA:
        raise HeartbeatError(f"{where}: schema {version!r}, this reader knows {HEARTBEAT_SCHEMA}")
    if data.get("phase") not in PHASES:
        raise HeartbeatError(f"{where}: unknown phase {data.get('phase')!r}")
    return data

"""heartbeat-rank{R}.json: one rank of a processes-mode job (runtime.mode = "processes").

Every rank of a job started by torchrun writes its own small heartbeat into the job's one
run dir, beside the job-level heartbeat.json that the lowest drafter rank writes
(trainer/distributed/layout.py). It says what that rank is (role, index, device, pid, host), where
it is (phase, step, the queues it knows) and, once it has failed, why: its error, and the rank it
found failed first (`failed_rank`: itself, or the peer whose loss ended it).

Schema history (ARCHITECTURE.md, "Versioning" — the same rules as the heartbeat's):
  1  the first rank heartbeat.
     Later under schema 1 (optional, so no bump: older readers ignore the keys, and files
     without them read as "not measured"): `tok_s` and `batches_s`, the rank's own rate, and
     `loop`/`stages_ms`, its loop thread's stage medians (trainer/reporting/stages.py): what the
     straggler and slow-link rules compare between ranks.

The writer's heartbeat.json of a job over several hosts carries the other hosts' rank
heartbeats too (`Heartbeat.ranks`, trainer/distributed/rank_relay.py), in their relay form
(`relay_form`: no traceback, no queues, a bounded error message): `relayed_ranks` reads
them, each with this module's own checks, as untrusted as a file.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
from pathlib import Path
from typing import Any

from trainer.contract.heartbeat import ErrorInfo, Queues
from trainer.contract.phases import FINAL_PHASES
from trainer.contract.typed import Invalid, Unreadable, decode, encode, parse_json, read_bounded

RANK_SCHEMA_VERSION = 1
OLDEST_RANK_SCHEMA = 1
MAX_RANK_HEARTBEAT_BYTES = 1 << 20  # a few hundred bytes; anything this big is not one
RANK_ROLES = ("target", "drafter")
RANK_HEARTBEAT_PREFIX = "heartbeat-rank"
# More ranks than this in one run dir is not a job's world but a hostile dir: readers take
# the first MAX_RANKS and leave the rest.
MAX_RANKS = 4096
MAX_STAGES = 32  # a loop has a handful of stages (heartbeat.ROLE_STAGES); more is not one
MAX_STAGE_NAME = 64
MAX_STAGE_MS = 1e9  # ~11 days for one iteration: past that the number is not a time
_RANK_HEARTBEAT_NAME = re.compile(re.escape(RANK_HEARTBEAT_PREFIX) + r"(\d{1,5})\.json")


def rank_heartbeat_name(rank: int) -> str:
    return f"{RANK_HEARTBEAT_PREFIX}{rank}.json"


def rank_of_heartbeat_name(name: str) -> int | None:
    """R of a `heartbeat-rank{R}.json` file name; None for any other name."""
    m = _RANK_HEARTBEAT_NAME.fullmatch(name)
    return int(m.group(1)) if m else None


@dataclasses.dataclass
class RankHeartbeat:
    schema: int
    run_id: str
    rank: int
    world_size: int
    role: str  # target | drafter
    index: int  # the role's index: target t, drafter replica r
    device: str
    pid: int
    host: str
    now: float  # unix time this file was written
    phase: str
    step: int = 0  # optimizer steps done (a target rank: the step of its last batch sent)
    # This rank's train.log and heartbeat are the run dir's own: the job's writer (train.log,
    # metrics, heartbeat.json, checkpoints) on node 0; on another host, that node's lead
    # (its run dir's train.log and heartbeat.json). Every other rank's are ranks/rank-R/.
    writer: bool = False
    queues: Queues = dataclasses.field(default_factory=Queues)
    error: ErrorInfo | None = None
    exit_code: int | None = None
    # The rank found failed first: this rank's own (an error of its own), or the peer whose
    # loss ended it (a lost connection, a timeout). None: nothing failed, or not known.
    failed_rank: int | None = None
    # The rank's own rate over its last ~10 s: the tokens of the batches it forwarded (a
    # target) or trained (a drafter) per second, and those batches per second. 0.0: none
    # yet, or an older trainer.
    tok_s: float = 0.0
    batches_s: float = 0.0
    # Its loop thread (`loop`: the target's or the drafter's thread, named as in its own
    # heartbeat) and that thread's stage medians, ms per iteration (ThreadInfo.stages_ms):
    # compute stages, and the `wait*` ones (heartbeat.is_wait) spent on queues, sends and
    # receives, and the drafters' gradient all-reduce. Empty: not timed yet, or older.
    loop: str = ""
    stages_ms: dict[str, float] = dataclasses.field(default_factory=dict)

    def invalid(self) -> str | None:
        """Why a well-typed rank heartbeat still cannot be a trainer's (a NaN or negative
        time or rate); None for a sound one. The reader refuses it as Unreadable."""
        for name, rate in (("tok_s", self.tok_s), ("batches_s", self.batches_s)):
            if not 0.0 <= rate < math.inf:  # NaN fails too
                return f"{name} {rate}: not a rate"
        if len(self.stages_ms) > MAX_STAGES:
            return f"{len(self.stages_ms)} stages (at most {MAX_STAGES})"
        for stage, ms in self.stages_ms.items():
            if len(stage) > MAX_STAGE_NAME:
                return f"a stage name of {len(stage)} characters"
            if not 0.0 <= ms <= MAX_STAGE_MS:
                return f"stage {stage[:MAX_STAGE_NAME]!r}: {ms} ms: not a time"
        return None

    @property
    def final(self) -> bool:
        return self.phase in FINAL_PHASES

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = encode(self)
        return data


def parse_rank_heartbeat(
    data: Any, what: str = "heartbeat-rank.json"
) -> RankHeartbeat | Unreadable:
    if not isinstance(data, dict):
        return Unreadable(what, f"not a JSON object ({type(data).__name__})")
    schema = data.get("schema")
    if isinstance(schema, bool) or not isinstance(schema, int) or schema < OLDEST_RANK_SCHEMA:
        return Unreadable(what, f"schema {schema!r}: not a dflash rank heartbeat this reader knows")
    newer = schema > RANK_SCHEMA_VERSION
    try:
        hb = decode(RankHeartbeat, data, lenient=newer)
    except Invalid as e:
        note = f" (schema {schema}: upgrade dflash-tui)" if newer else ""
        return Unreadable(what, f"{e}{note}")
    if hb.role not in RANK_ROLES and not newer:
        return Unreadable(what, f"unknown role {hb.role!r}")
    if (why := hb.invalid()) is not None:
        return Unreadable(what, why)
    return hb


def read_rank_heartbeat(run_dir: str | Path, rank: int) -> RankHeartbeat | Unreadable | None:
    """Rank `rank`'s heartbeat in `run_dir`; None when it has written none (yet)."""
    name = rank_heartbeat_name(rank)
    raw = read_bounded(Path(run_dir) / name, MAX_RANK_HEARTBEAT_BYTES)
    if raw is None or isinstance(raw, Unreadable):
        return raw
    data = parse_json(raw, name, MAX_RANK_HEARTBEAT_BYTES)
    return data if isinstance(data, Unreadable) else parse_rank_heartbeat(data, name)


# The relay form: what one rank's heartbeat may take on the wire and in heartbeat.json.
RELAY_MAX_BYTES = 4096 - 4  # a fixed 4 KiB message a beat, less its length prefix
RELAY_MAX_MESSAGE = 500  # characters of an error message (its traceback stays in the file)
_RANK_KEY = re.compile(r"\d{1,5}")


def relay_form(beat: dict[str, Any]) -> bytes | None:
    """A rank heartbeat's JSON made small enough to relay: without its queues (the writer's
    own heartbeat has the job's) and its error's traceback (the rank's own file keeps it),
    then without its stage times if still too big; None when even that does not fit."""
    small = {k: v for k, v in beat.items() if k != "queues"}
    if isinstance(small.get("error"), dict):
        error = small["error"]
        small["error"] = {
            **error,
            "traceback": "",
            "message": str(error.get("message", ""))[:RELAY_MAX_MESSAGE],
        }
    for drop in ((), ("stages_ms",)):
        text = json.dumps({k: v for k, v in small.items() if k not in drop}, separators=(",", ":"))
        raw = text.encode()
        if len(raw) <= RELAY_MAX_BYTES:
            return raw
    return None


def relayed_ranks(ranks: Any) -> dict[int, tuple[float, RankHeartbeat] | Unreadable]:
    """heartbeat.json's `ranks`, each entry checked alone: {R: (when it reached the writer,
    on the writer's clock; its heartbeat) | why it is unreadable}. At most MAX_RANKS."""
    out: dict[int, tuple[float, RankHeartbeat] | Unreadable] = {}
    if not isinstance(ranks, dict):
        return out
    for key, entry in list(ranks.items())[:MAX_RANKS]:
        if not isinstance(key, str) or not _RANK_KEY.fullmatch(key):
            continue  # not a rank's number: nothing to show it under
        rank, what = int(key), f"heartbeat.json ranks[{key}]"
        received = entry.get("received") if isinstance(entry, dict) else None
        if isinstance(received, bool) or not isinstance(received, int | float):
            out[rank] = Unreadable(what, "no time it was received")
            continue
        if not 0.0 < received < math.inf:
            out[rank] = Unreadable(what, f"received at {received}: not a time")
            continue
        beat = parse_rank_heartbeat(entry.get("beat"), what)
        if isinstance(beat, RankHeartbeat) and beat.rank != rank:
            beat = Unreadable(what, f"says it is rank {beat.rank}")
        out[rank] = beat if isinstance(beat, Unreadable) else (float(received), beat)
    return out

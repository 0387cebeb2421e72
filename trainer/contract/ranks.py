"""heartbeat-rank{R}.json: one rank of a processes-mode job (runtime.mode = "processes").

Every rank of a job started by torchrun writes its own small heartbeat into the job's one
run dir, beside the job-level heartbeat.json that the lowest drafter rank writes
(trainer/ranks.py). It says what that rank is (role, index, device, pid, host), where it
is (phase, step, the queues it knows) and, once it has failed, why: its error, and the rank
it found failed first (`failed_rank`: itself, or the peer whose loss ended it).

Schema history (ARCHITECTURE.md, "Versioning" — the same rules as the heartbeat's):
  1  the first rank heartbeat.
"""

from __future__ import annotations

import dataclasses
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
    return hb


def read_rank_heartbeat(run_dir: str | Path, rank: int) -> RankHeartbeat | Unreadable | None:
    """Rank `rank`'s heartbeat in `run_dir`; None when it has written none (yet)."""
    name = rank_heartbeat_name(rank)
    raw = read_bounded(Path(run_dir) / name, MAX_RANK_HEARTBEAT_BYTES)
    if raw is None or isinstance(raw, Unreadable):
        return raw
    data = parse_json(raw, name, MAX_RANK_HEARTBEAT_BYTES)
    return data if isinstance(data, Unreadable) else parse_rank_heartbeat(data, name)

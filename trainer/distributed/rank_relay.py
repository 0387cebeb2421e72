"""processes mode over several hosts: every rank's heartbeat in the writer's heartbeat.json.

Each rank writes heartbeat-rank{R}.json into its own host's run dir (trainer/contract/ranks.py),
so a host's monitor sees only that host's ranks. Here each rank of another node also sends
its rank heartbeat to the writer, which keeps the newest of each under heartbeat.json's
optional `ranks` (trainer/contract/heartbeat.py): `status` on the job's host shows every rank.

The wire is a gloo group of its own, never the features' or the gradients' one: a heartbeat
never waits behind a transfer or reorders one, and gloo moves host memory whatever the job's
backend. A message is one fixed MESSAGE-byte tensor, a 4-byte length and the beat's relay
form (ranks.relay_form: no traceback, no queues, a bounded size). Both ends are threads of
their own: a sender that holds only the newest beat (the heartbeat thread never blocks on
the link; a slow writer gets the newest beat, not a backlog), and on the writer a receiver
that takes a message from any rank and checks it with the contract's reader (the length,
the JSON, parse_rank_heartbeat, the rank it names is the rank that sent it) before keeping it.
"""

from __future__ import annotations

import json
import struct
import threading
import time
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from trainer.contract.phases import FINAL_PHASES
from trainer.contract.ranks import RELAY_MAX_BYTES, RankHeartbeat, parse_rank_heartbeat, relay_form
from trainer.distributed.layout import RankLayout

MESSAGE = RELAY_MAX_BYTES + 4
TAG = 7  # its own group already; a tag of its own too, for the reader of a gloo trace
# The group's timeout: a receiver waits for the next beat as long as the job lives. A
# rank that dies ends its sends; the threads are daemons that the rank's exit ends.
FOREVER = timedelta(days=365)
FINAL_WAIT_S = 2.0  # how long a rank's last beat may wait for the writer to take it


def relay_group(layout: RankLayout) -> Any:
    """The relay's group: the writer and the ranks that send to it (every rank makes it, in
    the same order as the others, members or not). None for a job on one host: its ranks'
    files are all in the writer's run dir already."""
    if layout.nodes == 1:
        return None
    members = [layout.writer_rank, *senders(layout)]
    return dist.new_group(members, backend="gloo", timeout=FOREVER)


def senders(layout: RankLayout) -> list[int]:
    """The ranks that relay: those of every node but the writer's."""
    writer_node = layout.writer_rank // layout.per_node
    return [r for r in range(layout.world_size) if r // layout.per_node != writer_node]


def pack(raw: bytes) -> torch.Tensor:
    msg = torch.zeros(MESSAGE, dtype=torch.uint8)
    msg[:4] = torch.frombuffer(bytearray(struct.pack("<I", len(raw))), dtype=torch.uint8)
    msg[4 : 4 + len(raw)] = torch.frombuffer(bytearray(raw), dtype=torch.uint8)
    return msg


def unpack(msg: torch.Tensor, src: int) -> dict[str, Any] | str:
    """The beat that rank `src` sent, as JSON, or why it is not one."""
    data = bytes(msg.numpy())
    (n,) = struct.unpack("<I", data[:4])
    if n > RELAY_MAX_BYTES:
        return f"a message of {n} bytes (at most {RELAY_MAX_BYTES})"
    try:
        beat = json.loads(data[4 : 4 + n])
    except ValueError as e:
        return f"not JSON ({e})"
    parsed = parse_rank_heartbeat(beat, f"rank {src}'s relayed heartbeat")
    if not isinstance(parsed, RankHeartbeat):
        return parsed.why
    if parsed.rank != src:
        return f"rank {src} sent a heartbeat that says it is rank {parsed.rank}"
    return dict(beat)


class RankSender(threading.Thread):
    """A rank of another node: its newest heartbeat, to the writer."""

    def __init__(self, layout: RankLayout, group: Any) -> None:
        super().__init__(name="rank-relay", daemon=True)
        self.dst, self.group = layout.writer_rank, group
        self._lock = threading.Lock()
        self._newest: bytes | None = None
        self._offered = threading.Event()
        self._sent = threading.Event()
        self.too_big = 0  # beats that did not fit a message even without their stage times

    def offer(self, beat: dict[str, Any], final: bool) -> None:
        """Called by the heartbeat thread; never blocks, but on the last beat (`final`)
        waits up to FINAL_WAIT_S for the writer to take it: the rank exits right after."""
        raw = relay_form(beat)
        if raw is None:
            self.too_big += 1
            return
        with self._lock:
            self._newest = raw
            self._sent.clear()
        self._offered.set()
        if final:
            self._sent.wait(FINAL_WAIT_S)

    def run(self) -> None:
        while True:
            self._offered.wait()
            with self._lock:
                raw, self._newest = self._newest, None
                self._offered.clear()
            if raw is None:
                continue
            try:
                dist.send(pack(raw), self.dst, group=self.group, tag=TAG)
            except RuntimeError:  # the writer is gone: nothing left to tell
                return
            with self._lock:
                if self._newest is None:
                    self._sent.set()


class RankCollector(threading.Thread):
    """The writer: the newest heartbeat of each rank of the other nodes."""

    def __init__(self, layout: RankLayout, group: Any) -> None:
        super().__init__(name="rank-collector", daemon=True)
        self.group = group
        self.expected = set(senders(layout))
        self._lock = threading.Lock()
        self._ranks: dict[str, Any] = {}
        self.refused: dict[int, str] = {}  # the last message refused from each rank, and why
        self._final = threading.Condition(self._lock)

    def run(self) -> None:
        msg = torch.empty(MESSAGE, dtype=torch.uint8)
        while True:
            try:
                src = dist.recv(msg, None, group=self.group, tag=TAG)
            except RuntimeError:  # every sender is gone
                return
            received = time.time()
            got = unpack(msg, src) if src in self.expected else f"rank {src} is not to relay"
            with self._lock:
                if isinstance(got, str):
                    self.refused[src] = got
                    continue
                # A new dict each time: the heartbeat thread may be encoding the last one.
                self._ranks = {**self._ranks, str(src): {"received": received, "beat": got}}
                self._final.notify_all()

    def ranks(self) -> dict[str, Any]:
        """What heartbeat.json's `ranks` says now (a dict nobody changes after)."""
        with self._lock:
            return self._ranks

    def wait_final(self, timeout_s: float = FINAL_WAIT_S) -> dict[str, Any]:
        """Before the writer's last heartbeat: give the other nodes' ranks up to `timeout_s`
        to report their own end, so the job's last heartbeat says how each ended."""
        deadline = time.monotonic() + timeout_s

        def all_final() -> bool:
            beats = [self._ranks.get(str(r)) for r in self.expected]
            return all(b is not None and b["beat"].get("phase") in FINAL_PHASES for b in beats)

        with self._lock:
            while not all_final() and (left := deadline - time.monotonic()) > 0:
                self._final.wait(left)
            return self._ranks

"""A run's place in a job over several hosts, and the one rule for naming a run dir.

`dflash-tui launch GROUP` starts one trainer per host of a config.toml group, each in a run
dir of its own host's run root, all with the same run id: the monitor picks that id once
(`new_run_id`, the rule the agent uses for a run of one host) and sends each host its
`NodePlace`. The agent puts the place in the trainer's environment (DFLASH_NODES,
DFLASH_NODE_RANK, DFLASH_MASTER: trainer/distributed/nodes.py turns them into torchrun's node
arguments) and records it in launch.json (`LaunchRecord.node`).
"""

from __future__ import annotations

import dataclasses
import re
import secrets
import time

RUN_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")  # one plain name: no `..`, no /
MAX_NODES = 4096  # as trainer/distributed/nodes.py bounds DFLASH_NODES
NODES_ENV, NODE_RANK_ENV, MASTER_ENV = "DFLASH_NODES", "DFLASH_NODE_RANK", "DFLASH_MASTER"


def new_run_id(name: str, now: float | None = None) -> str:
    """`YYYYMMDD-HHMMSS-NAME-xxxx`: the config's name made one plain word, and 16 random
    bits so two launches within a second differ."""
    safe = re.sub(r"[^A-Za-z0-9_.-]+", "-", name or "run").strip("-.")[:40] or "run"
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(now))
    return f"{stamp}-{safe}-{secrets.token_hex(2)}"


def master_invalid(master: str) -> str | None:
    """Why `master` is not `host:port` (an IPv6 address in brackets), or None."""
    host, sep, port = master.rpartition(":")
    if not sep or not host or any(c.isspace() for c in master) or "\0" in master:
        return f"{master!r}: expected host:port"
    if not port.isdigit() or not 0 < int(port) < 65536:
        return f"{master!r}: the port must be 1..65535"
    if ":" in host and not (host.startswith("[") and host.endswith("]")):
        return f"{master!r}: an IPv6 address goes in brackets, [::1]:29500"
    return None


@dataclasses.dataclass
class NodePlace:
    """One host's trainer in a job of `nodes` hosts: node `node_rank` (0 holds the writer and
    the job's files), reaching node 0's rendezvous at `master`, in run dir `run_id`."""

    run_id: str
    nodes: int
    node_rank: int
    master: str

    def invalid(self) -> str | None:
        """Why this place cannot be launched, naming the field; None for a sound one."""
        if not RUN_ID.match(self.run_id) or self.run_id in (".", ".."):
            return f"node run_id {self.run_id!r}: one plain name (letters, digits, . _ -)"
        if not 2 <= self.nodes <= MAX_NODES:
            return f"node nodes {self.nodes}: expected 2..{MAX_NODES}"
        if not 0 <= self.node_rank < self.nodes:
            return f"node node_rank {self.node_rank}: expected 0..{self.nodes - 1}"
        why = master_invalid(self.master)
        return None if why is None else f"node master {why}"

    def environment(self) -> dict[str, str]:
        """The trainer's environment for this place (trainer/distributed/nodes.py reads it)."""
        return {
            NODES_ENV: str(self.nodes),
            NODE_RANK_ENV: str(self.node_rank),
            MASTER_ENV: self.master,
        }

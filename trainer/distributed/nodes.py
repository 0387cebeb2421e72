"""processes mode over several hosts: torchrun's node arguments, from the launcher's environment.

`dflash-tui launch GROUP` starts one trainer per host with DFLASH_NODES (how many hosts),
DFLASH_NODE_RANK (this host's place, 0 = the writer's host) and DFLASH_MASTER (host:port of
node 0's rendezvous). The trainer then becomes `torchrun --nnodes N --node-rank R
--master-addr H --master-port P` instead of `--standalone`. Static rendezvous, not c10d: c10d
numbers the nodes in the order they join, and the writer must be on node 0 (the first host
named), whose run dir is the job's. Unset: one node, `--standalone`, as before. A bad value is
one ConfigError line (exit 2) naming the variable, before torchrun starts.
"""

from __future__ import annotations

from collections.abc import Mapping

from trainer.config import ConfigError

NODES, NODE_RANK, MASTER = "DFLASH_NODES", "DFLASH_NODE_RANK", "DFLASH_MASTER"


def _int(env: Mapping[str, str], key: str, low: int, high: int) -> int:
    text = env.get(key, "")
    if not text.isdigit() or not low <= int(text) <= high:
        raise ConfigError(f"{key}={text!r} in the environment: expected an integer {low}..{high}")
    return int(text)


def torchrun_node_args(env: Mapping[str, str]) -> list[str]:
    """`--standalone` for one node, else the static multi-node arguments."""
    if NODES not in env:
        return ["--standalone"]
    nodes = _int(env, NODES, 1, 4096)
    node_rank = _int(env, NODE_RANK, 0, nodes - 1)
    host, _, port = env.get(MASTER, "").rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ConfigError(
            f"{MASTER}={env.get(MASTER, '')!r} in the environment: expected host:port"
        )
    return [
        "--nnodes",
        str(nodes),
        "--node-rank",
        str(node_rank),
        "--master-addr",
        host,
        "--master-port",
        port,
    ]

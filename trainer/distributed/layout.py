"""processes mode (runtime.mode = "processes"): which rank is which role, and the job's start.

torchrun starts one process per role: `python -m torch.distributed.run --nproc-per-node N
-m trainer --config ... --run-root ...` with N = len(runtime.targets) + len(runtime.drafters).
The mapping is fixed: ranks 0..T-1 are the targets (rank t runs target t on
runtime.targets[t]), ranks T..T+D-1 the drafter replicas (rank T+r runs replica r on
runtime.drafters[r]). The lowest drafter rank, T, is the job's *writer*: it makes the one run
dir, writes config.json, train.log, metrics.jsonl, heartbeat.json and the checkpoints; every
rank writes heartbeat-rank{R}.json there (trainer/contract/ranks.py) and keeps its own log
and heartbeat under ranks/rank-{R}/ (the writer's are the job's own).

Several nodes (torchrun --nnodes N, one torchrun per host; trainer/distributed/nodes.py): the
lists are per node, so every node runs t = len(runtime.targets) targets and d =
len(runtime.drafters) replicas and the job has T = N*t, D = N*d. Node n holds global ranks
n*(t+d) .. n*(t+d)+t+d-1 (torchrun's RANK = node rank * local world + local rank); on it
local ranks 0..t-1 run targets n*t .. n*t+t-1 and local ranks t..t+d-1 replicas n*d ..
n*d+d-1, each on the node's own list entry. Batch g goes to replica g % D, from target g % T
or, with runtime.routing = "node", from a target on the replica's own node
(trainer/distributed/routing.py); the writer is still replica 0 (global rank t, on node 0).
With N = 1 this is the single-node mapping above, unchanged. Each host keeps a run dir of
its own with the job's run id (no shared filesystem needed): node 0's is the job's; on node
n the node's lead (its first replica, local rank t) writes config.json, train.log and
heartbeat.json there, and each of its ranks its heartbeat-rank{R}.json. Only node 0 holds
checkpoints; a resume is sent from the writer to every rank (trainer/distributed/resume.py).

Nothing here imports torch at module level: the refusal of a wrong world size comes before
torch is imported and before any rendezvous, so it never waits for a peer.
"""

from __future__ import annotations

import copy
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

from trainer.config import Config, ConfigError, bad_value

TARGET, DRAFTER = "target", "drafter"
RANKS_DIR = "ranks"  # under the run dir: each rank's own log and heartbeat but the writer's


@dataclass(frozen=True)
class RankLayout:
    rank: int
    world_size: int
    local_rank: int
    targets: int  # T, over every node
    drafters: int  # D, over every node
    device: str  # as the config names it ("cpu", "cuda:1", "auto")
    nodes: int = 1  # N; the lists are per node, so t = T // N and d = D // N
    routing: str = "fixed"  # runtime.routing: which target feeds which replica (routing.py)

    @property
    def per_node(self) -> int:
        return (self.targets + self.drafters) // self.nodes

    @property
    def node(self) -> int:
        return self.rank // self.per_node

    @property
    def _t(self) -> int:
        return self.targets // self.nodes

    @property
    def _d(self) -> int:
        return self.drafters // self.nodes

    @property
    def role(self) -> str:
        return TARGET if self.rank % self.per_node < self._t else DRAFTER

    @property
    def index(self) -> int:
        """Target t or drafter replica r, over every node."""
        local = self.rank % self.per_node
        if self.role == TARGET:
            return self.node * self._t + local
        return self.node * self._d + local - self._t

    @property
    def writer_rank(self) -> int:
        return self.drafter_rank(0)

    @property
    def writer(self) -> bool:
        return self.rank == self.writer_rank

    @property
    def node_lead(self) -> bool:
        """The first replica on its node: its train.log and heartbeat are its host's run
        dir's own (on node 0 that is the writer, whose run dir is the job's)."""
        return self.rank % self.per_node == self._t

    def target_rank(self, t: int) -> int:
        return (t // self._t) * self.per_node + t % self._t

    def drafter_rank(self, r: int) -> int:
        return (r // self._d) * self.per_node + self._t + r % self._d

    @property
    def drafter_ranks(self) -> list[int]:
        return [self.drafter_rank(r) for r in range(self.drafters)]

    @property
    def name(self) -> str:
        return f"rank {self.rank} ({self.role} {self.index})"


def _env_int(env: Mapping[str, str], key: str) -> int:
    text = env.get(key, "")
    try:
        return int(text)
    except ValueError:
        rule = f"{key}={text!r} in the environment is not an integer (is this torchrun?)"
        raise bad_value("runtime.mode", "processes", rule) from None


def layout_from_env(cfg: Config, env: Mapping[str, str] | None = None) -> RankLayout:
    """This process's place in the job, from torchrun's environment; a wrong world is one
    ConfigError line (exit 2) naming the command line that would be right."""
    env = os.environ if env is None else env
    rt = cfg.runtime
    t, d = len(rt.targets), len(rt.drafters)
    if "WORLD_SIZE" not in env or "RANK" not in env:
        rule = (
            f"start it with torchrun: python -m torch.distributed.run --nproc-per-node {t + d}"
            " -m trainer ... (WORLD_SIZE is not set)"
        )
        raise bad_value("runtime.mode", "processes", rule)
    world, rank = _env_int(env, "WORLD_SIZE"), _env_int(env, "RANK")
    # One node's share is t + d ranks; a multi-node world is a whole number of them.
    local_world = _env_int(env, "LOCAL_WORLD_SIZE") if "LOCAL_WORLD_SIZE" in env else t + d
    if local_world != t + d or world < t + d or world % (t + d):
        rule = (
            f"WORLD_SIZE is {world} but runtime.targets + runtime.drafters make {t + d} ranks"
            f" ({t} + {d}); start torchrun with --nproc-per-node {t + d}"
        )
        if local_world != t + d:
            rule = f"LOCAL_WORLD_SIZE is {local_world}, " + rule.split(" but ", 1)[1]
        raise bad_value("runtime.mode", "processes", rule)
    if not 0 <= rank < world:
        raise bad_value("runtime.mode", "processes", f"RANK={rank} is outside 0..{world - 1}")
    local = _env_int(env, "LOCAL_RANK") if "LOCAL_RANK" in env else rank
    nodes = world // (t + d)
    on_node = rank % (t + d)
    device = rt.targets[on_node] if on_node < t else rt.drafters[on_node - t]
    return RankLayout(rank, world, local, nodes * t, nodes * d, device, nodes, rt.routing)


def rank_config(cfg: Config, layout: RankLayout) -> Config:
    """The config this rank builds from: its one device as both lists (build_run wants a
    drafter and a target; a target rank's drafter is never trained), wandb on the writer
    only, and no online eval (the writer and the eval rank get theirs back:
    trainer/distributed/eval_rank.py)."""
    mine = copy.deepcopy(cfg)
    device = layout.device
    if device == "auto":  # one GPU per rank, by torchrun's local rank
        import torch

        device = f"cuda:{layout.local_rank}" if torch.cuda.is_available() else "cpu"
    mine.runtime.targets, mine.runtime.drafters = [device], [device]
    if not layout.writer:
        mine.runtime.wandb_mode = "disabled"
    mine.eval.every, mine.eval.final = 0, False
    return mine


def backend_for(cfg: Config) -> str:
    """NCCL when every rank has a GPU of its own, else gloo: CPU ranks, CPU and GPU ranks
    mixed, or two ranks on one GPU (NCCL refuses a communicator with a GPU twice in it:
    "Duplicate GPU detected"), where the features go through host memory."""
    import torch

    devices = [*cfg.runtime.targets, *cfg.runtime.drafters]
    on_gpu = all(d != "cpu" for d in devices) and torch.cuda.is_available()
    return "nccl" if on_gpu and not shares_a_gpu(devices) else "gloo"


def shares_a_gpu(devices: list[str]) -> bool:
    """Two ranks name one GPU ("cuda:0" and "0" alike); "auto" is one GPU per local rank."""
    gpus = [d for d in devices if d not in ("auto", "cpu")]
    named = [d if d.startswith("cuda") else f"cuda:{d}" for d in gpus]
    named = ["cuda:0" if d == "cuda" else d for d in named]
    return len(named) != len(set(named))


class Job:
    """The process group of this rank, and the drafter ranks' own group."""

    def __init__(self, cfg: Config, layout: RankLayout) -> None:
        import torch
        import torch.distributed as dist

        self.layout = layout
        self.backend = backend_for(cfg)
        self.timeout = timedelta(seconds=cfg.runtime.collective_timeout_s)
        if self.backend == "nccl":
            torch.cuda.set_device(torch.device(rank_config(cfg, layout).runtime.targets[0]))
        dist.init_process_group(self.backend, timeout=self.timeout)
        # Every rank takes part in making a group, even one it is not in.
        self.drafters = dist.new_group(layout.drafter_ranks, timeout=self.timeout)
        # Where the transfers' tensors live: gloo moves host memory, NCCL device memory.
        self.comm_device = (
            torch.device("cuda", torch.cuda.current_device())
            if self.backend == "nccl"
            else torch.device("cpu")
        )

    def share(self, make: Callable[[], Any]) -> Any:
        """`make()` on the writer, its result (or its ConfigError) on every rank."""
        import torch.distributed as dist

        box: list[Any] = [None]
        if self.layout.writer:
            try:
                box[0] = ("ok", make())
            except ConfigError as e:
                box[0] = ("error", str(e))
        dist.broadcast_object_list(box, src=self.layout.writer_rank)
        kind, value = box[0]
        if kind == "error":
            raise ConfigError(value)
        return value

    def barrier(self) -> None:
        import torch.distributed as dist

        dist.barrier()


def rank_dir(run_dir: Path, layout: RankLayout) -> Path:
    """Where this rank keeps its own train.log and heartbeat: its host's run dir for the
    node's lead (the writer on node 0), ranks/rank-R/ under it for every other rank."""
    if layout.node_lead:
        return run_dir
    own = run_dir / RANKS_DIR / f"rank-{layout.rank}"
    own.mkdir(parents=True, exist_ok=True)
    return own

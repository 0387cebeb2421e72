"""The multi-node rank layout (trainer/distributed/layout.py) and torchrun's node arguments
(trainer/distributed/nodes.py): pure functions of the environment, no rendezvous."""

from __future__ import annotations

import pytest

from trainer.config import Config, ConfigError
from trainer.distributed.layout import layout_from_env
from trainer.distributed.nodes import torchrun_node_args


def _cfg(t: int, d: int) -> Config:
    cfg = Config()
    cfg.runtime.targets, cfg.runtime.drafters = ["cpu"] * t, ["cpu"] * d
    return cfg


def _layout(cfg: Config, world: int, rank: int, local_world: int):
    env = {"WORLD_SIZE": str(world), "RANK": str(rank), "LOCAL_WORLD_SIZE": str(local_world)}
    return layout_from_env(cfg, env)


def test_one_node_keeps_the_single_node_mapping():
    cfg = _cfg(2, 2)
    got = [(lay.role, lay.index) for lay in (_layout(cfg, 4, r, 4) for r in range(4))]
    assert got == [("target", 0), ("target", 1), ("drafter", 0), ("drafter", 1)]
    lay = _layout(cfg, 4, 0, 4)
    assert lay.writer_rank == 2 and lay.drafter_ranks == [2, 3]
    assert [lay.target_rank(t) for t in range(2)] == [0, 1]


def test_two_nodes_of_one_target_and_one_drafter_each():
    cfg = _cfg(1, 1)
    lays = [_layout(cfg, 4, r, 2) for r in range(4)]
    assert [(lay.node, lay.role, lay.index) for lay in lays] == [
        (0, "target", 0),
        (0, "drafter", 0),
        (1, "target", 1),
        (1, "drafter", 1),
    ]
    assert lays[0].targets == 2 and lays[0].drafters == 2
    assert lays[0].writer_rank == 1 and lays[0].drafter_ranks == [1, 3]
    assert [lays[0].target_rank(t) for t in range(2)] == [0, 2]
    assert [lay.writer for lay in lays] == [False, True, False, False]


def test_a_node_of_the_wrong_size_is_one_line():
    with pytest.raises(ConfigError, match=r"LOCAL_WORLD_SIZE is 3, runtime\.targets"):
        _layout(_cfg(1, 1), 6, 0, 3)


def test_node_arguments_standalone_static_and_refused():
    assert torchrun_node_args({}) == ["--standalone"]
    env = {"DFLASH_NODES": "2", "DFLASH_NODE_RANK": "1", "DFLASH_MASTER": "127.0.0.1:29511"}
    assert torchrun_node_args(env) == [
        "--nnodes", "2", "--node-rank", "1", "--master-addr", "127.0.0.1", "--master-port", "29511",
    ]  # fmt: skip
    with pytest.raises(ConfigError, match="DFLASH_NODE_RANK='2'"):
        torchrun_node_args({**env, "DFLASH_NODE_RANK": "2"})
    with pytest.raises(ConfigError, match="DFLASH_MASTER='nohost'"):
        torchrun_node_args({**env, "DFLASH_MASTER": "nohost"})

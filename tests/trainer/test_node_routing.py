"""processes mode's routing (trainer/distributed/routing.py) on the layouts torchrun's
environment gives (layout_from_env): which target forwards a batch, which replica trains it."""

from __future__ import annotations

from collections import Counter

import pytest

from trainer.config import Config, ConfigError, load_config
from trainer.distributed.layout import RankLayout, layout_from_env
from trainer.distributed.routing import check_routing, crosses_nodes, route


def _layout(t: int, d: int, nodes: int, routing: str) -> RankLayout:
    cfg = Config()
    cfg.runtime.targets, cfg.runtime.drafters = ["cpu"] * t, ["cpu"] * d
    cfg.runtime.mode, cfg.runtime.routing = "processes", routing
    env = {"WORLD_SIZE": str(nodes * (t + d)), "RANK": "0", "LOCAL_WORLD_SIZE": str(t + d)}
    return layout_from_env(cfg, env)


def _node_of_target(lay: RankLayout, t: int) -> int:
    return lay.target_rank(t) // lay.per_node


def _node_of_replica(lay: RankLayout, r: int) -> int:
    return lay.drafter_rank(r) // lay.per_node


@pytest.mark.parametrize(("t", "d", "nodes"), [(5, 3, 2), (5, 3, 8), (2, 1, 2), (1, 2, 3)])
def test_node_routing_keeps_every_batch_on_its_replicas_node_and_the_fixed_replica(t, d, nodes):
    node, fixed = _layout(t, d, nodes, "node"), _layout(t, d, nodes, "fixed")
    T, D = node.targets, node.drafters
    steps = 4 * t  # whole periods of the node's target rotation
    batches = range(steps * D)
    for i in batches:
        way = route(i, node)
        # The replica is the fixed one: each step trains one batch per replica, as before.
        assert way.replica == route(i, fixed).replica == i % D
        assert _node_of_target(node, way.target) == _node_of_replica(node, way.replica)
        assert not crosses_nodes(i, node)
    # Every target forwards the same share: d batches a node a step over its t targets.
    load = Counter(route(i, node).target for i in batches)
    assert sorted(load) == list(range(T))
    assert set(load.values()) == {steps * d // t}


def test_fixed_routing_is_the_threaded_rule_and_crosses_as_scaling_md_says():
    lay = _layout(5, 3, 2, "fixed")
    assert [route(i, lay).target for i in range(12)] == [i % 10 for i in range(12)]
    period = 30  # lcm(T, D) = lcm(10, 6)
    crossing = sum(crosses_nodes(i, lay) for i in range(period))
    assert crossing == 14  # 46.7 %: bench/SCALING.md's 2-node row
    # With one node nothing crosses, whatever the routing.
    assert not any(crosses_nodes(i, _layout(5, 3, 1, "fixed")) for i in range(15))


def test_node_routing_on_one_node_spreads_batches_over_every_target():
    lay = _layout(2, 2, 1, "node")
    assert [(route(i, lay).target, route(i, lay).replica) for i in range(8)] == [
        (0, 0), (1, 1), (0, 0), (1, 1), (0, 0), (1, 1), (0, 0), (1, 1),
    ]  # fmt: skip
    lay = _layout(3, 2, 1, "node")
    assert [route(i, lay).target for i in range(6)] == [0, 1, 2, 0, 1, 2]


def test_a_routing_the_layout_cannot_honour_is_one_line():
    # A node with drafters and no targets (a layout no config list makes today: the check
    # is the routing's own, before any model loads).
    no_targets = RankLayout(0, 3, 0, 0, 3, "cpu", 1, "node")
    with pytest.raises(ConfigError, match=r"runtime\.routing = .node.: a node with drafters"):
        check_routing(no_targets)
    check_routing(_layout(1, 1, 2, "node"))  # honoured: no error
    with pytest.raises(ConfigError, match=r"processes mode routes by fixed or node"):
        check_routing(RankLayout(0, 2, 0, 1, 1, "cpu", 1, "shared"))


def test_node_routing_in_threads_mode_is_refused_by_the_config():
    with pytest.raises(ConfigError, match=r"runtime\.routing = .node.: needs runtime\.mode"):
        load_config(None, ["runtime.routing=node"])
    with pytest.raises(ConfigError, match=r"runtime\.routing = .nodes.: expected one of"):
        load_config(None, ["runtime.routing=nodes"])
    assert load_config(None, ["runtime.routing=node", "runtime.mode=processes"])

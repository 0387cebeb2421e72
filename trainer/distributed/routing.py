"""processes mode: which target forwards a batch, and which drafter replica trains it.

One pure function of (the batch's index i = g - g0 counted from this run's start, the
layout), that target ranks and drafter ranks both call, so the two sides agree without a
message. The replica is always r = i % D: step s still trains one batch per replica
(batches g0 + (s - s0)*D + r), whatever the routing, so the trajectory (what each replica
trains, in order) is the same under every routing and a resume continues it.

  "fixed": target i % T (the threaded pipeline's rule). With N nodes a target feeds replicas
           on every node: (N-1)/N of the batches and more cross the inter-node link.
  "node":  a target on replica r's own node: the node's d replicas of step j = i // D take
           its t targets in turn, target k = (j*d + r's place on the node) % t, so each of
           the node's targets forwards d/t of the node's batches a step and none crosses.
"""

from __future__ import annotations

from dataclasses import dataclass

from trainer.config import bad_value
from trainer.distributed.layout import RankLayout

FIXED, NODE = "fixed", "node"
ROUTINGS = (FIXED, NODE)  # what processes mode can route by


@dataclass(frozen=True)
class Route:
    target: int  # target index t over every node (its rank: layout.target_rank(t))
    replica: int  # drafter replica r (its rank: layout.drafter_rank(r))


def route(i: int, layout: RankLayout) -> Route:
    """Batch i of this run (i = g - g0 >= 0): its target and its replica."""
    r = i % layout.drafters
    if layout.routing != NODE:
        return Route(i % layout.targets, r)
    t, d = layout.targets // layout.nodes, layout.drafters // layout.nodes
    node, place = divmod(r, d)
    return Route(node * t + ((i // layout.drafters) * d + place) % t, r)


def crosses_nodes(i: int, layout: RankLayout) -> bool:
    """Batch i's features go from one node to another."""
    way = route(i, layout)
    return layout.target_rank(way.target) // layout.per_node != (
        layout.drafter_rank(way.replica) // layout.per_node
    )


def check_routing(layout: RankLayout) -> None:
    """A routing the layout cannot honour is one ConfigError line, before any model loads:
    node routing needs a target on every node that has drafters."""
    if layout.routing not in ROUTINGS:
        rule = f"processes mode routes by {' or '.join(ROUTINGS)}"
        raise bad_value("runtime.routing", layout.routing, rule)
    targets_a_node = layout.targets // layout.nodes
    if layout.routing == NODE and layout.drafters and not targets_a_node:
        rule = "a node with drafters has no target to feed them (runtime.targets is empty)"
        raise bad_value("runtime.routing", layout.routing, rule)

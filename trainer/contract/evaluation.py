"""Held-out acceptance length during training: what the heartbeat, metrics.jsonl and
`eval/step-N.json` say about it.

The trainer's eval thread (trainer/evaluation/online.py) decodes held-out prompts speculatively
every `eval.every` steps: the drafter of that step proposes, the whole target verifies
greedily (trainer/evaluation/speculative.py). τ is the mean number of tokens a verify step yields,
the target's bonus token included: 1.0 is a drafter that never helps, the block size one
that is always right.

With `eval.tree_nodes` set, each eval also decodes the same prompts with a DDTree draft tree
of that many nodes per verify step (trainer/evaluation/tree.py) and reports its τ beside the
chain's: `EvalResult.tree_*`, `EvalPoint.tree_tau`, `EvalInfo.tree_nodes`. These fields are
optional (0 or None from older trainers and from runs that measure no tree; older readers
ignore them), and `tau` keeps its meaning: the chain's.

`Heartbeat.eval` (optional under schema 2: None from older trainers and from runs that
evaluate nothing) carries the latest result and the history; a metrics.jsonl row carries
the result that finished since the row before (`MetricsRow.eval`).
"""

from __future__ import annotations

import dataclasses
import math

# The history kept in the heartbeat: every eval of a long run at a 500-step interval fits.
HISTORY = 200


@dataclasses.dataclass
class EvalResult:
    """One held-out evaluation of the drafter at optimizer step `step`."""

    step: int
    tau: float | None  # None: no verify step ran (every prompt ended at once)
    per_position: list[float] = dataclasses.field(default_factory=list)  # draft k accepted
    verify_steps: int = 0
    tokens: int = 0  # new tokens decoded, over all prompts
    prompts: int = 0
    tok_s: float | None = None  # of the decoding loop itself
    seconds: float = 0.0  # the whole eval: loading the weights, every prompt
    at: float = 0.0  # unix time it finished
    # The training accuracy of the step line before the drafter's weights were taken: what
    # held-out τ is set against (a τ falling while this rises is overfitting).
    train_acc: float | None = None
    # DDTree beside the chain (eval.tree_nodes): the same drafter and prompts, a draft tree
    # of `tree_nodes` nodes per verify step. 0 / None: no tree was asked for.
    tree_nodes: int = 0
    tree_tau: float | None = None  # None: off, or not measured (below)
    tree_seconds: float | None = None  # the tree's decoding of every prompt
    tree_not_measured: str | None = None  # why not, e.g. "hybrid target (...)"


@dataclasses.dataclass
class EvalPoint:
    """One eval in the history: enough for a trend and the overfitting check."""

    step: int
    tau: float | None
    train_acc: float | None = None
    tree_tau: float | None = None  # DDTree's τ on the same prompts (EvalResult.tree_tau)


@dataclasses.dataclass
class EvalInfo:
    """The eval's state in the heartbeat."""

    every: int = 0  # steps between evals (eval.every)
    held_out: int = 0  # samples never trained on that the prompts come from
    prompts: int = 0  # per eval
    new_tokens: int = 0  # per prompt
    device: str = ""
    tree_nodes: int = 0  # eval.tree_nodes: DDTree's node budget beside the chain, 0 = off
    last: EvalResult | None = None
    history: list[EvalPoint] = dataclasses.field(default_factory=list)  # oldest first
    running_step: int | None = None  # an eval of this step is under way
    # Evals due while one was still under way: not run, since the pipeline never waits.
    skipped: int = 0
    seconds: float = 0.0  # all evals so far, on the eval thread
    # What taking the drafter's weights cost the training thread, all evals together.
    snapshot_s: float = 0.0
    error: str | None = None  # the eval failed (training goes on): why, one line

    def best(self) -> EvalPoint | None:
        scored = [p for p in self.history if p.tau is not None and math.isfinite(p.tau)]
        return max(scored, key=lambda p: (p.tau, -p.step)) if scored else None

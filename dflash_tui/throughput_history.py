"""Throughput baselines from history, not from a hand-typed number.

- `own_drop`: the followed run's tok/s fell and stayed down against its own stable level:
  the median of its logged steps after the first few (compile, warm-up) and before the slow
  stretch. Every step of the stretch, the recent ones included, must be below the bar, so
  one slow step (a checkpoint) is not a drop; and the stretch is never part of the baseline,
  so a drop that lasts longer than the run had been fast does not become the new normal.
- `earlier_best`: the best tok/s of earlier comparable runs (`facts.earlier_runs`, the
  contract's one comparability rule) and which run logged it.

`DiagnosisConfig.baseline_tok_s`, when set, overrides both (the rules check it).
"""

from __future__ import annotations

import bisect
import dataclasses
import math
import statistics

from dflash_tui.facts import earlier_runs
from dflash_tui.state import Store


def logged_rates(s: Store) -> list[tuple[int, float]]:
    """(step, tok/s) of the followed run's metrics rows with a positive, finite tok/s."""
    return [
        (m.step, float(m.tok_s))
        for m in s.metrics
        if isinstance(m.tok_s, int | float) and math.isfinite(m.tok_s) and m.tok_s > 0
    ]


@dataclasses.dataclass(frozen=True)
class OwnDrop:
    stable_tok_s: float  # median over the stable window
    stable_rows: int
    recent_tok_s: float  # median over the last `recent_rows` logged steps
    recent_rows: int
    slow_since: int  # the first logged step of the slow stretch (every one below the bar)
    slow_rows: int  # logged steps in the slow stretch (>= recent_rows)

    @property
    def drop_pct(self) -> float:
        return 100.0 * (1.0 - self.recent_tok_s / self.stable_tok_s)


def own_drop(
    s: Store, skip_rows: int, recent_rows: int, min_stable: int, drop_pct: float
) -> OwnDrop | None:
    """The sustained drop, or None. After the first `skip_rows` logged steps, the slow
    stretch is the longest run of last steps (at least `recent_rows`) each more than
    `drop_pct` below the median of the steps before it (at least `min_stable` of them)."""
    rows = logged_rates(s)[skip_rows:]
    keep = 1.0 - drop_pct / 100.0
    min_stable = max(1, min_stable)
    cut = len(rows) - recent_rows  # the first step of the stretch tried: rows[cut]
    if cut < min_stable:
        return None
    before = sorted(v for _, v in rows[:cut])
    tail_max = max(v for _, v in rows[cut:])
    found: int | None = None
    while cut >= min_stable:
        if tail_max < keep * _median(before):
            found = cut  # valid; an earlier start may be too (a longer stretch)
        if cut == min_stable:
            break
        cut -= 1
        v = rows[cut][1]
        before.pop(bisect.bisect_left(before, v))
        tail_max = max(tail_max, v)
        if tail_max >= keep * before[-1]:
            break  # no median of fewer steps is above before[-1]: no earlier start
    if found is None:
        return None
    stable = [v for _, v in rows[:found]]
    return OwnDrop(
        stable_tok_s=float(statistics.median(stable)),
        stable_rows=found,
        recent_tok_s=float(statistics.median(v for _, v in rows[-recent_rows:])),
        recent_rows=recent_rows,
        slow_since=rows[found][0],
        slow_rows=len(rows) - found,
    )


def _median(ordered: list[float]) -> float:
    n = len(ordered)
    return ordered[n // 2] if n % 2 else (ordered[n // 2 - 1] + ordered[n // 2]) / 2.0


@dataclasses.dataclass(frozen=True)
class EarlierBest:
    run_id: str
    tok_s: float


def earlier_best(s: Store) -> EarlierBest | None:
    """The fastest earlier comparable run by its best logged tok/s."""
    best: EarlierBest | None = None
    for r in earlier_runs(s):
        v = r.best_tok_s
        if v is None or not math.isfinite(v) or v <= 0:
            continue
        if best is None or v > best.tok_s:
            best = EarlierBest(r.run_id, float(v))
    return best

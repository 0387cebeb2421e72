"""Throughput baselines from history, not from a hand-typed number.

- `own_baseline`: the followed run's own stable tok/s (the median of its logged steps after
  the first few, which include compile and warm-up) against its recent steps: a drop that
  every recent step shares is sustained, one slow step (a checkpoint) is not.
- `earlier_best`: the best tok/s of earlier comparable runs (`facts.earlier_runs`, the
  contract's one comparability rule) and which run logged it.

`DiagnosisConfig.baseline_tok_s`, when set, overrides both (the rules check it).
"""

from __future__ import annotations

import dataclasses
import math
import statistics

from dflash_tui.facts import earlier_runs
from dflash_tui.state import Store


@dataclasses.dataclass(frozen=True)
class OwnBaseline:
    stable_tok_s: float  # median over the stable window
    stable_rows: int
    recent_tok_s: float  # median over the recent window
    recent_max: float  # the fastest recent step: below the bar too when sustained
    recent_rows: int
    first_step: int  # the step the recent window starts at


def _rates(s: Store) -> list[tuple[int, float]]:
    return [
        (m.step, float(m.tok_s))
        for m in s.metrics
        if isinstance(m.tok_s, int | float) and math.isfinite(m.tok_s) and m.tok_s > 0
    ]


def own_baseline(s: Store, skip_rows: int, recent_rows: int, min_stable: int) -> OwnBaseline | None:
    """None until the run has logged skip_rows + min_stable + recent_rows steps."""
    rows = _rates(s)
    if len(rows) < skip_rows + min_stable + recent_rows:
        return None
    stable = [v for _, v in rows[skip_rows:-recent_rows]]
    recent = rows[-recent_rows:]
    return OwnBaseline(
        stable_tok_s=float(statistics.median(stable)),
        stable_rows=len(stable),
        recent_tok_s=float(statistics.median(v for _, v in recent)),
        recent_max=max(v for _, v in recent),
        recent_rows=len(recent),
        first_step=recent[0][0],
    )


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

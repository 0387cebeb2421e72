"""Held-out acceptance length (τ) during training, as the views and the rules say it.

The trainer's eval thread decodes held-out prompts speculatively every `eval.every` steps and
the heartbeat carries the result and the history (`Heartbeat.eval`,
trainer/contract/evaluation.py). From it, computed here once for the heartbeat pane, the
headless line, `--json` and the rules:

- `latest`: the newest eval with a τ (an eval whose prompts all ended at once has none);
- its trend since the eval before (`delta`; `flat` within FLAT_TAU: a mean over a few
  prompts moves by that much on its own);
- `best`: this run's best (`EvalInfo.best`: the earliest of equal ones);
- `earlier`: the best of earlier comparable runs evaluated the same way
  (dflash_tui/facts.py, `earlier_best_tau`).

`error` is the host's text: views show it through dflash_tui/sanitize.py like any other.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from dflash_tui.facts import EarlierTau, earlier_best_tau
from dflash_tui.state import Store
from trainer.contract.evaluation import EvalInfo, EvalPoint, EvalResult
from trainer.contract.protocol import RunInfo
from trainer.contract.typed import encode

FLAT_TAU = 0.02  # |Δτ| since the eval before below this: flat
ARROWS = {"up": "↑", "down": "↓", "flat": "→"}
ASCII_ARROWS = {"up": "+", "down": "-", "flat": "="}


def scored(info: EvalInfo) -> list[EvalPoint]:
    """The history's evals with a finite τ, oldest first."""
    return [p for p in info.history if p.tau is not None and math.isfinite(p.tau)]


@dataclass(frozen=True)
class TauSummary:
    info: EvalInfo
    latest: EvalPoint | None  # the newest eval with a τ
    previous: EvalPoint | None  # the one before it
    best: EvalPoint | None  # this run's best
    earlier: EarlierTau | None  # the best of earlier comparable runs, same eval settings

    @property
    def delta(self) -> float | None:
        """τ since the eval before."""
        if self.latest is None or self.previous is None:
            return None
        return (self.latest.tau or 0.0) - (self.previous.tau or 0.0)

    @property
    def trend(self) -> str | None:
        """up, down or flat since the eval before; None with fewer than two evals."""
        d = self.delta
        if d is None:
            return None
        return "flat" if abs(d) < FLAT_TAU else "up" if d > 0 else "down"

    @property
    def last(self) -> EvalResult | None:
        return self.info.last

    def arrow(self, unicode: bool = True) -> str:
        return (ARROWS if unicode else ASCII_ARROWS).get(self.trend or "", "")

    def short(self, unicode: bool = True) -> str:
        """For the headless line: `τ 2.31↑` (`tau 2.31+` without unicode), `τ —` before the
        first eval."""
        name = "τ" if unicode else "tau"
        if self.latest is None:
            return f"{name} {'—' if unicode else '-'}"
        return f"{name} {self.latest.tau:.2f}{self.arrow(unicode)}"

    def forms(self) -> list[str]:
        """For the heartbeat pane, longest first: `τ 2.31 ↑0.12 at step 2000 (best 2.50 at
        step 1500; comparable runs' best 2.80)` down to `τ 2.31↑`."""
        if self.latest is None:
            every = f" (every {self.info.every} steps)" if self.info.every else ""
            return [f"τ — no eval yet{every}", "τ — no eval yet", "τ —"]
        tau = f"τ {self.latest.tau:.2f}"
        d = self.delta
        moved = f"{tau} {self.arrow()}{abs(d):.2f}" if d is not None else tau
        at = f"{moved} at step {self.latest.step}"
        best = self.best
        if best is None or best.step == self.latest.step:
            mine, mine_short = "best so far", "best"
        else:
            mine = f"best {best.tau:.2f} at step {best.step}"
            mine_short = f"best {best.tau:.2f}"
        out: list[str] = []
        if self.earlier is not None:
            e = f"{self.earlier.tau:.2f}"
            out += [
                f"{at} ({mine}; comparable runs' best {e})",
                f"{moved} ({mine}; comparable runs' best {e})",
                f"{moved} ({mine}; earlier {e})",
                f"{moved} ({mine_short}; earlier {e})",
            ]
        out += [f"{at} ({mine})", f"{moved} ({mine})", f"{moved} ({mine_short})", moved]
        out.append(f"{tau}{self.arrow()}")
        return out

    def fitted(self, width: int) -> str:
        """The longest form within `width` columns (the shortest when none fits)."""
        forms = self.forms()
        return next((f for f in forms if len(f) <= width), forms[-1])

    def state(self) -> str:
        """What the eval is doing beyond its τ: `evaluating step 1500 · 2 skipped (an eval
        was still running when due)`; "" when nothing is."""
        parts = []
        if self.info.running_step is not None:
            parts.append(f"evaluating step {self.info.running_step}")
        if self.info.skipped:
            parts.append(f"{self.info.skipped} skipped (an eval was still running when due)")
        return " · ".join(parts)

    def to_json(self) -> dict[str, Any]:
        """For --json: the figures the views show (the heartbeat's `eval` goes out as is)."""
        return {
            "latest": encode(self.latest),
            "delta": self.delta,
            "trend": self.trend,
            "best": encode(self.best),
            "earlier": (
                {"run_id": self.earlier.run_id, **encode(self.earlier.point)}
                if self.earlier
                else None
            ),
            "evals": len(self.info.history),
            "running_step": self.info.running_step,
            "skipped": self.info.skipped,
            "error": self.info.error,
        }


def summary(info: EvalInfo | None, earlier: EarlierTau | None = None) -> TauSummary | None:
    """None when the run evaluates nothing (or its trainer is older than the eval thread)."""
    if info is None:
        return None
    points = scored(info)
    return TauSummary(
        info=info,
        latest=points[-1] if points else None,
        previous=points[-2] if len(points) > 1 else None,
        best=info.best(),
        earlier=earlier,
    )


def of_store(s: Store) -> TauSummary | None:
    """The followed run's τ, against earlier comparable runs."""
    hb = s.heartbeat
    if hb is None or hb.eval is None:
        return None
    return summary(hb.eval, earlier_best_tau(s))


def best_tau(run: RunInfo) -> str:
    """A listed run's best held-out τ and its step, `2.50@1500`, for the runs lists; `—` for
    a run that evaluated nothing (or not yet)."""
    best = run.eval.best if run.eval else None
    return "—" if best is None or best.tau is None else f"{best.tau:.2f}@{best.step}"

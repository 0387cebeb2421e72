"""How the plots row is looked at, as W&B's charts are: smoothing (an exponential moving
average, debiased as TensorBoard's, so its first points are not pulled towards 0), a step or a
time x-axis, the values under a cursor, and the held-out τ curve from the eval results that
metrics.jsonl's rows carry (MetricsRow.eval).

Pure Python: widgets/plots.py draws what this decides.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from dflash_tui import fmt
from trainer.contract.records import MetricsRow
from trainer.contract.steplines import StepLine

# The smoothing weights + and - step through (0: the raw values). 0.99 on a run logged every
# 10 steps averages over ~1,000 steps: as far as it is useful to go.
SMOOTHING = (0.0, 0.6, 0.8, 0.9, 0.95, 0.99)
STEP, TIME = "step", "time"

Row = MetricsRow | StepLine


def ema(values: Sequence[float], weight: float) -> list[float]:
    """The debiased exponential moving average of `values` (weight 0: the values)."""
    return _ema_from(values, weight, 0.0, 0)[0]


def _ema_from(
    values: Sequence[float], weight: float, last: float, done: int
) -> tuple[list[float], float]:
    """The EMA of `values` carried on from `done` values before them whose running sum was
    `last`: (the smoothed values, the running sum after them)."""
    if weight <= 0:
        return list(values), last
    out = []
    for n, v in enumerate(values, start=done + 1):
        last = last * weight + (1 - weight) * v
        out.append(last / (1 - weight**n))
    return out, last


class Smoother:
    """`ema` of a series that grows at its end, carried on from the last call: a plot redrawn
    as rows come smooths the new rows only (36,000 rows of history took 11 ms a series).
    Anything else (another weight, rows dropped at the front) is smoothed afresh."""

    def __init__(self) -> None:
        # name -> (weight, the values smoothed, their smoothed values, the running sum)
        self._done: dict[str, tuple[float, list[float], list[float], float]] = {}

    def __call__(self, name: str, values: list[float], weight: float) -> list[float]:
        if weight <= 0:
            self._done.pop(name, None)
            return list(values)
        prev = self._done.get(name)
        if prev is not None and prev[0] == weight and values[: len(prev[1])] == prev[1]:
            _, before, smoothed, last = prev
            more, last = _ema_from(values[len(before) :], weight, last, len(before))
            smoothed = smoothed + more
        else:
            smoothed, last = _ema_from(values, weight, 0.0, 0)
        self._done[name] = (weight, list(values), smoothed, last)
        return smoothed


def next_smoothing(weight: float, up: bool) -> float:
    """The next weight of SMOOTHING up or down from `weight`, kept at the ends."""
    i = min(range(len(SMOOTHING)), key=lambda j: abs(SMOOTHING[j] - weight))
    i = min(len(SMOOTHING) - 1, i + 1) if up else max(0, i - 1)
    return SMOOTHING[i]


def minutes(row: Row) -> float:
    """The row's time since the run started, in minutes (a step line says whole minutes)."""
    if isinstance(row, MetricsRow):
        return row.elapsed_s / 60
    return float(row.elapsed_min)


def x_of(row: Row, axis: str) -> float:
    if axis == TIME:
        return minutes(row)
    # A step no run reaches (a hostile row's 400 digits) has no place on the axis: NaN, which
    # the plots leave out, where float() would raise.
    return float(row.step) if abs(row.step) <= fmt.PLAUSIBLE_MAX else math.nan


def xlabel(axis: str) -> str:
    return "min since start" if axis == TIME else "step"


@dataclass(frozen=True)
class EvalPoint:
    step: int
    tau: float
    minutes: float  # since the run started, on the rows' clock


def held_out(rows: Sequence[Row]) -> list[EvalPoint]:
    """The held-out τ of each eval the rows carry, in step order (an eval that measured
    nothing, τ None, is left out). Its time: when it finished, against the run's start as
    the rows tell it (a row's time less its elapsed)."""
    metrics = [r for r in rows if isinstance(r, MetricsRow)]
    if not metrics:
        return []
    start = metrics[0].time - metrics[0].elapsed_s
    points = {
        r.eval.step: EvalPoint(r.eval.step, r.eval.tau, max(0.0, (r.eval.at - start) / 60))
        for r in metrics
        if r.eval is not None and r.eval.tau is not None
    }
    return [points[s] for s in sorted(points)]


def cursor_row(rows: Sequence[Row], step: int | None) -> Row | None:
    """The row the cursor is on: the last at or before `step`."""
    if step is None:
        return None
    found = None
    for r in rows:
        if r.step > step:
            break
        found = r
    return found


def move_cursor(rows: Sequence[Row], step: int | None, by: int) -> int | None:
    """The cursor's step `by` rows on (negative: back). From no cursor, back is the newest
    row; on past the newest row the cursor goes (None: the plots follow the newest)."""
    steps = [r.step for r in rows]
    if not steps:
        return None
    if step is None:
        return steps[-1] if by < 0 else None
    i = max((j for j, s in enumerate(steps) if s <= step), default=0)
    i += by
    if i >= len(steps):
        return None
    return steps[max(0, i)]


def _number(v: float | None, digits: int) -> str:
    return "—" if v is None else fmt.real(v, digits)  # bounded: a row may say 1e308


def readout(
    rows: Sequence[Row],
    step: int | None,
    smoothing: float,
    axis: str,
    evals: Sequence[EvalPoint] = (),
) -> str:
    """The line above the plots: the values of the row under the cursor (≈ its smoothed
    value beside each), the newest held-out τ at or before it, then the settings. Empty
    when nothing differs from the default (no cursor, no smoothing, the step axis)."""
    if step is None and smoothing == 0 and axis == STEP:
        return ""
    parts = []
    row = cursor_row(rows, step)
    if row is not None:
        i = list(rows).index(row)

        def value(name: str, digits: int) -> str:
            raw = [float(getattr(r, name)) for r in rows[: i + 1]]
            text = _number(raw[-1], digits)
            if smoothing > 0:
                text += f" ≈{fmt.real(ema(raw, smoothing)[-1], digits)}"
            return text

        parts.append(f"step {fmt.count(row.step)} · {fmt.real(minutes(row), 1)} min")
        parts.append(fmt.rate(row.tok_s))
        parts.append(f"loss {value('loss', 3)}")
        parts.append(f"acc {value('acc', 3)}")
        parts.append(f"streak {value('streak', 2)}")
        tau = [e for e in evals if e.step <= row.step]
        if tau:
            parts.append(f"τ {tau[-1].tau:.2f} @{tau[-1].step}")
    else:
        parts.append("← → cursor")
    settings = f"ema {smoothing:g}" if smoothing else "raw"
    parts.append(f"{settings} (+ -) · x: {axis} (x)")
    return " · ".join(parts)

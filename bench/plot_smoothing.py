"""What smoothing the plots costs (issue 32): `plot_view.ema` over a full history of one
series (the store keeps 36,000 metrics rows), against `plot_view.Smoother` carrying on when one
row more comes, as a live run's redraws see it. Prints both in ms, the median of REPEATS.

    .venv/bin/python bench/plot_smoothing.py
"""

from __future__ import annotations

import random
import statistics
import time
from collections.abc import Callable

from dflash_tui import plot_view

ROWS = 36_000  # Store.metrics' bound: history * 10
REPEATS = 30


def ms(fn: Callable[[], object]) -> float:
    times = []
    for _ in range(REPEATS):
        t = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t) * 1000)
    return statistics.median(times)


def main() -> None:
    rng = random.Random(0)
    values = [rng.random() for _ in range(ROWS)]
    fresh = ms(lambda: plot_view.ema(values, 0.9))
    smooth = plot_view.Smoother()
    grown = list(values)

    def one_more() -> None:
        grown.append(rng.random())
        smooth("loss", grown, 0.9)

    smooth("loss", grown, 0.9)
    carried = ms(one_more)
    assert smooth("loss", grown, 0.9) == plot_view.ema(grown, 0.9)
    print(f"{ROWS} rows: fresh {fresh:.1f} ms a series; one row more {carried:.2f} ms")


if __name__ == "__main__":
    main()

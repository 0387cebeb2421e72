"""What the plots show, decided without textual: the loss window, and why a plot is empty.

The loss of a run starts an order of magnitude above where it settles (11.7 at step 1,
under 3 by step 200), so an axis anchored at the first value leaves a couple of rows for
the part that matters. The window follows the recent rows instead; the early values run
off the top of the panel, which is where they belong.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from dflash_tui.fmt import PLAUSIBLE_MAX
from dflash_tui.state import Store

RECENT_ROWS = 100  # the loss window: the last rows' min..max
MARGIN = 0.1  # of the window's height, above and below


def recent_range(
    values: Sequence[float | None], tail: int = RECENT_ROWS, log: bool = False
) -> tuple[float, float] | None:
    """(low, high) of the last `tail` finite values (past the first quarter) with a margin;
    None without any. On a log scale the margin is a factor and only positive values count."""
    values = list(values)
    # The last `tail` rows, but never the first quarter of a short run: that is the warm-up.
    start = max(len(values) - tail, len(values) // 4)
    # Plausible values only: a hostile 1e308 made the window's span infinite, its limits NaN.
    recent = [
        v
        for v in values[start:]
        if v is not None and math.isfinite(v) and abs(v) <= PLAUSIBLE_MAX and (v > 0 or not log)
    ]
    if not recent:
        return None
    lo, hi = min(recent), max(recent)
    if log:
        lo, hi = math.log10(lo), math.log10(hi)
    span = hi - lo or max(abs(hi) * 0.05, 0.01)  # a flat line still gets a little room
    lo, hi = lo - span * MARGIN, hi + span * MARGIN
    if log:
        return 10**lo, 10**hi
    return lo, hi


def why_no_metrics(s: Store) -> str:
    """One line for an empty step plot: not connected, no run, or the phase it is in."""
    link = s.link.state
    if link != "connected":
        return f"no metrics: not connected ({link})"
    if s.run_id is None:
        return "no metrics: no run under the run root yet"
    phase, _ = s.shown_phase()
    if phase is None:
        return "no metrics yet: waiting for the first heartbeat"
    return f"no metrics yet: the run is {phase}"


def why_no_gpu_samples(s: Store) -> str:
    """One line for an empty GPU plot: no NVML or nvidia-smi on the host, the agent's error,
    not connected, or no sample yet."""
    if s.link.state != "connected":
        return f"no GPU samples: not connected ({s.link.state})"
    g = s.gpu
    if g is None:
        return "no GPU samples yet: waiting for the agent"
    if g.state == "no_gpu" or (g.backend == "none" and not g.devices):
        return "no GPU samples: the host has no NVML or nvidia-smi"
    if g.state == "error":
        return f"no GPU samples: {g.reason or 'the agent could not read the GPUs'}"
    return "no GPU samples: the host reports no devices"

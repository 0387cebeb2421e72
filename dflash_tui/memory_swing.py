"""How far a GPU's memory fell from its peak within a window: the "back to volatile memory
use?" question the operators asked.

NVML's used memory of a GPU follows what the processes on it have *reserved* (torch's
caching allocator keeps freed blocks), not what they have allocated: allocated memory
swings by GBs every step by design, reserved memory holds still in a healthy run once
warm-up is over. A run whose reserved memory falls by GBs and climbs back is giving memory
back to the driver and asking again (an `empty_cache` in a loop, shapes that keep changing,
another process coming and going): each time a synchronising cudaFree/cudaMalloc, and an
out-of-memory waiting for the moment two peaks meet.

The swing is the largest drawdown in the window: the most that the memory fell below a
peak seen earlier in it. A rise (warm-up, a new bucket's first batch) is no swing."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True)
class Swing:
    fall: int  # bytes: the largest drop below an earlier peak in the window
    peak: int  # that peak
    trough: int  # the lowest point after it
    drops: int  # falls of at least the threshold, counted peak to trough (0 if no threshold)
    span_s: float  # the window's points cover this long


def memory_swing(points: Iterable[tuple[float, int]], min_fall: int = 0) -> Swing | None:
    """(time, used bytes) oldest first → the window's largest drawdown; None for < 2 points.
    `min_fall`: count the separate falls at least this large (each must climb back to a new
    high-water mark before the next counts)."""
    pts = list(points)
    if len(pts) < 2:
        return None
    best = Swing(0, pts[0][1], pts[0][1], 0, pts[-1][0] - pts[0][0])
    high = pts[0][1]
    drops, counted = 0, False
    for _, used in pts[1:]:
        if used >= high:  # back at (or above) the high-water mark: the next fall counts anew
            high, counted = used, False
            continue
        fall = high - used
        if fall > best.fall:
            best = Swing(fall, high, used, 0, best.span_s)
        if min_fall and fall >= min_fall and not counted:
            drops, counted = drops + 1, True
    return Swing(best.fall, best.peak, best.trough, drops, best.span_s)

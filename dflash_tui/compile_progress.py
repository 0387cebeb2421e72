"""What the compiling phase says while it lasts: graphs done of expected, the graph under
way and for how long, and what the same graphs took the last time.

From the heartbeat's `compile` (trainer/runtime/compile/progress.py: `current`, `current_since`,
`done`, `expected`, `last_s`, `last_cache`). The graphs come from `compile`, not from
`phase_progress`: the target's weights load on their own thread during compiling, and the
loader's per-device count lands in the phase's progress too (tests/fixtures/heartbeats).
A trainer from before compile progress leaves `phase_progress` empty while compiling: then
there is nothing to say. Pure Python, for the TUI, the headless line and slow_phase.
"""

from __future__ import annotations

from trainer.contract.heartbeat import Heartbeat
from trainer.contract.phases import COMPILING

CACHE_WORDS = {
    "cold": "with an empty cache",
    "warm": "with a warm cache",
    "partial": "with a partly filled cache",
}


def reported(hb: Heartbeat | None) -> bool:
    """A compiling heartbeat from a trainer that counts its graphs."""
    progress = hb.phase_progress if hb is not None else None
    return (
        hb is not None
        and hb.phase == COMPILING
        and progress is not None
        and (progress.unit == "graphs")
    )


def graphs(hb: Heartbeat | None) -> str | None:
    """`graphs 3/6`, `graphs 3 so far (first compile with this cache)`; None when not
    compiling or not reported."""
    if hb is None or not reported(hb):
        return None
    c = hb.compile
    if c.expected is None:
        return f"graphs {c.done} so far (first compile with this cache)"
    if c.expected == 0 and c.done == 0:
        return "no graphs to compile"  # the CPU path: nothing is torch.compiled
    if c.done > c.expected:
        return f"graphs {c.done} ({c.expected} last time)"
    return f"graphs {c.done}/{c.expected}"


def short(hb: Heartbeat | None) -> str | None:
    """For a 120-column line: `graphs 3/6`, `graphs 3` (no total known)."""
    if hb is None or not reported(hb):
        return None
    c = hb.compile
    if c.expected is None or c.done > c.expected:
        return f"graphs {c.done}"
    return None if c.expected == 0 and c.done == 0 else f"graphs {c.done}/{c.expected}"


def last_time(hb: Heartbeat) -> str | None:
    """`last time 30.6s with an empty cache`."""
    c = hb.compile
    if c.last_s is None:
        return None
    words = CACHE_WORDS.get(c.last_cache or "")
    return f"last time {c.last_s:.1f}s" + (f" {words}" if words else "")


def detail(hb: Heartbeat | None, remote_now: float) -> str | None:
    """`graphs 3/6: graph 4: forward of 2/0, bucket 4096 on cuda:0, 12s; last time 30.6s
    with an empty cache`. The host's words (the graph's label): a view sanitises."""
    count = graphs(hb)
    if hb is None or count is None:
        return None
    c = hb.compile
    text = count
    if c.current:
        text += f": {c.current}"
        if c.current_since is not None:
            text += f", {max(0.0, remote_now - c.current_since):.0f}s"
    last = last_time(hb)
    return text + (f"; {last}" if last else "")

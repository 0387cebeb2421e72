"""Whether the run's CUDA graphs work, in words: the heartbeat's `graphs` (per place the
trainer captures them; trainer/contract/graphs.py) as `status`, the heartbeat pane and the
`graphs_fell_back` finding say it.

    eval: in use · 1 captured · 189 replays
    eval: off (a Qwen3.5 hybrid target: its recurrent state cannot drop rejected drafts)
    eval: 2 captures failed · 3 evals ran eagerly · last: RuntimeError: operation not permitted
"""

from __future__ import annotations

from trainer.contract.graphs import GraphInfo
from trainer.contract.heartbeat import Heartbeat

REASON_CHARS = 160  # a failure's reason is the host's text: one bounded line of it


def fell_back(g: GraphInfo) -> bool:
    """Captures failed and the work ran eagerly instead (or nothing was ever captured)."""
    return g.failed > 0 and (g.eager_runs > 0 or g.captured == 0)


def last_reason(g: GraphInfo) -> str | None:
    if not g.failures:
        return None
    reason = " ".join(g.failures[-1].reason.split())
    return reason[:REASON_CHARS] + ("…" if len(reason) > REASON_CHARS else "")


def describe(place: str, g: GraphInfo) -> str:
    """One place's graphs in one line (the host's words in it: sanitise before showing)."""
    if not g.enabled:
        return f"{place}: off ({g.off_reason or 'not asked for'})"
    parts = [f"{place}: " + ("in use" if g.captured and not fell_back(g) else "not in use")]
    if g.captured:
        parts.append(f"{g.captured} captured")
    parts.append(f"{g.replays} replays")
    if g.failed:
        parts.append(f"{g.failed} capture{'s' if g.failed != 1 else ''} failed")
    if g.eager_runs:
        parts.append(f"{g.eager_runs} run{'s' if g.eager_runs != 1 else ''} eagerly")
    reason = last_reason(g)
    if reason:
        parts.append(f"last: {reason}")
    return " · ".join(parts)


def places(hb: Heartbeat | None) -> list[tuple[str, GraphInfo]]:
    """Every place the trainer reports graphs for, in a stable order; none from a trainer
    that reports no graphs."""
    return sorted(hb.graphs.items()) if hb is not None else []


def lines(hb: Heartbeat | None) -> list[str]:
    return [describe(place, g) for place, g in places(hb)]

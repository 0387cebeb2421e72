"""What the dashboard shows once the followed run has finished or stopped, in place of its
live views: how it ended, its steps, wall time, best tok/s, best held-out τ and its step, the
last good checkpoint, and the `dflash-tui export` command for the best step. Pure Python: the
store in, (label, value) rows out (host strings still raw: the pane shows them through
widgets/safe.py)."""

from __future__ import annotations

import shlex

from dflash_tui import evaluation
from dflash_tui.fmt import count, duration, rate
from dflash_tui.state import Store
from trainer.contract.outcomes import FINISHED, STOPPED_EARLY


def replaces_live_views(s: Store) -> bool:
    """The run finished or was stopped: its summary stands in for the live views. A crash, a
    kill or a death at start keeps them (their last picture is evidence the alerts quote)."""
    outcome = s.outcome()
    return s.ended() and outcome is not None and outcome.kind in (FINISHED, STOPPED_EARLY)


def _wall_s(s: Store) -> float | None:
    """From the trainer's start to its exit (exit.json), else the run's creation to the
    last heartbeat."""
    ex = s.exit_info()
    if ex is not None and ex.started_at and ex.ended_at and ex.ended_at >= ex.started_at:
        return ex.ended_at - ex.started_at
    run = s.current_run()
    hb = s.heartbeat
    if run is not None and run.created and hb is not None and hb.now >= run.created:
        return hb.now - run.created
    return None


def _best_tok_s(s: Store) -> float | None:
    rows = [m.tok_s for m in s.metrics if m.tok_s and m.tok_s > 0]
    run = s.current_run()
    listed = run.best_tok_s if run is not None else None
    return max([*rows, *([listed] if listed else [])], default=None)


def rows(s: Store, where: str) -> list[tuple[str, str]] | None:
    """The summary's rows, or None while the run has not ended. `where`: the TARGET
    arguments of a command line that reaches the run's host (`local --remote-dir DIR`)."""
    outcome = s.outcome()
    if outcome is None or s.run_id is None:
        return None
    out = [("outcome", outcome.summary)]
    hb = s.heartbeat
    step = outcome.step if outcome.step is not None else hb.step if hb else None
    total = outcome.total_steps or (hb.total_steps if hb else None)
    if step is not None:
        # bounded, as every figure from the host (a 400-digit step would fill the pane)
        out.append(("steps", count(step) + (f" of {count(total)}" if total else "")))
    wall = _wall_s(s)
    if wall is not None:
        out.append(("wall time", duration(wall)))
    best = _best_tok_s(s)
    if best:
        out.append(("best tok/s", rate(best)))
    tau = evaluation.of_store(s)
    run = s.current_run()
    best_tau = tau.best if tau is not None else run.eval.best if run and run.eval else None
    if best_tau is not None and best_tau.tau is not None:
        out.append(("best τ", f"{best_tau.tau:.2f} at step {count(best_tau.step)}"))
    point = run.resume if run is not None else None
    good = point if point is not None and point.name is not None else None
    if good is not None:
        of = f" of {good.run_id}" if good.run_id != s.run_id else ""
        said = "the last good one" if good.verified else "the newest (no sidecar: unchecked)"
        out.append(("checkpoint", f"{good.name} (step {count(good.step)}){of}, {said}"))
    elif outcome.checkpoint:
        out.append(("checkpoint", f"{outcome.checkpoint} (not checked good)"))
    else:
        out.append(("checkpoint", "none: nothing to export or continue from"))
    command = f"dflash-tui export {where} --run {shlex.quote(s.run_id)}"
    if best_tau is not None and best_tau.tau is not None:
        out.append(("export", f"{command} --step {best_tau.step}"))
        if good is None or good.step != best_tau.step:
            out.append(
                (
                    "",
                    "(needs a checkpoint at that step; without --step: the last good one)",
                )
            )
    elif good is not None:
        out.append(("export", command))
    return out

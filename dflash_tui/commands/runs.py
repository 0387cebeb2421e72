"""`dflash-tui runs`: the runs under the run root, a row each with how it ended (the
outcome's words, trainer/contract/outcomes.py) and its best held-out τ; `--json` the agent's
records exact (JSON escapes the host's text), `--env` each run's environment under its row."""

from __future__ import annotations

import argparse
import asyncio
import json
from typing import TYPE_CHECKING, Any

from dflash_tui import sanitize
from dflash_tui.commands.actions import over_link
from dflash_tui.commands.demo_root import or_demo
from dflash_tui.commands.options import add_json, add_target, add_where, target_from
from dflash_tui.commands.subcommand import Subcommand
from trainer.contract.protocol import RunInfo
from trainer.contract.typed import encode

if TYPE_CHECKING:
    from dflash_tui.link.link import Link
    from dflash_tui.state import Store


def format_runs(runs: list[RunInfo], env: bool = False) -> str:
    """One row per run, how it ended in the outcome's words (trainer/contract/outcomes.py),
    its best held-out τ; a GPU run on a slow kernel fallback is marked. `env`: each run's
    environment and fast-kernel path under its row (none for a run from before the
    fingerprint)."""
    from dflash_tui.evaluation import best_tau
    from dflash_tui.facts import run_outcome

    rows = ["RUN ID                                         STEPS  BEST TOK/S      BEST τ  OUTCOME"]
    for r in runs:
        best = "—" if r.best_tok_s is None else str(round(r.best_tok_s))
        run_id, outcome = sanitize.field(r.run_id), sanitize.field(run_outcome(r).summary)
        slow = r.preflight is not None and r.preflight.device.startswith("cuda")
        mark = " [slow kernels]" if slow and r.preflight and r.preflight.slow() else ""
        tau = best_tau(r)
        rows.append(f"{run_id[:45]:45s} {r.steps:>6} {best:>11} {tau:>11}  {outcome}{mark}")
        if env:
            env_text = r.environment.describe() if r.environment else "—"
            rows.append(f"    env: {sanitize.field(env_text)}")
            if r.preflight is not None:
                kernels = sanitize.field(r.preflight.summary())
                rows.append(f"    kernels ({sanitize.field(r.preflight.device)}): {kernels}")
    return "\n".join(rows)


def runs_json(run: RunInfo) -> dict[str, Any]:
    """One run of `runs --json`: the agent's record, and how it ended in the outcome's
    words (trainer/contract/outcomes.py) as `runs` prints it."""
    from dflash_tui.facts import run_outcome

    data: dict[str, Any] = encode(run)
    outcome = run_outcome(run)
    data["outcome"] = {"kind": outcome.kind, "summary": outcome.summary}
    return data


def add_options(p: argparse.ArgumentParser) -> None:
    add_target(p)
    add_where(p)
    add_json(p)
    p.add_argument(
        "--env",
        action="store_true",
        help="under each run, its environment and fast-kernel path (config.json)",
    )


def run(args: argparse.Namespace) -> int:
    from dflash_tui import control

    async def job(link: Link, store: Store) -> int:
        runs = await control.list_runs(link, store)
        if args.json:  # exact, as the agent listed them (JSON escapes the host's text)
            print(json.dumps([runs_json(r) for r in runs], default=str))
        else:
            print(format_runs(runs, env=args.env))
        return 0

    return asyncio.run(over_link(or_demo(args, target_from(args, args.target)), args, job))


SUBCOMMANDS = (
    Subcommand("runs", "list runs under the run root and how each ended", add_options, run),
)

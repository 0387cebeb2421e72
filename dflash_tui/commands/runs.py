"""`dflash-tui runs`: the runs under the run root, a row each with how it ended (the
outcome's words, trainer/contract/outcomes.py) and its best held-out τ; `--json` the agent's
records exact (JSON escapes the host's text), `--env` each run's environment under its row;
`--filter TEXT` and `--sort KEY` as the TUI's runs screen has them (dflash_tui/runs_view.py).
On a terminal the columns that fit its width are shown, in priority order."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import sys
from typing import TYPE_CHECKING, Any

from dflash_tui import sanitize
from dflash_tui.commands import oneshot
from dflash_tui.commands.actions import over_link
from dflash_tui.commands.options import add_json, add_target, add_where, target_from
from dflash_tui.commands.subcommand import Subcommand
from trainer.contract.protocol import RunInfo
from trainer.contract.typed import encode

if TYPE_CHECKING:
    from dflash_tui.link.link import Link
    from dflash_tui.state import Store


CLI_COLUMNS = ("id", "steps", "toks", "tau", "outcome")


def format_runs(runs: list[RunInfo], env: bool = False, width: int | None = None) -> str:
    """One row per run, how it ended in the outcome's words (trainer/contract/outcomes.py),
    its best held-out τ; a GPU run on a slow kernel fallback is marked. `width`: only the
    columns that fit it, in priority order (runs_view.py), None: all of them, whole. `env`:
    each run's environment and fast-kernel path under its row (none for a run from before
    the fingerprint)."""
    from dflash_tui.runs_view import fit, plan_columns

    plan = plan_columns(runs, width, CLI_COLUMNS)

    def line(cells: list[tuple[str, int, bool]]) -> str:
        return "  ".join(
            (f"{text:>{w}}" if right else f"{text:<{w}}") for text, w, right in cells
        ).rstrip()

    rows = [line([(c.header, w, c.right) for c, w in plan])]
    for r in runs:
        slow = r.preflight is not None and r.preflight.device.startswith("cuda")
        mark = " [slow kernels]" if slow and r.preflight and r.preflight.slow() else ""
        cells = []
        for c, w in plan:
            text = sanitize.field(c.cell(r) + (mark if c.name == "outcome" else ""))
            cells.append(
                (fit(text, w) if width is not None or c.name == "id" else text, w, c.right)
            )
        rows.append(line(cells))
        if env:
            env_text = r.environment.describe() if r.environment else "—"
            rows.append(f"    env: {sanitize.field(env_text)}")
            if r.preflight is not None:
                kernels = sanitize.field(r.preflight.summary())
                rows.append(f"    kernels ({sanitize.field(r.preflight.device)}): {kernels}")
    return "\n".join(rows)


def terminal_width() -> int | None:
    """The width to fit: $COLUMNS, else the terminal's; None when stdout is no terminal
    (a pipe gets whole rows, for grep)."""
    columns = os.environ.get("COLUMNS", "")
    if columns.isdigit() and int(columns) > 0:
        return int(columns)
    if not sys.stdout.isatty():
        return None
    return shutil.get_terminal_size().columns


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
    p.add_argument(
        "--filter",
        metavar="TEXT",
        default="",
        help="only the runs matching every word (in the id, name, phase, outcome or error); "
        "outcome:KIND for one outcome (running, finished, stopped, crashed, killed, "
        "died_before_start, unknown; a prefix will do)",
    )
    p.add_argument(
        "--sort",
        metavar="KEY",
        default=None,
        help="start (newest first), tok/s, tau, steps (highest first); default: oldest first",
    )


def run(args: argparse.Namespace) -> int:
    from dflash_tui import control, runs_view

    try:  # a bad key or filter is said before any connection
        runs_view.view([], args.filter, args.sort)
    except runs_view.RunsViewError as e:
        oneshot.err(str(e))
        return 2

    async def job(link: Link, store: Store) -> int:
        runs = runs_view.view(await control.list_runs(link, store), args.filter, args.sort)
        if args.json:  # exact, as the agent listed them (JSON escapes the host's text)
            print(json.dumps([runs_json(r) for r in runs], default=str))
        else:
            print(format_runs(runs, env=args.env, width=terminal_width()))
        return 0

    return asyncio.run(over_link(target_from(args, args.target), args, job))


SUBCOMMANDS = (
    Subcommand("runs", "list runs under the run root and how each ended", add_options, run),
)

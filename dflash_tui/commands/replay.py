"""`dflash-tui replay RUN [TARGET] [--at TIME]`: the TUI on the run's replay (escape: live),
or with --headless/--json the status at TIME (dflash_tui/replay_headless.py)."""

from __future__ import annotations

import argparse
import asyncio

from dflash_tui.commands import oneshot
from dflash_tui.commands.options import (
    add_headless,
    add_notify,
    add_target,
    add_theme,
    add_where,
    target_from,
)
from dflash_tui.commands.subcommand import Subcommand
from dflash_tui.commands.watch import monitor


def add_options(p: argparse.ArgumentParser) -> None:
    # the run, then the target; the TUI or the status at --at
    p.add_argument("replay_run", metavar="RUN", help="the run id (`dflash-tui runs`)")
    add_target(p)
    add_where(p, one_shot=False)
    add_headless(p)
    add_notify(p)
    add_theme(p)
    p.add_argument(
        "--at",
        metavar="TIME",
        help="start at TIME: -5m, -1h30m, -90s before the end, a clock time 12:03:00, "
        "or end (default)",
    )


def at_joined(argv: list[str]) -> list[str]:
    """`--at -5m` as `--at=-5m`: argparse takes a value that starts with '-' for an option."""
    out: list[str] = []
    for arg in argv:
        if out and out[-1] == "--at" and arg.startswith("-"):
            out[-1] = f"--at={arg}"
        else:
            out.append(arg)
    return out


def run(args: argparse.Namespace) -> int:
    from dflash_tui.replay import ReplayError, parse_at

    try:
        if args.at is not None:
            parse_at(args.at, 0.0)  # a bad --at is refused before connecting
        target = target_from(args, args.target)
        if not (args.headless or args.json or args.once):
            return asyncio.run(monitor(args, target))  # run_app opens the replay
        from dflash_tui import replay_headless

        work = replay_headless.work(target, args.replay_run, args.at, args.json)
        return asyncio.run(oneshot.with_link(target, work))
    except ReplayError as e:
        oneshot.err(str(e))
        return 2


SUBCOMMANDS = (
    Subcommand(
        "replay",
        "scrub through a run's telemetry with the TUI's panes (--headless: the "
        "status at --at, as `status` prints it)",
        add_options,
        run,
        prepare_argv=at_joined,
    ),
)

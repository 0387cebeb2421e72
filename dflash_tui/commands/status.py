"""`dflash-tui status`: one snapshot of the run (= --headless --once), exit 0/1/2/3; of a
config.toml group, every host's (commands/groups.py); with --run-dir, a run dir diagnosed
after the fact, read by the agent as it reads a live one."""

from __future__ import annotations

import argparse
import asyncio
import posixpath
from pathlib import Path

from dflash_tui.commands import oneshot
from dflash_tui.commands.demo_root import or_demo
from dflash_tui.commands.options import (
    add_json,
    add_notify,
    add_target,
    add_where,
    group_named,
    target_from,
)
from dflash_tui.commands.subcommand import Subcommand
from dflash_tui.commands.watch import monitor


def add_options(p: argparse.ArgumentParser) -> None:
    add_target(p, group=True)
    add_where(p)
    add_json(p)
    add_notify(p)
    p.add_argument(
        "--run-dir",
        help="diagnose this run dir (on TARGET's host; a copied one works too) instead "
        "of the run root's latest: what went wrong here, after the fact",
    )


def run(args: argparse.Namespace) -> int:
    if args.run_dir:
        return status_of_run_dir(args)
    group = group_named(args.target)
    if group is not None:
        from dflash_tui.commands import groups

        return asyncio.run(groups.run("status", group, args))
    target = or_demo(args, target_from(args, args.target))
    args.once = True
    return asyncio.run(monitor(args, target))


def status_of_run_dir(args: argparse.Namespace) -> int:
    """`status --run-dir PATH`: the run root is PATH's folder, the followed run PATH's name;
    the agent reads it as it reads a live one (its readers, its liveness checks)."""
    if args.run_root:
        oneshot.err("--run-dir names the run root itself (its folder): leave out --run-root")
        return 2
    path = args.run_dir.rstrip("/") or "/"
    root, run_id = posixpath.split(path)
    if not run_id or run_id in (".", ".."):
        oneshot.err(
            f"--run-dir {path}: name the run dir itself, e.g. runs/20260101-120000-NAME-abcd"
        )
        return 2
    args.run_root = root or "."
    target = target_from(args, args.target)
    if target.kind == "local":
        here = Path(path)
        marks = ("heartbeat.json", "launch.json", "config.json")
        if not here.is_dir():
            oneshot.err(f"--run-dir {path}: no such directory")
            return 2
        if not any((here / m).is_file() for m in marks):
            oneshot.err(f"--run-dir {path}: not a run dir (none of {', '.join(marks)} in it)")
            return 2
        args.run_root = str(here.resolve().parent)
        target = target_from(args, args.target)
    args.once = True
    return asyncio.run(monitor(args, target, follow=run_id))


SUBCOMMANDS = (
    Subcommand(
        "status", "one snapshot of the run (= --headless --once); exit 0/1/2/3", add_options, run
    ),
)

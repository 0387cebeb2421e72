"""`dflash-tui [TARGET]`, no subcommand: watch the target's run, in the TUI or, headless, as
lines (`--once`: one snapshot, exit 0/1/2/3). A config.toml group is watched as the fleet of
its hosts. `monitor` is the one way in to both views: the demo, status and replay use it.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Callable
from typing import Any

from dflash_tui.commands import oneshot
from dflash_tui.commands.demo_root import or_demo
from dflash_tui.commands.options import (
    add_headless,
    add_notify,
    add_target,
    add_theme,
    add_where,
    group_named,
    target_from,
)
from dflash_tui.targets import Target


def add_options(p: argparse.ArgumentParser) -> None:
    add_target(p)
    add_where(p)
    add_headless(p)
    add_notify(p)
    add_theme(p)


def run(args: argparse.Namespace) -> int:
    from dflash_tui.commands import fleet

    group = group_named(args.target)  # a job over several hosts: its fleet
    if group is not None:
        return asyncio.run(fleet.watch(args, group.hosts))
    return asyncio.run(monitor(args, or_demo(args, target_from(args, args.target))))


def notifier(args: argparse.Namespace, target: Target, on_error: Callable[[str], None]) -> Any:
    """--notify's Notifier (dflash_tui/notify.py), or None without it."""
    from dflash_tui.notify import Notifier

    command = getattr(args, "notify", None)
    return None if command is None else Notifier(command, target.name, on_error)


async def monitor(
    args: argparse.Namespace, target: Target, follow: str = "latest", until_end: bool = False
) -> int:
    """Watch `target` (its run `follow`): headless lines with --headless, --once or --json,
    else the TUI. `until_end`: headless, stop when the run ends (the demo)."""
    from dflash_tui.headless import Headless
    from dflash_tui.notify import NotifyError

    try:
        if args.once or args.headless or args.json:
            return await Headless(
                target, interval=args.interval, as_json=args.json, once=args.once,
                follow=follow, notifier=notifier(args, target, oneshot.err),
                connect_timeout=oneshot.connect_timeout(args), until_end=until_end,
            ).run()  # fmt: skip
        if not (sys.stdin.isatty() and sys.stdout.isatty()):
            # Textual reads keys from a stdin that is not a terminal as fast as it can (at
            # EOF, each read returns at once): one line, not a busy loop.
            oneshot.err(
                "not a terminal: use --headless (or --once) for lines, or run in a terminal"
            )
            return 2
        from dflash_tui.app import run_app
        from dflash_tui.themes import ThemeError

        try:
            return await run_app(target, args)
        except ThemeError as e:
            oneshot.err(str(e))
            return 2
    except NotifyError as e:
        oneshot.err(str(e))
        return 2

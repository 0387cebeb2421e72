"""`dflash-tui fleet`: every target of config.toml on one screen (Enter opens one), or
headless a line each (`--once`: exit with the worst status); a group's hosts the same way."""

from __future__ import annotations

import argparse
import asyncio

from dflash_tui.commands import oneshot
from dflash_tui.commands.options import add_headless, add_theme
from dflash_tui.commands.subcommand import Subcommand


def add_options(p: argparse.ArgumentParser) -> None:
    # its targets are the config's: no target options
    add_headless(p)
    add_theme(p)


def run(args: argparse.Namespace) -> int:
    return asyncio.run(watch(args))


async def watch(args: argparse.Namespace, hosts: tuple[str, ...] | None = None) -> int:
    """The config's targets; none is bad input (fleet.configured_targets says how to add
    one). `hosts`: a group's (`dflash-tui GROUP`), node 0 first: one row per host, Enter
    opens that host's dashboard (its GPUs, its ranks)."""
    from dflash_tui.fleet import configured_targets

    targets = configured_targets(only=hosts)
    if args.once or args.headless or args.json:
        from dflash_tui.fleet_headless import FleetHeadless

        return await FleetHeadless(
            targets, interval=args.interval, as_json=args.json, once=args.once
        ).run()
    from dflash_tui.app_fleet import run_fleet_app
    from dflash_tui.themes import ThemeError

    try:
        return await run_fleet_app(targets, args.theme)
    except ThemeError as e:
        oneshot.err(str(e))
        return 2


SUBCOMMANDS = (
    Subcommand(
        "fleet",
        "every target of ~/.config/dflash-tui/config.toml on one screen (Enter opens "
        "one); --headless --once: a line each, exit with the worst status",
        add_options,
        run,
    ),
)

"""`dflash-tui compare RUN RUN [...] [TARGET]`: what differs in the runs' configs and
environments, and each one's steps, final loss/acc, median tok/s, outcome and best τ
(dflash_tui/compare.py); `--json` the same as one object."""

from __future__ import annotations

import argparse
import asyncio
import json
import re
from typing import TYPE_CHECKING

from dflash_tui.commands import oneshot
from dflash_tui.commands.actions import over_link
from dflash_tui.commands.options import add_json, add_where, target_from
from dflash_tui.commands.subcommand import Subcommand

if TYPE_CHECKING:
    from dflash_tui.link.link import Link
    from dflash_tui.state import Store

RUN_ID_SHAPE = r"^\d{8}-\d{6}-"  # how the agent names run dirs: YYYYMMDD-HHMMSS-NAME-xxxx


def add_options(p: argparse.ArgumentParser) -> None:
    # the run ids, then the target
    p.usage = "dflash-tui compare RUN RUN [RUN ...] [TARGET] [--json] [options]"
    p.add_argument(
        "items",
        nargs="+",
        metavar="RUN",
        help="run ids (two or more; `dflash-tui runs` lists them), then TARGET (default "
        "local): the last one is the target when it is not shaped like a run id",
    )
    add_where(p)
    add_json(p)


def compare_items(items: list[str]) -> tuple[list[str], str | None]:
    """`compare RUN RUN [...] [TARGET]`: (the run ids, the target). The last item is the
    target when it is not shaped like a run id (`local`, `ssh://…`, an alias)."""
    if len(items) >= 2 and not re.match(RUN_ID_SHAPE, items[-1]):
        return items[:-1], items[-1]
    return items, None


def run(args: argparse.Namespace) -> int:
    args.run_ids, args.target = compare_items(args.items)
    if len(args.run_ids) < 2:
        oneshot.err("compare needs two or more run ids (dflash-tui runs lists them)")
        return 2
    target = target_from(args, args.target)
    return asyncio.run(over_link(target, args, lambda link, store: compare_runs(link, store, args)))


async def compare_runs(link: Link, store: Store, args: argparse.Namespace) -> int:
    from dflash_tui import compare, control

    runs = await control.list_runs(link, store)
    try:
        data = await compare.fetch_runs(link, runs, args.run_ids)
    except compare.UnknownRun as e:
        oneshot.err(str(e))
        return 2
    if args.json:
        print(json.dumps(compare.to_json(data), default=str))  # JSON escapes what the host wrote
    else:
        for line in compare.describe(data):
            oneshot.out(line)
    return 0


SUBCOMMANDS = (
    Subcommand(
        "compare",
        "compare two or more runs: what differs in their configs and environments, "
        "and each one's steps, final loss/acc, median tok/s, outcome, best τ",
        add_options,
        run,
    ),
)

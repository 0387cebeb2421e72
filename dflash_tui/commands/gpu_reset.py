"""`dflash-tui gpu-reset TARGET INDEX`: a wedged GPU reset on the host (README: "A wedged
GPU"). The agent refuses while any process holds that GPU or a run lives, runs
`nvidia-smi --gpu-reset -i INDEX`, then reads the GPU through NVML (agent/gpu_reset.py).

Exit 0: reset and NVML reads it; 1: refused, nvidia-smi failed, or NVML still cannot read
it; 2: bad input (no such GPU); 3: the host cannot be reached. Every host string (nvidia-smi's
words, a holder's command line) is printed through sanitize (oneshot.out/err)."""

from __future__ import annotations

import argparse
import asyncio
from typing import TYPE_CHECKING

from dflash_tui.commands import oneshot
from dflash_tui.commands.actions import over_link
from dflash_tui.commands.options import add_where, target_from
from dflash_tui.commands.subcommand import Subcommand

if TYPE_CHECKING:
    from dflash_tui.link.link import Link
    from dflash_tui.state import Store

SUMMARY = (
    "reset a wedged GPU (nvidia-smi --gpu-reset -i INDEX on the host; refused while any "
    "process holds it), then check it through NVML"
)


def gpu_index(text: str) -> int:
    if not text.isdigit():
        raise argparse.ArgumentTypeError(f"{text!r}: a GPU index is a whole number (0, 1, ...)")
    return int(text)


def add_options(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "target",
        metavar="TARGET",
        help="local, ssh://[user@]host[:port], an ssh alias, or a name from config.toml",
    )
    p.add_argument("index", type=gpu_index, metavar="INDEX", help="the GPU's index (nvidia-smi's)")
    add_where(p)


def run(args: argparse.Namespace) -> int:
    from dflash_tui.link.link import LinkError

    async def job(link: Link, store: Store) -> int:
        from dflash_tui import control

        try:
            r = await control.gpu_reset(link, args.index)
        except LinkError as e:
            if type(e) is not LinkError:
                raise  # bad input (no such GPU): exit 2, said by with_link
            oneshot.err(f"GPU {args.index} not reset: {e}")
            return 1
        oneshot.out(f"nvidia-smi: {r.said}")
        if r.before:
            oneshot.out(f"before the reset: {r.before}")
        oneshot.out(r.check)
        return 0 if r.ok else 1

    return asyncio.run(over_link(target_from(args, args.target), args, job))


SUBCOMMANDS = (Subcommand("gpu-reset", SUMMARY, add_options=add_options, run=run),)

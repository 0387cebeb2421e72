"""`dflash-tui explain [CODE]`: a finding code's entry from the rules' registry, or every
code's line (dflash_tui/diagnosis/docs.py). An unknown code: one line with the nearest, exit 2."""

from __future__ import annotations

import argparse

from dflash_tui.commands import oneshot
from dflash_tui.commands.subcommand import Subcommand


def add_options(p: argparse.ArgumentParser) -> None:
    # the registry's text: no host, no target options
    p.add_argument(
        "code", nargs="?", metavar="CODE", help="a finding code (default: list them all)"
    )


def run(args: argparse.Namespace) -> int:
    from dflash_tui.diagnosis import docs

    code = args.code
    if code is None:
        print(docs.listing())
        return 0
    if code not in docs.codes():
        near = docs.nearest(code)
        hint = f"did you mean {' or '.join(near)}?" if near else "`dflash-tui explain` lists them"
        oneshot.err(f"unknown finding code {code!r}: {hint}")
        return 2
    print(docs.explain(code))
    return 0


SUBCOMMANDS = (
    Subcommand(
        "explain",
        "what a finding code means, how it is decided (thresholds at their defaults) "
        "and what to do; without CODE, every code with its summary",
        add_options,
        run,
    ),
)

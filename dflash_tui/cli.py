"""`dflash-tui`: the operator's monitor and control for DFlash training runs.

    dflash-tui [TARGET] [--run-root DIR] [--remote-dir DIR] [--pct CTID | --exec-prefix CMD]
               [--python PATH] [--identity FILE] [--known-hosts FILE]
               [--headless [--once] [--json] [--interval S]]
    dflash-tui demo [--headless]
    dflash-tui fleet [--headless [--once] [--json] [--interval S]]
    dflash-tui {deploy,launch,kill,restart,status,runs,dump-stacks,clear-cache,pull-cache,
                export} [TARGET] [options]
    dflash-tui compare RUN RUN [...] [TARGET] [--json]
    dflash-tui replay RUN [TARGET] [--at TIME]
    dflash-tui explain [CODE]

The dispatcher only: each subcommand is a module of dflash_tui/commands/ that gives its
summary, its options and its work (`Subcommand`); this builds the parsers from them and calls
the chosen one. Without a command, TARGET is watched (commands/watch.py). A first word close
to a command that names no host is refused as a slip (commands/slips.py). Nothing here, nor in
the command modules as they load, imports torch or textual, so `--help` is instant.
"""

from __future__ import annotations

import argparse
import sys

from dflash_tui.commands import (
    actions,
    compare,
    demo,
    explain,
    fleet,
    gpu_reset,
    oneshot,
    replay,
    runs,
    status,
    watch,
)
from dflash_tui.commands.options import DEFAULTS
from dflash_tui.commands.slips import slip
from dflash_tui.commands.subcommand import Subcommand
from dflash_tui.targets import TargetError

_BY_NAME: dict[str, Subcommand] = {
    c.name: c
    for module in (actions, compare, demo, explain, fleet, gpu_reset, replay, runs, status)
    for c in module.SUBCOMMANDS
}
# The order `dflash-tui --help` lists them in (a command missing here fails at import).
ORDER = (
    "demo",
    "deploy",
    "launch",
    "kill",
    "restart",
    "status",
    "runs",
    "dump-stacks",
    "clear-cache",
    "pull-cache",
    "fleet",
    "compare",
    "replay",
    "export",
    "gpu-reset",
    "explain",
)
SUBCOMMANDS = {name: _BY_NAME[name].summary for name in sorted(_BY_NAME, key=ORDER.index)}


def build_parser() -> argparse.ArgumentParser:
    """The parser of `dflash-tui [TARGET] …`: no subcommand, the target watched."""
    p = argparse.ArgumentParser(
        prog="dflash-tui",
        description="Live monitor and debugger for DFlash drafter training runs.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="commands:\n"
        + "\n".join(f"  {k:12s} {v}" for k, v in SUBCOMMANDS.items())
        + "\n\nWithout a command: monitor TARGET.",
    )
    p.set_defaults(**DEFAULTS)
    watch.add_options(p)
    return p


def build_command_parser(name: str) -> argparse.ArgumentParser:
    command = _BY_NAME[name]
    p = argparse.ArgumentParser(prog=f"dflash-tui {name}", description=command.summary)
    p.set_defaults(**DEFAULTS)
    command.add_options(p)
    return p


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    name = argv[0] if argv and argv[0] in SUBCOMMANDS else None
    slipped = slip(argv[0], SUBCOMMANDS) if argv and name is None else None
    if slipped is not None:
        oneshot.err(f"unknown command {argv[0]!r}: did you mean {slipped}?")
        return 2
    try:
        if name is not None:
            command = _BY_NAME[name]
            argv.remove(name)
            if command.prepare_argv is not None:
                argv = command.prepare_argv(argv)
            return command.run(build_command_parser(name).parse_args(argv))
        args = build_parser().parse_args(argv)
        slipped = slip(args.target, SUBCOMMANDS) if args.target else None  # `--headless stauts`
        if slipped is not None:
            oneshot.err(f"unknown command {args.target!r}: did you mean {slipped}?")
            return 2
        return watch.run(args)
    except TargetError as e:
        oneshot.err(str(e))
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())

"""`dflash-tui`: the operator's monitor and control for DFlash training runs.

Only the argument surface lives here; each subcommand's work is in its own module, imported
when it runs, so `dflash-tui --help` starts instantly and never imports torch or textual.
"""

from __future__ import annotations

import argparse
import sys

# name -> (one-line help, built yet?)
SUBCOMMANDS: dict[str, tuple[str, bool]] = {
    "demo": ("train the bundled tiny CPU drafter locally and monitor it live", False),
    "deploy": ("ship trainer/ and the agent to the host, record the code's sha256", False),
    "launch": ("start a run in a fresh run dir (refused while one is alive)", False),
    "kill": ("SIGTERM the run's process group, then SIGKILL; wait for GPU memory", False),
    "restart": ("kill, wait for memory to drain, launch again with the same config", False),
    "status": ("one-shot state of the run: phase, step, tok/s, GPUs, findings", False),
    "runs": ("list runs under the run root and how each ended", False),
    "dump-stacks": ("SIGUSR1 the trainer and print every thread's stack", False),
    "clear-cache": ("delete the compile cache (refused while a run is alive)", False),
}


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="dflash-tui",
        description="Live monitor and debugger for DFlash drafter training runs.",
        epilog="Without a subcommand: open the monitor on TARGET (an ssh host or alias, or "
        "'local').",
    )
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    for name, (text, built) in SUBCOMMANDS.items():
        sub.add_parser(name, help=text if built else f"{text} [planned]")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command is None:
        build_parser().print_help()
        return 0
    print(f"dflash-tui {args.command}: planned, not built yet", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())

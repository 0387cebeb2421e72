"""The agent's arguments and its two modes: serve (stream events, take commands) and wrap."""

from __future__ import annotations

import argparse
import contextlib
import sys

from trainer.contract.protocol import TAIL_BYTES

SWITCH_INTERVAL_S = 0.0005


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="dflash_agent")
    sub = p.add_subparsers(dest="mode")
    w = sub.add_parser("wrap", help="the detached parent of one trainer run (launch uses it)")
    w.add_argument("--run-dir", required=True)
    w.add_argument("--lock-fd", type=int, default=-1)
    w.add_argument("--cwd", default=None)
    w.add_argument("argv", nargs=argparse.REMAINDER)
    p.add_argument("--run-root", default="~/dflash/runs")
    p.add_argument("--remote-dir", default="~/dflash")
    p.add_argument("--python", default=None, help="interpreter for launched trainers")
    p.add_argument("--gpu-interval", type=float, default=1.0)
    p.add_argument("--host-interval", type=float, default=5.0)
    p.add_argument(
        "--poll-interval",
        type=float,
        default=0.01,
        help="file poll period when inotify is not available",
    )
    p.add_argument("--no-inotify", action="store_true", help="poll instead (for tests)")
    p.add_argument(
        "--sampler-threads",
        action="store_true",
        help="sample as threads of the agent, not a process of their own (bench/agent_latency.py)",
    )
    p.add_argument("--tail-bytes", type=int, default=TAIL_BYTES)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    # Imported per mode: the wrapper lives as long as its run and needs none of the loop.
    if args.mode == "wrap":
        from dflash_tui.agent.wrap import wrap

        return wrap(args)
    from dflash_tui.agent.loop import Agent
    from dflash_tui.agent.output import Out

    # The loop wakes on a new line holding nothing; a command's thread (a kill's /proc
    # scans), or the samplers where they could not have a process of their own
    # (sampler_process.py), holds the GIL in Python for milliseconds. Python's default 5 ms
    # switch interval let each hold a line back that long; at 0.5 ms it waits for less.
    sys.setswitchinterval(SWITCH_INTERVAL_S)

    with contextlib.suppress(KeyboardInterrupt):
        Agent(args, Out()).run()
    return 0

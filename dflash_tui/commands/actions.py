"""The one-shot commands that act on one host: deploy, pull-cache, launch, kill, restart,
dump-stacks, export, clear-cache. Each runs over one fresh link (oneshot.with_link: a host
it cannot reach is the answer, exit 3); a ControlError is bad input, exit 2. Launch, kill,
restart and dump-stacks of a config.toml group act on its every host (commands/groups.py).

The work itself is control.py's, the TUI's path too: both send the same commands.
"""

from __future__ import annotations

import argparse
import asyncio
from pathlib import Path
from typing import TYPE_CHECKING

from dflash_tui import sanitize
from dflash_tui.commands import oneshot
from dflash_tui.commands.options import (
    GROUP_COMMANDS,
    add_target,
    add_where,
    group_named,
    target_from,
)
from dflash_tui.commands.subcommand import Subcommand
from dflash_tui.targets import Target
from trainer.contract.protocol import Kill

if TYPE_CHECKING:
    from dflash_tui.link.link import Link
    from dflash_tui.state import Store

SUMMARIES = {
    "deploy": "ship trainer/ and the agent to the host, record the code's sha256",
    "launch": "start a run in a fresh run dir (refused while one is alive)",
    "kill": "SIGTERM the run's process group, then SIGKILL; wait for GPU memory",
    "restart": "kill, wait for memory to drain, launch the same config again, continuing "
    "from the run's newest good checkpoint (--fresh: from step 0; --more-steps N: a finished "
    "run N steps further; --set/--drop: edit the launch's overrides; --deploy: on this "
    "tree's code, checked to import first)",
    "dump-stacks": "SIGUSR1 the trainer and print every thread's stack",
    "clear-cache": "delete the compile cache (refused while a run is alive)",
    "pull-cache": "copy the compile-cache artifacts (code: pull from your own hosts only) "
    "the host's GPU runs saved, for deploy to ship",
    "export": "write the run's drafter (newest good checkpoint, or --step) as SpecForge and "
    "SGLang load it, into <remote-dir>/exports/ on the host",
}


def add_options(p: argparse.ArgumentParser, name: str) -> None:
    add_target(p, group=name in GROUP_COMMANDS)
    add_where(p)
    if name == "launch":
        p.add_argument("--config", required=True, type=Path, help="TOML config (local file)")
        add_overrides(p)
    if name in ("kill", "restart"):
        defaults = Kill()  # the contract's defaults, as the TUI sends them
        p.add_argument(
            "--timeout",
            type=float,
            default=None,
            help=f"seconds between SIGTERM and SIGKILL (default {defaults.timeout_s:.0f})",
        )
        p.add_argument(
            "--drain-timeout",
            type=float,
            default=None,
            help=f"seconds to wait for GPU memory release (default {defaults.drain_timeout_s:.0f})",
        )
    if name in ("kill", "restart", "dump-stacks"):
        p.add_argument("--run", dest="run_id", help="run id (default: the alive run)")
    if name == "export":
        p.add_argument(
            "--run", dest="run_id", help="run id (default: the alive run, else the latest)"
        )
        p.add_argument("--step", type=int, help="this checkpoint (default: the newest good one)")
        p.add_argument(
            "--dtype",
            choices=("bfloat16", "float32"),
            default="bfloat16",
            help="(default bfloat16)",
        )
    if name == "restart":
        p.add_argument(
            "--fresh",
            action="store_true",
            help="start from step 0 instead of the newest good checkpoint",
        )
        p.add_argument(
            "--more-steps",
            type=more_steps,
            default=0,
            metavar="N",
            help="continue the run's final checkpoint N steps further, as a new run "
            "(train.max_steps raised by N, the data position carried on; the learning rate "
            "holds the schedule's final value)",
        )
        p.add_argument(
            "--new-schedule",
            action="store_true",
            help="with --more-steps: a new warmup and cosine over the N steps instead",
        )
        add_overrides(p, "the new run's override of KEY: replaces the launch's, else added")
        p.add_argument(
            "--drop",
            dest="drops",
            action="append",
            default=[],
            metavar="KEY",
            help="launch the new run without the launch's override of KEY (repeatable): a run "
            "that died before its first step of a bad --set",
        )
        add_redeploy(p)
    if name == "dump-stacks":
        p.add_argument("--no-pyspy", action="store_true", help="skip py-spy even if present")
    if name == "deploy":
        p.add_argument(
            "--no-compile-cache",
            action="store_true",
            help="do not ship the compile-cache artifacts pulled with pull-cache",
        )


def add_redeploy(p: argparse.ArgumentParser) -> None:
    """restart --deploy: ship this tree first, and restart on it only once it imports."""
    p.add_argument(
        "--deploy",
        action="store_true",
        help="first ship this tree's trainer as a new release (not yet current), have the "
        "host import it, and only then stop the run with a checkpoint and resume it on the "
        "new release; a release that does not import is refused, the run left running",
    )


def more_steps(text: str) -> int:
    """--more-steps: a whole number of steps, at least 1."""
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number of steps") from None
    if n < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: must be at least 1")
    return n


def check_restart(args: argparse.Namespace) -> None:
    """--more-steps continues a checkpoint: not with --fresh; --new-schedule only with it;
    each --set is KEY=VALUE."""
    from dflash_tui.control import ControlError

    if args.new_schedule and not args.more_steps:
        raise ControlError("--new-schedule: only with --more-steps N")
    if args.more_steps and args.fresh:
        raise ControlError("--more-steps continues the final checkpoint: not with --fresh")
    from dflash_tui.restart_edits import set_errors

    bad = set_errors(args.overrides)  # the values are checked against the run's config
    if bad:
        raise ControlError("\n".join(bad))


def add_overrides(p: argparse.ArgumentParser, what: str = "config override") -> None:
    """--set KEY=VALUE: launch's, the demo's and restart's."""
    p.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help=f"{what} (repeatable)",
    )


def run(name: str, args: argparse.Namespace) -> int:
    if name == "launch" and not config_ok(args):
        return 2
    if name in GROUP_COMMANDS:
        group = group_named(args.target)
        if group is not None and getattr(args, "deploy", False):
            oneshot.err(f"restart --deploy: one host at a time, not the group {group.name}")
            return 2
        if group is not None:
            from dflash_tui.commands import groups

            return asyncio.run(groups.run(name, group, args))
    target = target_from(args, args.target)
    return asyncio.run(over_link(target, args, work(name, args)))


def config_ok(args: argparse.Namespace) -> bool:
    """launch's --config and every --set checked before any host is reached: each bad one
    is a line (`config: KEY = VALUE: rule`)."""
    from dflash_tui import control

    try:
        text, _ = control.read_config(args.config)
        control.check_overrides(args.overrides, text)
    except control.ControlError as e:
        oneshot.err(str(e))
        return False
    return True


async def over_link(target: Target, args: argparse.Namespace, job: oneshot.Work) -> int:
    """`job` over one fresh link to `target`; a ControlError is bad input: exit 2."""
    from dflash_tui.control import ControlError

    try:
        return await oneshot.with_link(target, job, connect_timeout=oneshot.connect_timeout(args))
    except ControlError as e:
        oneshot.err(str(e))
        return 2


def work(name: str, args: argparse.Namespace) -> oneshot.Work:
    """What subcommand `name` does over a connected link (tests call it with a fake link)."""
    from dflash_tui import control

    async def job(link: Link, store: Store) -> int:
        if name == "deploy":
            d = await control.deploy(link, oneshot.progress, not args.no_compile_cache)
            oneshot.out(
                f"deployed {d['files']} files, code sha256 {d['sha256'][:16]}… -> {d['release']}"
            )
            for shipped in d["artifacts"]:
                oneshot.out(f"shipped compile-cache artifacts {shipped}: a fresh host starts warm")
        elif name == "pull-cache":
            pulled = await control.pull_artifacts(link)
            for path, size in pulled:
                oneshot.out(f"pulled {path.name} ({size / 1e6:.1f} MB) into {path.parent}")
            if not pulled:
                oneshot.out(
                    "no compile-cache artifacts on the host yet "
                    "(a GPU run saves them after its warm-up)"
                )
        elif name == "launch":
            run = await control.launch(link, args.config, args.overrides, oneshot.progress)
            oneshot.out(
                f"launched {run.run_id} in {run.run_dir}"
                + ("" if run.started else f" ({run.note})")
            )
        elif name == "kill":
            k = await control.kill(
                link, args.run_id, args.timeout, args.drain_timeout, oneshot.progress
            )
            drain = (
                "n/a (no GPU)"
                if k.drain_s is None and not k.gpu_held_by
                else f"{k.drain_s:.1f}s"
                if k.drain_s is not None
                else f"still held by pids {k.gpu_held_by}"
            )
            oneshot.out(
                f"{k.run_id} {k.describe()}; {k.stop_s:.1f}s; GPU memory "
                f"released: {drain}; orphans: {k.orphans or 'none'}"
            )
            return 0 if not k.orphans and not k.gpu_held_by else 1
        elif name == "restart":
            check_restart(args)
            run_id, overrides = args.run_id, None
            if args.overrides or args.drops:  # refused here, before anything is stopped
                from dflash_tui.restart_edits import edited_for

                edit = await edited_for(link, store, run_id, args.overrides, args.drops)
                run_id, overrides = edit.run_id, edit.overrides
                oneshot.out(f"{run_id}: the new run's overrides: {' '.join(overrides) or 'none'}")
            release = await ship_release(link) if args.deploy else None
            r = await control.restart(
                link,
                run_id,
                args.timeout,
                args.drain_timeout,
                oneshot.progress,
                args.fresh,
                overrides=overrides,
                more_steps=args.more_steps,
                new_schedule=args.new_schedule,
                release=release,
            )
            if r.killed is not None:
                oneshot.out(f"{r.killed.run_id} {r.killed.describe()}")
            oneshot.out(r.describe())
        elif name == "dump-stacks":
            st = await control.dump_stacks(link, not args.no_pyspy, args.run_id)
            print(sanitize.lines(st.text))
            if st.pyspy:
                print("# py-spy dump --native\n" + sanitize.lines(st.pyspy))
            if st.seconds is not None:
                print(f"# {st.kind} dump of pid {st.pid}, {st.seconds:.2f}s after the signal")
        elif name == "export":
            e = await control.export(link, args.run_id, args.step, args.dtype)
            oneshot.out(e.said or f"exported {e.run_id} step {e.step}")
            oneshot.out(f"on the host: {e.out}")
        elif name == "clear-cache":
            c = await control.clear_cache(link)
            oneshot.out(
                f"removed {c.path} ({c.bytes / 1e6:.1f} MB)"
                if c.existed
                else f"no compile cache at {c.path}"
            )
        return 0

    return job


async def ship_release(link: Link) -> str:
    """restart --deploy's first step: this tree as a release beside `current` -> its sha256."""
    from dflash_tui import control

    d = await control.deploy(link, oneshot.progress, ship_artifacts=False, make_current=False)
    oneshot.out(f"shipped {d['files']} files as release {d['sha256'][:16]} (not current yet)")
    return str(d["sha256"])


def subcommand(name: str) -> Subcommand:
    return Subcommand(
        name,
        SUMMARIES[name],
        add_options=lambda p: add_options(p, name),
        run=lambda args: run(name, args),
    )


SUBCOMMANDS = tuple(subcommand(name) for name in SUMMARIES)

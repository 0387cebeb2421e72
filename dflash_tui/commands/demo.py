"""`dflash-tui demo`: deploy the trainer locally, launch the bundled tiny CPU config and watch
it as the plain command watches (the TUI, or headless until the run ends)."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from dflash_tui import sanitize
from dflash_tui.commands import oneshot
from dflash_tui.commands.actions import add_overrides
from dflash_tui.commands.demo_root import demo_remote_dir
from dflash_tui.commands.options import add_headless, add_notify, add_theme, add_where
from dflash_tui.commands.subcommand import Subcommand
from dflash_tui.commands.watch import monitor
from dflash_tui.targets import Target, resolve_target
from trainer.builtins.prebuilt import CHECKOUT_DIR, PREBUILT_ENV
from trainer.contract.typed import read_bounded

if TYPE_CHECKING:
    from dflash_tui.link.link import Link
    from dflash_tui.state import Store


def add_options(p: argparse.ArgumentParser) -> None:
    # local, watched as the plain command watches (TUI or headless)
    add_where(p, remote=False, remote_dir=demo_remote_dir())
    add_headless(p, once=False)
    add_notify(p)
    add_theme(p)
    add_overrides(p)


def demo_target(args: argparse.Namespace) -> Target:
    """The local host, the demo's own remote dir (under XDG_STATE_HOME) unless given."""
    remote = args.remote_dir or demo_remote_dir()
    return resolve_target(
        "local", run_root=args.run_root, remote_dir=remote, python=args.python or sys.executable
    )


def deployed_here(remote: Path) -> str | None:
    """The code hash when the demo's remote dir (local) runs this checkout's trainer already:
    deployed.json names it, `current` is its release, and that release hashes to it."""
    from dflash_tui.control import TRAINER_DIR
    from trainer.contract.codehash import code_hash

    raw = read_bounded(remote / "deployed.json", 65536)  # a FIFO there would block the demo
    try:
        sha = json.loads(raw)["sha256"] if isinstance(raw, bytes) else None
    except (ValueError, RecursionError, KeyError, TypeError):
        return None
    if not isinstance(sha, str) or sha != code_hash(TRAINER_DIR):
        return None
    current = remote / "current"
    if current.resolve() != (remote / "releases" / sha[:16]).resolve():
        return None
    return sha if code_hash(current / "trainer") == sha else None


def run(args: argparse.Namespace) -> int:
    return asyncio.run(demo(args))


async def demo(args: argparse.Namespace) -> int:
    from dflash_tui import control
    from dflash_tui.control import TRAINER_DIR

    config = TRAINER_DIR / "configs" / "demo-cpu.toml"
    try:  # every bad --set, a line each, before anything is deployed
        control.check_overrides(args.overrides, config.read_text())
    except control.ControlError as e:
        oneshot.err(str(e))
        return 2
    # The trainer runs from a deployed release: it finds the checkout's prebuilt target and
    # data through the environment the local agent passes on (trainer/builtins/prebuilt.py).
    os.environ.setdefault(PREBUILT_ENV, str(CHECKOUT_DIR))
    target = demo_target(args)
    print(f"demo: the tiny CPU trainer in {target.remote_dir}", file=sys.stderr)
    launched: list[str] = []

    async def work(link: Link, store: Store) -> int:
        same = deployed_here(Path(target.remote_dir).expanduser())
        if same is not None:  # a warm start: this very code is current there (~3 s saved)
            print(f"demo: trainer {same[:12]} already deployed", file=sys.stderr)
        else:
            r = await control.deploy(link)
            print(f"demo: deployed trainer {sanitize.field(r['sha256'][:12])}", file=sys.stderr)
        try:
            run = await control.launch(link, config, args.overrides, oneshot.progress)
            print(f"demo: launched {sanitize.field(run.run_id)}", file=sys.stderr)
            launched.append(run.run_id)
        except Exception as e:
            if "is alive" not in str(e):
                raise
            print("demo: a demo run is already alive; monitoring it", file=sys.stderr)
        return 0

    try:
        code = await oneshot.with_link(target, work)
    except control.ControlError as e:  # the agent's answer read as bad input
        oneshot.err(str(e))
        return 2
    if code != 0:
        return code
    args.once = False
    # Headless, the demo is over when its run is: the outcome line, and 0 only if it finished.
    follow = launched[0] if launched else "latest"
    headless = args.headless or args.json
    code = await monitor(args, target, follow=follow, until_end=headless)
    if headless:
        return code
    print(quit_words(target, follow), file=sys.stderr)
    return code


def quit_words(target: Target, run_id: str) -> str:
    """What quitting the demo's TUI leaves: a run that goes on (and how to stop it), or one
    that has ended already (its exit.json is there: nothing goes on)."""
    root = Path(target.effective_run_root)
    if run_id == "latest":  # a demo run was alive already: the newest launched one
        launched = sorted(p.parent.name for p in root.glob("*/launch.json"))
        run_id = launched[-1] if launched else ""
    if run_id and (root / run_id / "exit.json").exists():
        return f"demo: run {sanitize.field(run_id)} has ended; its files are in {root / run_id}"
    return (
        "demo: the run goes on until it finishes; stop it with: dflash-tui kill local "
        f"--remote-dir {target.remote_dir}"
    )


SUBCOMMANDS = (
    Subcommand(
        "demo",
        "train the bundled tiny CPU drafter locally and monitor it live",
        add_options,
        run,
    ),
)

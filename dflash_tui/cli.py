"""`dflash-tui`: the operator's monitor and control for DFlash training runs.

    dflash-tui [TARGET] [--run-root DIR] [--remote-dir DIR] [--pct CTID | --exec-prefix CMD]
               [--python PATH] [--identity FILE] [--known-hosts FILE]
               [--headless [--once] [--json] [--interval S]]
    dflash-tui demo [--headless]
    dflash-tui fleet [--headless [--once] [--json] [--interval S]]
    dflash-tui {deploy,launch,kill,restart,status,runs,dump-stacks,clear-cache,pull-cache,
                export} [TARGET] [options]
    dflash-tui compare RUN RUN [...] [TARGET] [--json]
    dflash-tui replay RUN [TARGET] [--at TIME] [--headless [--json]]
    dflash-tui explain [CODE]

Each command's parser lists only the options it reads (the rest keep `_DEFAULTS`). A first
word close to a command that names no host is refused as a slip (cli_slips.py). One-shot
commands get no retry: a host they cannot reach is their answer, exit 3, at once (their
lines and their link: cli_io.py, which groups.py shares).

Only the argument surface lives here; the work is in control, headless and the link. Nothing
here imports torch or textual, so `--help` is instant.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dflash_tui import cli_io, sanitize
from dflash_tui.targets import Target, TargetError, resolve_target
from trainer.contract.protocol import Kill, RunInfo
from trainer.contract.typed import encode

if TYPE_CHECKING:
    from dflash_tui.link.link import Link
    from dflash_tui.state import Store

SUBCOMMANDS = {
    "demo": "train the bundled tiny CPU drafter locally and monitor it live",
    "deploy": "ship trainer/ and the agent to the host, record the code's sha256",
    "launch": "start a run in a fresh run dir (refused while one is alive)",
    "kill": "SIGTERM the run's process group, then SIGKILL; wait for GPU memory",
    "restart": "kill, wait for memory to drain, launch the same config again, continuing "
    "from the run's newest good checkpoint (--fresh: from step 0)",
    "status": "one snapshot of the run (= --headless --once); exit 0/1/2/3",
    "runs": "list runs under the run root and how each ended",
    "dump-stacks": "SIGUSR1 the trainer and print every thread's stack",
    "clear-cache": "delete the compile cache (refused while a run is alive)",
    "pull-cache": "copy the compile-cache artifacts (code: pull from your own hosts only) "
    "the host's GPU runs saved, for deploy to ship",
    "fleet": "every target of ~/.config/dflash-tui/config.toml on one screen (Enter opens "
    "one); --headless --once: a line each, exit with the worst status",
    "compare": "compare two or more runs: what differs in their configs and environments, "
    "and each one's steps, final loss/acc, median tok/s, outcome, best τ",
    "replay": "scrub through a run's telemetry with the TUI's panes (--headless: the "
    "status at --at, as `status` prints it)",
    "export": "write the run's drafter (newest good checkpoint, or --step) as SpecForge and "
    "SGLang load it, into <remote-dir>/exports/ on the host",
    "explain": "what a finding code means, how it is decided (thresholds at their defaults) "
    "and what to do; without CODE, every code with its summary",
}


# Every option any command reads, with the value it has where that command does not list it:
# each subcommand's --help shows only its own options (issue 16), the code reads them all.
_DEFAULTS: dict[str, Any] = {
    "target": None,
    "run_root": None,
    "remote_dir": None,
    "pct": None,
    "exec_prefix": None,
    "python": None,
    "identity": None,
    "known_hosts": None,
    "connect_timeout": None,
    "headless": False,
    "once": False,
    "json": False,
    "interval": 2.0,
    "notify": None,
    "theme": None,
}
# What a TARGET that names a config.toml group does over all its hosts (dflash_tui/groups.py).
GROUP_COMMANDS = ("launch", "kill", "restart", "status", "dump-stacks")


def _positive(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"{text!r}: must be > 0")
    return value


def _target(p: argparse.ArgumentParser, group: bool = False) -> None:
    p.add_argument(
        "target",
        nargs="?",
        default=None,
        metavar="TARGET" + ("|GROUP" if group else ""),
        help="local (default), ssh://[user@]host[:port], an ssh alias, or a "
        "name from ~/.config/dflash-tui/config.toml"
        + (
            "; or a [groups.NAME] of it: the whole job over its hosts, each through its own "
            "connection, node 0 = the first host (README: The monitor)"
            if group
            else ""
        ),
    )


def _where(p: argparse.ArgumentParser, remote: bool = True, one_shot: bool = True) -> None:
    """Where the runs are; `remote`: how to get there (not for the local demo)."""
    g = p.add_argument_group("where")
    g.add_argument("--run-root", help="where runs live (default: <remote-dir>/runs)")
    g.add_argument("--remote-dir", help="where deploy puts the trainer (default: ~/dflash)")
    if remote:
        pre = g.add_mutually_exclusive_group()
        pre.add_argument("--pct", metavar="CTID", help="run remote commands as pct exec CTID --")
        pre.add_argument("--exec-prefix", metavar="CMD", help="e.g. 'docker exec -i NAME'")
    g.add_argument("--python", help="interpreter for the agent and trainer there")
    if remote:
        g.add_argument("--identity", help="SSH private key file")
        g.add_argument(
            "--known-hosts",
            help="known_hosts file (checking is always on; ssh config's "
            "StrictHostKeyChecking accept-new is honoured, 'no' is refused)",
        )
    if remote and one_shot:
        g.add_argument(
            "--connect-timeout",
            type=_positive,
            metavar="S",
            help=f"seconds the host has to answer before this command gives up (default "
            f"{cli_io.CONNECT_S:g}; watching, the TUI keeps retrying instead)",
        )


def _headless(p: argparse.ArgumentParser, once: bool = True) -> None:
    h = p.add_argument_group("headless")
    h.add_argument("--headless", action="store_true", help="print lines, no screen")
    if once:
        h.add_argument("--once", action="store_true", help="one snapshot, then exit 0/1/2/3")
    h.add_argument("--json", action="store_true", help="JSON lines instead of text")
    h.add_argument("--interval", type=float, default=2.0, help="seconds between lines")


def _notify(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--notify",
        metavar="CMD",
        help="run CMD (sh -c) with a JSON finding on stdin when a critical finding appears "
        "or clears (headless, --once and the TUI), e.g. 'curl -s -d @- https://ntfy.sh/mine'",
    )


def _theme(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--theme",
        help="TUI theme: dark, light, high-contrast or one of yours (remembered; `t` cycles)",
    )


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="dflash-tui",
        description="Live monitor and debugger for DFlash drafter training runs.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="commands:\n"
        + "\n".join(f"  {k:12s} {v}" for k, v in SUBCOMMANDS.items())
        + "\n\nWithout a command: monitor TARGET.",
    )
    p.set_defaults(**_DEFAULTS)
    _target(p)
    _where(p)
    _headless(p)
    _notify(p)
    _theme(p)
    return p


def build_command_parser(name: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=f"dflash-tui {name}", description=SUBCOMMANDS[name])
    p.set_defaults(**_DEFAULTS)
    if name == "explain":  # the registry's text: no host, no target options
        p.add_argument(
            "code", nargs="?", metavar="CODE", help="a finding code (default: list them all)"
        )
        return p
    if name == "fleet":  # its targets are the config's: no target options
        _headless(p)
        _theme(p)
        return p
    if name == "demo":  # local, watched as the plain command watches (TUI or headless)
        _where(p, remote=False)
        _headless(p, once=False)
        _notify(p)
        _theme(p)
    elif name == "replay":  # the run, then the target; the TUI or the status at --at
        p.add_argument("replay_run", metavar="RUN", help="the run id (`dflash-tui runs`)")
        _target(p)
        _where(p, one_shot=False)
        _headless(p)
        _notify(p)
        _theme(p)
        p.add_argument(
            "--at",
            metavar="TIME",
            help="start at TIME: -5m, -1h30m, -90s before the end, a clock time 12:03:00, "
            "or end (default)",
        )
    elif name == "compare":  # the run ids, then the target
        p.usage = "dflash-tui compare RUN RUN [RUN ...] [TARGET] [--json] [options]"
        p.add_argument(
            "items",
            nargs="+",
            metavar="RUN",
            help="run ids (two or more; `dflash-tui runs` lists them), then TARGET (default "
            "local): the last one is the target when it is not shaped like a run id",
        )
        _where(p)
    else:
        _target(p, group=name in GROUP_COMMANDS)
        _where(p)
    if name in ("status", "runs", "compare"):
        p.add_argument("--json", action="store_true", help="JSON instead of text")
    if name == "status":
        _notify(p)
    if name == "launch":
        p.add_argument("--config", required=True, type=Path, help="TOML config (local file)")
    if name in ("launch", "demo"):
        p.add_argument(
            "--set",
            dest="overrides",
            action="append",
            default=[],
            metavar="KEY=VALUE",
            help="config override (repeatable)",
        )
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
    if name == "runs":
        p.add_argument(
            "--env",
            action="store_true",
            help="under each run, its environment and fast-kernel path (config.json)",
        )
    if name == "dump-stacks":
        p.add_argument("--no-pyspy", action="store_true", help="skip py-spy even if present")
    if name == "status":
        p.add_argument(
            "--run-dir",
            help="diagnose this run dir (on TARGET's host; a copied one works too) instead "
            "of the run root's latest: what went wrong here, after the fact",
        )
    if name == "deploy":
        p.add_argument(
            "--no-compile-cache",
            action="store_true",
            help="do not ship the compile-cache artifacts pulled with pull-cache",
        )
    return p


def target_from(args: argparse.Namespace, text: str | None) -> Target:
    """The target, its ssh config checked up front: a config that would turn host-key
    checking off is refused here, in one line, exit 2 (link/hostkeys.py)."""
    from dflash_tui.link.hostkeys import host_key_policy
    from dflash_tui.targets import group_names

    if text and text in group_names():
        raise TargetError(
            f"{text} is a group of hosts: {', '.join(GROUP_COMMANDS)} act on it; "
            f"`dflash-tui {text}` watches its hosts"
        )
    target = resolve_target(
        text,
        run_root=args.run_root,
        remote_dir=args.remote_dir,
        pct=args.pct,
        prefix=args.exec_prefix,
        python=args.python,
        identity=args.identity,
        known_hosts=args.known_hosts,
    )
    if target.kind == "ssh":
        host_key_policy(target)
    return target


def _fmt_runs(runs: list[RunInfo], env: bool = False) -> str:
    """One row per run, how it ended in the outcome's words (trainer/contract/outcomes.py),
    its best held-out τ; a GPU run on a slow kernel fallback is marked. `env`: each run's
    environment and fast-kernel path under its row (none for a run from before the
    fingerprint)."""
    from dflash_tui.evaluation import best_tau
    from dflash_tui.facts import run_outcome

    rows = ["RUN ID                                         STEPS  BEST TOK/S      BEST τ  OUTCOME"]
    for r in runs:
        best = "—" if r.best_tok_s is None else str(round(r.best_tok_s))
        run_id, outcome = sanitize.field(r.run_id), sanitize.field(run_outcome(r).summary)
        slow = r.preflight is not None and r.preflight.device.startswith("cuda")
        mark = " [slow kernels]" if slow and r.preflight and r.preflight.slow() else ""
        tau = best_tau(r)
        rows.append(f"{run_id[:45]:45s} {r.steps:>6} {best:>11} {tau:>11}  {outcome}{mark}")
        if env:
            env_text = r.environment.describe() if r.environment else "—"
            rows.append(f"    env: {sanitize.field(env_text)}")
            if r.preflight is not None:
                kernels = sanitize.field(r.preflight.summary())
                rows.append(f"    kernels ({sanitize.field(r.preflight.device)}): {kernels}")
    return "\n".join(rows)


def runs_json(run: RunInfo) -> dict[str, Any]:
    """One run of `runs --json`: the agent's record, and how it ended in the outcome's
    words (trainer/contract/outcomes.py) as `runs` prints it."""
    from dflash_tui.facts import run_outcome

    data: dict[str, Any] = encode(run)
    outcome = run_outcome(run)
    data["outcome"] = {"kind": outcome.kind, "summary": outcome.summary}
    return data


def command_work(name: str, args: argparse.Namespace) -> cli_io.Work:
    """What subcommand `name` does over a connected link (tests call it with a fake link)."""
    from dflash_tui import control

    async def work(link: Link, store: Store) -> int:
        if name == "deploy":
            d = await control.deploy(link, cli_io.progress, not args.no_compile_cache)
            cli_io.out(
                f"deployed {d['files']} files, code sha256 {d['sha256'][:16]}… -> {d['release']}"
            )
            for shipped in d["artifacts"]:
                cli_io.out(f"shipped compile-cache artifacts {shipped}: a fresh host starts warm")
        elif name == "pull-cache":
            pulled = await control.pull_artifacts(link)
            for path, size in pulled:
                cli_io.out(f"pulled {path.name} ({size / 1e6:.1f} MB) into {path.parent}")
            if not pulled:
                cli_io.out(
                    "no compile-cache artifacts on the host yet "
                    "(a GPU run saves them after its warm-up)"
                )
        elif name == "launch":
            run = await control.launch(link, args.config, args.overrides, cli_io.progress)
            cli_io.out(
                f"launched {run.run_id} in {run.run_dir}"
                + ("" if run.started else f" ({run.note})")
            )
        elif name == "kill":
            k = await control.kill(
                link, args.run_id, args.timeout, args.drain_timeout, cli_io.progress
            )
            drain = (
                "n/a (no GPU)"
                if k.drain_s is None and not k.gpu_held_by
                else f"{k.drain_s:.1f}s"
                if k.drain_s is not None
                else f"still held by pids {k.gpu_held_by}"
            )
            cli_io.out(
                f"{k.run_id} {k.describe()}; {k.stop_s:.1f}s; GPU memory "
                f"released: {drain}; orphans: {k.orphans or 'none'}"
            )
            return 0 if not k.orphans and not k.gpu_held_by else 1
        elif name == "restart":
            r = await control.restart(
                link, args.run_id, args.timeout, args.drain_timeout, cli_io.progress, args.fresh
            )
            if r.killed is not None:
                cli_io.out(f"{r.killed.run_id} {r.killed.describe()}")
            cli_io.out(r.describe())
        elif name == "dump-stacks":
            st = await control.dump_stacks(link, not args.no_pyspy, args.run_id)
            print(sanitize.lines(st.text))
            if st.pyspy:
                print("# py-spy dump --native\n" + sanitize.lines(st.pyspy))
            if st.seconds is not None:
                print(f"# {st.kind} dump of pid {st.pid}, {st.seconds:.2f}s after the signal")
        elif name == "export":
            e = await control.export(link, args.run_id, args.step, args.dtype)
            cli_io.out(e.said or f"exported {e.run_id} step {e.step}")
            cli_io.out(f"on the host: {e.out}")
        elif name == "clear-cache":
            c = await control.clear_cache(link)
            cli_io.out(
                f"removed {c.path} ({c.bytes / 1e6:.1f} MB)"
                if c.existed
                else f"no compile cache at {c.path}"
            )
        elif name == "runs":
            runs = await control.list_runs(link, store)
            if args.json:  # exact, as the agent listed them (JSON escapes the host's text)
                print(json.dumps([runs_json(r) for r in runs], default=str))
            else:
                print(_fmt_runs(runs, env=getattr(args, "env", False)))
        elif name == "compare":
            return await _compare(link, store, args)
        return 0

    return work


RUN_ID_SHAPE = r"^\d{8}-\d{6}-"  # how the agent names run dirs: YYYYMMDD-HHMMSS-NAME-xxxx


def compare_items(items: list[str]) -> tuple[list[str], str | None]:
    """`compare RUN RUN [...] [TARGET]`: (the run ids, the target). The last item is the
    target when it is not shaped like a run id (`local`, `ssh://…`, an alias)."""
    import re

    if len(items) >= 2 and not re.match(RUN_ID_SHAPE, items[-1]):
        return items[:-1], items[-1]
    return items, None


async def _compare(link: Link, store: Store, args: argparse.Namespace) -> int:
    import json

    from dflash_tui import compare, control

    runs = await control.list_runs(link, store)
    try:
        data = await compare.fetch_runs(link, runs, args.run_ids)
    except compare.UnknownRun as e:
        cli_io.err(str(e))
        return 2
    if args.json:
        print(json.dumps(compare.to_json(data), default=str))  # JSON escapes what the host wrote
    else:
        for line in compare.describe(data):
            cli_io.out(line)
    return 0


async def _command(name: str, args: argparse.Namespace, target: Target) -> int:
    from dflash_tui.control import ControlError

    try:
        return await cli_io.with_link(
            target, command_work(name, args), connect_timeout=cli_io.connect_timeout(args)
        )
    except ControlError as e:
        cli_io.err(str(e))
        return 2


def _notifier(args: argparse.Namespace, target: Target, on_error: Callable[[str], None]) -> Any:
    from dflash_tui.notify import Notifier

    command = getattr(args, "notify", None)
    return None if command is None else Notifier(command, target.name, on_error)


async def _monitor(
    args: argparse.Namespace, target: Target, follow: str = "latest", until_end: bool = False
) -> int:
    from dflash_tui.headless import Headless
    from dflash_tui.notify import NotifyError

    try:
        if args.once or args.headless or args.json:
            notifier = _notifier(args, target, cli_io.err)
            return await Headless(
                target, interval=args.interval, as_json=args.json, once=args.once,
                follow=follow, notifier=notifier, connect_timeout=cli_io.connect_timeout(args),
                until_end=until_end,
            ).run()  # fmt: skip
        if not (sys.stdin.isatty() and sys.stdout.isatty()):
            # Textual reads keys from a stdin that is not a terminal as fast as it can (at
            # EOF, each read returns at once): one line, not a busy loop.
            cli_io.err("not a terminal: use --headless (or --once) for lines, or run in a terminal")
            return 2
        from dflash_tui.app import run_app
        from dflash_tui.themes import ThemeError

        try:
            return await run_app(target, args)
        except ThemeError as e:
            cli_io.err(str(e))
            return 2
    except NotifyError as e:
        cli_io.err(str(e))
        return 2


def demo_target(args: argparse.Namespace) -> Target:
    import os

    base = os.environ.get("XDG_STATE_HOME") or os.path.expanduser("~/.local/state")
    remote = args.remote_dir or str(Path(base) / "dflash-tui" / "demo")
    return resolve_target(
        "local", run_root=args.run_root, remote_dir=remote, python=args.python or sys.executable
    )


async def _demo(args: argparse.Namespace) -> int:
    from dflash_tui import control
    from dflash_tui.control import TRAINER_DIR

    target = demo_target(args)
    print(f"demo: the tiny CPU trainer in {target.remote_dir}", file=sys.stderr)
    launched: list[str] = []

    async def work(link: Link, store: Store) -> int:
        r = await control.deploy(link)
        print(f"demo: deployed trainer {sanitize.field(r['sha256'][:12])}", file=sys.stderr)
        try:
            run = await control.launch(
                link, TRAINER_DIR / "configs" / "demo-cpu.toml", args.overrides, cli_io.progress
            )
            print(f"demo: launched {sanitize.field(run.run_id)}", file=sys.stderr)
            launched.append(run.run_id)
        except Exception as e:
            if "is alive" not in str(e):
                raise
            print("demo: a demo run is already alive; monitoring it", file=sys.stderr)
        return 0

    code = await cli_io.with_link(target, work)
    if code != 0:
        return code
    args.once = False
    # Headless, the demo is over when its run is: the outcome line, and 0 only if it finished.
    follow = launched[0] if launched else "latest"
    headless = args.headless or args.json
    code = await _monitor(args, target, follow=follow, until_end=headless)
    if headless:
        return code
    print(
        "demo: the run goes on until it finishes; stop it with: dflash-tui kill local "
        f"--remote-dir {target.remote_dir}",
        file=sys.stderr,
    )
    return code


async def _fleet(args: argparse.Namespace, hosts: tuple[str, ...] | None = None) -> int:
    """`fleet`: the config's targets; none is bad input (fleet.configured_targets says how
    to add one). `hosts`: a group's (`dflash-tui GROUP`), node 0 first: one row per host,
    Enter opens that host's dashboard (its GPUs, its ranks)."""
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
        cli_io.err(str(e))
        return 2


def _status_of_run_dir(args: argparse.Namespace) -> int:
    """`status --run-dir PATH`: the run root is PATH's folder, the followed run PATH's name;
    the agent reads it as it reads a live one (its readers, its liveness checks)."""
    import posixpath

    if args.run_root:
        cli_io.err("--run-dir names the run root itself (its folder): leave out --run-root")
        return 2
    path = args.run_dir.rstrip("/") or "/"
    root, run_id = posixpath.split(path)
    if not run_id or run_id in (".", ".."):
        cli_io.err(
            f"--run-dir {path}: name the run dir itself, e.g. runs/20260101-120000-NAME-abcd"
        )
        return 2
    args.run_root = root or "."
    target = target_from(args, args.target)
    if target.kind == "local":
        here = Path(path)
        marks = ("heartbeat.json", "launch.json", "config.json")
        if not here.is_dir():
            cli_io.err(f"--run-dir {path}: no such directory")
            return 2
        if not any((here / m).is_file() for m in marks):
            cli_io.err(f"--run-dir {path}: not a run dir (none of {', '.join(marks)} in it)")
            return 2
        args.run_root = str(here.resolve().parent)
        target = target_from(args, args.target)
    args.once = True
    return asyncio.run(_monitor(args, target, follow=run_id))


def _explain(code: str | None) -> int:
    """`explain [CODE]`: the code's entry from the rules' registry, or every code's line
    (dflash_tui/diagnosis/docs.py). An unknown code: one line with the nearest, exit 2."""
    from dflash_tui.diagnosis import docs

    if code is None:
        print(docs.listing())
        return 0
    if code not in docs.codes():
        near = docs.nearest(code)
        hint = f"did you mean {' or '.join(near)}?" if near else "`dflash-tui explain` lists them"
        cli_io.err(f"unknown finding code {code!r}: {hint}")
        return 2
    print(docs.explain(code))
    return 0


def _slip(word: str) -> str | None:
    """The command a first word close to one was meant to be, unless it names a host
    (dflash_tui/cli_slips.py); a config.toml that cannot be read names none here (the
    target's own resolution says what is wrong with it)."""
    from dflash_tui.cli_slips import slip_for
    from dflash_tui.targets import group_names, load_user_targets

    try:
        configured = list(load_user_targets()) + group_names()
    except TargetError:
        configured = []
    return slip_for(word, SUBCOMMANDS, configured)


def _at_joined(argv: list[str]) -> list[str]:
    """`--at -5m` as `--at=-5m`: argparse takes a value that starts with '-' for an option."""
    out: list[str] = []
    for arg in argv:
        if out and out[-1] == "--at" and arg.startswith("-"):
            out[-1] = f"--at={arg}"
        else:
            out.append(arg)
    return out


def _replay(args: argparse.Namespace) -> int:
    """`replay RUN [TARGET] [--at TIME]`: the TUI on the run's replay (escape: live), or with
    --headless/--json the status at TIME (dflash_tui/replay_headless.py)."""
    from dflash_tui.replay import ReplayError, parse_at

    try:
        if args.at is not None:
            parse_at(args.at, 0.0)  # a bad --at is refused before connecting
        target = target_from(args, args.target)
        if not (args.headless or args.json or args.once):
            return asyncio.run(_monitor(args, target))  # run_app opens the replay
        from dflash_tui import replay_headless

        work = replay_headless.work(target, args.replay_run, args.at, args.json)
        return asyncio.run(cli_io.with_link(target, work))
    except ReplayError as e:
        cli_io.err(str(e))
        return 2


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    name = argv[0] if argv and argv[0] in SUBCOMMANDS else None
    slip = _slip(argv[0]) if argv and name is None else None
    if slip is not None:
        cli_io.err(f"unknown command {argv[0]!r}: did you mean {slip}?")
        return 2
    try:
        if name in SUBCOMMANDS:
            argv.remove(name)
            if name == "replay":
                argv = _at_joined(argv)
            args = build_command_parser(name).parse_args(argv)
            if name == "explain":
                return _explain(args.code)
            if name == "demo":
                return asyncio.run(_demo(args))
            if name == "fleet":
                return asyncio.run(_fleet(args))
            if name == "status" and args.run_dir:
                return _status_of_run_dir(args)
            if name == "compare":
                args.run_ids, args.target = compare_items(args.items)
                if len(args.run_ids) < 2:
                    cli_io.err("compare needs two or more run ids (dflash-tui runs lists them)")
                    return 2
            if name == "replay":
                return _replay(args)
            if name in GROUP_COMMANDS and not getattr(args, "run_dir", None):
                from dflash_tui import groups

                group = groups.group_named(args.target)
                if group is not None:
                    return asyncio.run(groups.run(name, group, args))
            target = target_from(args, args.target)
            if name == "status":
                args.once = True
                return asyncio.run(_monitor(args, target))
            return asyncio.run(_command(name, args, target))
        args = build_parser().parse_args(argv)
        slip = _slip(args.target) if args.target else None  # `--headless stauts` too
        if slip is not None:
            cli_io.err(f"unknown command {args.target!r}: did you mean {slip}?")
            return 2
        from dflash_tui import groups

        group = groups.group_named(args.target)  # a job over several hosts: its fleet
        if group is not None:
            return asyncio.run(_fleet(args, group.hosts))
        return asyncio.run(_monitor(args, target_from(args, args.target)))
    except TargetError as e:
        cli_io.err(str(e))
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())

"""The options several subcommands share, and the target they name.

Each command's parser lists only the options it reads; the others keep `DEFAULTS`, so the
code reads them all (issue 16). A TARGET's ssh config is checked as it is resolved
(`target_from`): one that would turn host-key checking off is refused in one line, exit 2.
"""

from __future__ import annotations

import argparse
from typing import Any

from dflash_tui.commands import oneshot
from dflash_tui.targets import Group, Target, TargetError, resolve_target

# Every option any command reads, with the value it has where that command does not list it:
# each subcommand's --help shows only its own options (issue 16), the code reads them all.
DEFAULTS: dict[str, Any] = {
    "target": None,
    "run_root": None,
    "remote_dir": None,
    "pct": None,
    "exec_prefix": None,
    "python": None,
    "identity": None,
    "known_hosts": None,
    "insecure_no_host_key_check": False,
    "connect_timeout": None,
    "headless": False,
    "once": False,
    "json": False,
    "interval": 2.0,
    "notify": None,
    "theme": None,
}
# What a TARGET that names a config.toml group does over all its hosts (commands/groups.py).
GROUP_COMMANDS = ("launch", "kill", "restart", "status", "dump-stacks")


def positive(text: str) -> float:
    """An argparse type: a number > 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"{text!r}: must be > 0")
    return value


def add_target(p: argparse.ArgumentParser, group: bool = False) -> None:
    """TARGET; `group`: a config.toml group may stand for it (GROUP_COMMANDS)."""
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


def add_where(
    p: argparse.ArgumentParser,
    remote: bool = True,
    one_shot: bool = True,
    remote_dir: str = "~/dflash",
) -> None:
    """Where the runs are; `remote`: how to get there (not for the local demo);
    `remote_dir`: the default --remote-dir, as --help says it."""
    g = p.add_argument_group("where")
    g.add_argument("--run-root", help="where runs live (default: <remote-dir>/runs)")
    g.add_argument("--remote-dir", help=f"where deploy puts the trainer (default: {remote_dir})")
    if remote:
        pre = g.add_mutually_exclusive_group()
        pre.add_argument("--pct", metavar="CTID", help="run remote commands as pct exec CTID --")
        pre.add_argument("--exec-prefix", metavar="CMD", help="e.g. 'docker exec -i NAME'")
    g.add_argument(
        "--python",
        help="interpreter for the agent and trainer there (default: "
        + ("python3 on an ssh host, this one locally)" if remote else "this one)"),
    )
    if remote:
        g.add_argument("--identity", help="SSH private key file")
        g.add_argument(
            "--known-hosts",
            help="known_hosts file (checking is always on; ssh config's "
            "StrictHostKeyChecking accept-new is honoured, 'no' is refused)",
        )
        g.add_argument(
            "--insecure-no-host-key-check",
            action="store_true",
            help="connect without checking the host's key at all: any server answering at "
            "that address is trusted (only for a throwaway host you mean to trust blindly)",
        )
    if remote and one_shot:
        g.add_argument(
            "--connect-timeout",
            type=positive,
            metavar="S",
            help=f"seconds the host has to answer before this command gives up (default "
            f"{oneshot.CONNECT_S:g}; watching, the TUI keeps retrying instead)",
        )


def add_headless(p: argparse.ArgumentParser, once: bool = True) -> None:
    h = p.add_argument_group("headless")
    h.add_argument("--headless", action="store_true", help="print lines, no screen")
    if once:
        h.add_argument("--once", action="store_true", help="one snapshot, then exit 0/1/2/3")
    h.add_argument("--json", action="store_true", help="JSON lines instead of text")
    h.add_argument("--interval", type=float, default=2.0, help="seconds between lines (default 2)")


def add_notify(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--notify",
        metavar="CMD",
        help="run CMD (sh -c) with a JSON finding on stdin when a critical finding appears "
        "or clears (headless, --once and the TUI), e.g. 'curl -s -d @- https://ntfy.sh/mine'",
    )


def add_theme(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--theme",
        help="TUI theme: dark, light, high-contrast or one of yours (remembered; `t` cycles)",
    )


def add_json(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true", help="JSON instead of text")


def target_from(args: argparse.Namespace, text: str | None) -> Target:
    """The target, its ssh config checked up front: a config that would turn host-key
    checking off is refused here, in one line, exit 2 (link/hostkeys.py)."""
    from dflash_tui.link.hostkeys import config_paths, host_key_policy, known_hosts
    from dflash_tui.link.transport import identity_path
    from dflash_tui.targets import group_names
    from trainer.contract.textfile import TextFileError

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
        check_host_key=not args.insecure_no_host_key_check,
    )
    if target.kind == "ssh":  # the files asyncssh will read: bad input, not a hang
        config_paths()
        identity_path(target)
    if target.kind == "ssh" and target.check_host_key:
        try:  # the known_hosts files read now: one that is not text is bad input, exit 2
            known_hosts(host_key_policy(target))
        except TextFileError as e:  # not text, too large, or a line asyncssh cannot read
            raise TargetError(str(e)) from None
    return target


def group_named(text: str | None) -> Group | None:
    """The config's group of that name (every group checked: a bad one is a TargetError)."""
    from dflash_tui.targets import load_groups

    if not text:
        return None
    return load_groups().get(text)

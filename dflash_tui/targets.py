"""Where the monitor connects: TARGET strings, exec prefixes, and the user's named targets.

TARGET is `local` (the default), `ssh://[user@]host[:port]`, or an ~/.ssh/config alias (any
other word). `~/.config/dflash-tui/config.toml` can name targets with every option:

    [targets.gpu-box]
    target = "ssh://root@10.0.0.5"     # or an ssh alias
    pct = 200                          # or exec_prefix = "docker exec -i trainer"
    remote_dir = "/workspace/dflash"
    run_root = "/workspace/runs"
    python = "/opt/venv/bin/python"
    identity = "~/.ssh/id_ed25519"
    known_hosts = "~/.ssh/known_hosts"

so that `dflash-tui gpu-box` is enough. Options given on the command line win.

A group names the hosts of one processes-mode job over several hosts (`dflash-tui launch
GROUP`, dflash_tui/commands/groups.py), each a named target:

    [groups.pair]
    hosts = ["gpu-a", "gpu-b"]      # the first is node 0: the writer's host, the job's files
    master = "10.0.0.5:29500"       # node 0's address as the other hosts reach it, a free port
"""

from __future__ import annotations

import math
import os
import re
import shlex
import sys
import tomllib
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from trainer.contract.nodes import MAX_NODES, master_invalid
from trainer.contract.textfile import TextFileError, read_text_file

_ALIAS = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._@-]*$")
_CTID = re.compile(r"^\d+$")
MAX_USER_CONFIG_BYTES = 1 << 20  # a few named targets and groups


class TargetError(ValueError):
    """A bad target or option; the message is one line naming it."""


@dataclass(frozen=True)
class Target:
    name: str  # as the user wrote it, for display
    kind: str  # "local" | "ssh"
    host: str | None = None  # host name, address or ssh alias
    port: int | None = None
    user: str | None = None
    remote_dir: str = "~/dflash"
    run_root: str | None = None  # None = <remote_dir>/runs
    exec_prefix: tuple[str, ...] = ()
    python: str | None = None  # None = python3 remotely, this interpreter locally
    identity: str | None = None
    known_hosts: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    # False only by --insecure-no-host-key-check, never by a file (link/hostkeys.py)
    check_host_key: bool = True

    @property
    def effective_run_root(self) -> str:
        return self.run_root or f"{self.remote_dir.rstrip('/')}/runs"

    @property
    def effective_python(self) -> str:
        if self.python:
            return self.python
        return sys.executable if self.kind == "local" and not self.exec_prefix else "python3"

    def describe(self) -> str:
        where = "local" if self.kind == "local" else f"{self.user + '@' if self.user else ''}"
        if self.kind == "ssh":
            where += f"{self.host}{':' + str(self.port) if self.port else ''}"
        if self.exec_prefix:
            where += " via " + shlex.join(self.exec_prefix)
        return where


def exec_prefix(pct: str | int | None, prefix: str | None) -> tuple[str, ...]:
    if pct is not None and prefix:
        raise TargetError("--pct and --exec-prefix: give one, not both")
    if pct is not None:
        ctid = str(pct)
        if not _CTID.match(ctid):
            raise TargetError(f"--pct {ctid!r}: a container id is a number")
        return ("pct", "exec", ctid, "--")
    if prefix:
        try:
            parts = tuple(shlex.split(prefix))
        except ValueError as e:
            raise TargetError(f"--exec-prefix {prefix!r}: {e}") from None
        if not parts:
            raise TargetError("--exec-prefix is empty")
        return parts
    return ()


def parse_target(text: str) -> Target:
    if text in ("", "local"):
        return Target(name="local", kind="local")
    if text.startswith("ssh://"):
        try:
            u = urlsplit(text)
            host = u.hostname
        except ValueError as e:  # an unbalanced [ or ] ("Invalid IPv6 URL")
            raise TargetError(f"target {text!r}: {e}") from None
        if not host:
            raise TargetError(f"target {text!r}: no host")
        try:
            port = u.port
        except ValueError:
            raise TargetError(f"target {text!r}: bad port") from None
        return Target(name=text, kind="ssh", host=host, port=port, user=u.username)
    if "://" in text or not _ALIAS.match(text):
        raise TargetError(
            f"target {text!r}: expected local, ssh://[user@]host[:port] or an ssh alias"
        )
    user, _, host = text.rpartition("@")
    return Target(name=text, kind="ssh", host=host, user=user or None)


def user_config_path() -> Path:
    base = os.environ.get("XDG_CONFIG_HOME") or os.path.expanduser("~/.config")
    return Path(base) / "dflash-tui" / "config.toml"


def _user_config(path: Path) -> dict[str, Any]:
    """The config file parsed and its targets checked; a missing file is no targets. A file
    that is no regular file, too large, not UTF-8 or not TOML, or a target key of the wrong
    type, is one TargetError line naming the file and the key."""
    try:
        text = read_text_file(path, str(path), MAX_USER_CONFIG_BYTES)
    except TextFileError as e:
        if not path.exists() and not path.is_symlink():
            return {}
        raise TargetError(str(e)) from None
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise TargetError(f"{path}: not TOML ({e})") from None
    except (ValueError, RecursionError) as e:  # an integer over 4300 digits, deep nesting
        raise TargetError(f"{path}: not TOML ({str(e)[:200] or 'nested too deep'})") from None
    targets = data.get("targets", {})
    if not isinstance(targets, dict):
        raise TargetError(f"{path}: [targets] must be a table of named targets")
    for name, keys in targets.items():
        _check_target_keys(path, name, keys)
    return data


def _check_target_keys(path: Path, name: str, keys: Any) -> None:
    """Each known key of `[targets.NAME]` has its type (unknown keys are named when the
    target is used: `resolve_target`)."""
    where = f"{path}: targets.{name}"
    if not isinstance(keys, dict):
        raise TargetError(f"{where}: must be a table ([targets.{name}] with its keys)")
    for key, value in keys.items():
        if key == "pct":
            ok = (isinstance(value, int) and not isinstance(value, bool) and value >= 0) or (
                isinstance(value, str) and _CTID.match(value) is not None
            )
            rule = "a container id (a number)"
        elif key == "baseline_tok_s":
            ok = (
                isinstance(value, int | float)
                and not isinstance(value, bool)
                and math.isfinite(value)
                and value > 0
            )
            rule = "a number of tokens/s > 0"
        elif key in _KEYS:
            ok = isinstance(value, str)
            rule = "a string"
        else:
            continue
        if not ok:
            raise TargetError(f"{where}.{key} = {_shown(value)}: must be {rule}")


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def load_user_targets(path: Path | None = None) -> dict[str, dict[str, Any]]:
    path = path or user_config_path()
    data = _user_config(path)
    targets = data.get("targets", {})
    if not isinstance(targets, dict):
        raise TargetError(f"{path}: [targets] must be a table of named targets")
    return targets


def group_names(path: Path | None = None) -> list[str]:
    """The names under [groups] as written, unchecked (a slip or a group where a target is
    expected is named before anything else is read of them)."""
    raw = _user_config(path or user_config_path()).get("groups", {})
    return list(raw) if isinstance(raw, dict) else []


@dataclass(frozen=True)
class Group:
    """`[groups.NAME]`: one job's hosts, node 0 first, and node 0's rendezvous address."""

    name: str
    hosts: tuple[str, ...]  # names of [targets.*]
    master: str  # host:port, as the other hosts reach node 0


_GROUP_KEYS = {"hosts", "master"}


def load_groups(path: Path | None = None) -> dict[str, Group]:
    """The config's groups, each checked: a bad one is one TargetError line naming its key."""
    path = path or user_config_path()
    data = _user_config(path)
    raw = data.get("groups", {})
    if not isinstance(raw, dict):
        raise TargetError(f"{path}: [groups] must be a table of named groups")
    targets = data.get("targets", {})
    targets = targets if isinstance(targets, dict) else {}
    return {name: _group(path, name, keys, targets) for name, keys in raw.items()}


def _group(path: Path, name: str, keys: Any, targets: dict[str, Any]) -> Group:
    where = f"{path}: groups.{name}"
    if not isinstance(keys, dict):
        raise TargetError(f'{where}: must be a table (hosts = [...], master = "host:port")')
    if name in targets:
        raise TargetError(f"{where}: {name!r} names a target too: rename one")
    unknown = set(keys) - _GROUP_KEYS
    if unknown:
        raise TargetError(f"{where}: unknown keys {sorted(unknown)}")
    hosts = keys.get("hosts")
    if not isinstance(hosts, list) or not all(isinstance(h, str) for h in hosts):
        raise TargetError(f"{where}.hosts: a list of target names, node 0 first")
    if not 2 <= len(hosts) <= MAX_NODES:
        raise TargetError(f"{where}.hosts: {len(hosts)} host(s): a group has 2 or more")
    for h in hosts:
        if h not in targets:
            raise TargetError(f"{where}.hosts: {h!r} is no [targets.{h}] in this file")
        if hosts.count(h) > 1:
            raise TargetError(f"{where}.hosts: {h!r} is named twice")
    master = keys.get("master")
    if not isinstance(master, str):
        raise TargetError(
            f'{where}.master: "host:port" of node 0 ({hosts[0]}), as the others reach it'
        )
    why = master_invalid(master)
    if why is not None:
        raise TargetError(f"{where}.master: {why}")
    return Group(name, tuple(hosts), master)


_KEYS = {
    "target",
    "pct",
    "exec_prefix",
    "remote_dir",
    "run_root",
    "python",
    "identity",
    "known_hosts",
    "theme",
    "baseline_tok_s",
}


def resolve_target(
    text: str | None,
    *,
    run_root: str | None = None,
    remote_dir: str | None = None,
    pct: str | None = None,
    prefix: str | None = None,
    python: str | None = None,
    identity: str | None = None,
    known_hosts: str | None = None,
    config_path: Path | None = None,
    check_host_key: bool = True,
) -> Target:
    """The target a command line names, with the user's named target underneath it."""
    named = load_user_targets(config_path)
    text = text or "local"
    saved = named.get(text)
    if saved is not None:
        unknown = set(saved) - _KEYS
        if unknown:
            raise TargetError(f"targets.{text}: unknown keys {sorted(unknown)}")
        try:
            base = parse_target(str(saved.get("target", text if text != "local" else "local")))
        except TargetError as e:
            raise TargetError(f"{config_path or user_config_path()}: targets.{text}: {e}") from None
        base = replace(base, name=text)
    else:
        base = parse_target(text)
        saved = {}

    def pick(cli: Any, key: str) -> Any:
        return cli if cli is not None else saved.get(key)

    if pct is not None or prefix is not None:
        pre = exec_prefix(pct, prefix)
    else:
        pre = exec_prefix(saved.get("pct"), saved.get("exec_prefix"))
    t = replace(
        base,
        remote_dir=str(pick(remote_dir, "remote_dir") or base.remote_dir),
        run_root=pick(run_root, "run_root"),
        exec_prefix=pre,
        python=pick(python, "python"),
        identity=pick(identity, "identity"),
        known_hosts=pick(known_hosts, "known_hosts"),
        check_host_key=check_host_key,
        extra={k: v for k, v in saved.items() if k in ("theme", "baseline_tok_s")},
    )
    for key in ("remote_dir", "run_root", "python"):
        value = getattr(t, key)
        if value is not None and ("\n" in value or "\0" in value):
            raise TargetError(f"--{key.replace('_', '-')}: no newlines or NUL bytes")
    return t

"""Host-key checking that ~/.ssh/config cannot turn off.

asyncssh reads ~/.ssh/config itself: there, `UserKnownHostsFile none` turns its host-key
checking off, and `StrictHostKeyChecking` is not read at all. So before connecting, the
monitor reads these two options for the target host (with asyncssh's own parser, so a
`Host`/`Match` block applies exactly as it will for the connection) and always passes the
known hosts itself:

- `UserKnownHostsFile none` (or /dev/null) and `StrictHostKeyChecking no` (or off) are
  refused: `HostKeyConfigError`, one line naming the file, the line and the option;
- `StrictHostKeyChecking accept-new` is honoured as OpenSSH does: a host with no entry in
  the known_hosts files is trusted on first use and its key appended to the first user
  file; a host whose entry names another key is refused, as always;
- anything else (`yes`, `ask`, not set): the host's key must be in the known_hosts files.

The known_hosts files are the target's `--known-hosts`, else the config's
`UserKnownHostsFile` (and `GlobalKnownHostsFile`), else ~/.ssh/known_hosts; a missing one
is skipped, as OpenSSH skips it. The first, where keys are kept, is refused when it is
there but cannot keep a key (/dev/null, /dev/zero, a FIFO, a folder): under accept-new every
connection would trust whatever key it met, and a changed key would never be noticed.

A `@revoked` key is never trusted, whichever entry names it: asyncssh, finding no trusted
key for `[host]:port`, looks the host up again without the port and forgets the revoked
keys the first lookup found (`matched`, below, keeps them).

`--insecure-no-host-key-check` (the Target's `check_host_key` False) is the one way to
connect without checking: explicit, on the command line, for those who mean it.
"""

from __future__ import annotations

import getpass
import itertools
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dflash_tui.targets import Target, TargetError
from trainer.contract.textfile import TextFileError, not_regular, read_text_file

if TYPE_CHECKING:
    import asyncssh

DEFAULT_KNOWN_HOSTS = "~/.ssh/known_hosts"
_NO_FILE = {"none", "/dev/null"}
_OFF = {"no", "off", "false"}
OPT_OUT = "--insecure-no-host-key-check"
MAX_KNOWN_HOSTS_BYTES = 16 << 20  # thousands of hosts; a larger file is a mistake
MAX_SSH_CONFIG_BYTES = 1 << 20  # hundreds of hosts
MAX_INCLUDE_DEPTH = 16  # files deep; a config that nests further includes itself


class HostKeyConfigError(TargetError):
    """The user's ssh config asks for host-key checking to be off: refused, one line."""


@dataclass(frozen=True)
class HostKeyPolicy:
    files: tuple[str, ...]  # the known_hosts files, expanded
    record_to: str  # where a key trusted on first use goes (the first user file)
    accept_new: bool  # StrictHostKeyChecking accept-new
    said_by: str | None = None  # "FILE line N" that set accept-new


def config_paths() -> list[Path]:
    """The client config asyncssh reads by default: ~/.ssh/config, when readable (as
    asyncssh decides). Checked first, with every file its `Include` lines pull in, since
    asyncssh opens each and reads it whole: a FIFO there would block the connection,
    /dev/zero or a sparse 4 GB file never end. One that is not UTF-8 text of a regular file
    within the cap, or Includes that loop, is refused in one line (TargetError)."""
    path = Path("~", ".ssh", "config").expanduser()
    if not os.access(path, os.R_OK):
        return []
    _check_config(path, path.parent, [])
    return [path]


def _check_config(path: Path, ssh_dir: Path, chain: list[Path]) -> None:
    """`path` and, depth first, what its Include lines match, as asyncssh matches them
    (a relative pattern under ~/.ssh, a glob, regular files only: it skips the rest)."""
    if path in chain or len(chain) >= MAX_INCLUDE_DEPTH:
        raise TargetError(f"ssh config {chain[0]}: Include lines loop or nest too deep at {path}")
    try:
        text = read_text_file(path, f"ssh config {path}", MAX_SSH_CONFIG_BYTES)
    except TextFileError as e:
        raise TargetError(str(e)) from None
    for line in text.splitlines():
        words = line.strip().replace("=", " ", 1).split()
        if len(words) < 2 or words[0].lower() != "include":
            continue
        for pattern in words[1:]:
            where = Path(pattern).expanduser()
            base, glob = ssh_dir, pattern
            if where.anchor:
                base, glob = Path(where.anchor), str(Path(*where.parts[1:]))
            try:
                matched = sorted(p for p in itertools.islice(base.glob(glob), 256) if p.is_file())
            except (OSError, ValueError) as e:
                raise TargetError(f"ssh config {path}: Include {pattern}: {e}") from None
            for included in matched:
                _check_config(included, ssh_dir, [*chain, path])


def _host_config(target: Target, paths: list[Path]) -> tuple[dict[str, list[str]], dict[str, str]]:
    """(option -> its first value's words, option -> "FILE line N") for the host-key options
    that apply to the target host in `paths`; first value wins, as in OpenSSH."""
    from asyncssh.config import SSHClientConfig

    values: dict[str, list[str]] = {}
    where: dict[str, str] = {}

    class _Config(SSHClientConfig):
        def _note(self, option: str, args: list[str]) -> None:
            if option not in values:
                values[option] = list(args)
                where[option] = f"{self._path} line {self._line_no}"
            args.clear()

    noted = {
        "stricthostkeychecking": ("StrictHostKeyChecking", _Config._note),
        "userknownhostsfile": ("UserKnownHostsFile", _Config._note),
        "globalknownhostsfile": ("GlobalKnownHostsFile", _Config._note),
    }
    _Config._handlers = {**SSHClientConfig._handlers, **noted}
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = ""
    try:
        _Config.load(
            None,
            list(paths),
            False,
            False,
            False,
            user,
            target.user or (),
            target.host or "",
            target.port or (),
        )
    except Exception as e:  # asyncssh's ConfigParseError, an unreadable Include, ...
        raise TargetError(f"ssh config: {e}") from None
    return values, where


def host_key_policy(target: Target, paths: list[Path] | None = None) -> HostKeyPolicy:
    """How the target's host key is checked; HostKeyConfigError when the config would have
    it not checked."""
    paths = config_paths() if paths is None else paths
    values, where = _host_config(target, paths) if paths else ({}, {})
    strict = [v.lower() for v in values.get("StrictHostKeyChecking", [])]
    if strict and strict[0] in _OFF:
        raise HostKeyConfigError(
            f"{where['StrictHostKeyChecking']}: StrictHostKeyChecking {strict[0]} is refused: "
            "dflash-tui always checks host keys (use accept-new to trust a new host once; "
            f"{OPT_OUT} connects without checking)"
        )
    user_files = values.get("UserKnownHostsFile")
    if target.known_hosts:
        files = [target.known_hosts]
    elif user_files is not None:
        bad = [f for f in user_files if f.lower() in _NO_FILE or _is_dev_null(f)]
        if bad or not user_files:
            raise HostKeyConfigError(
                f"{where['UserKnownHostsFile']}: UserKnownHostsFile "
                f"{(bad or ['none'])[0]} is refused: dflash-tui always checks host keys "
                f"(name a known_hosts file, or remove the line; {OPT_OUT} connects without "
                "checking)"
            )
        glob = [f for f in values.get("GlobalKnownHostsFile", []) if f.lower() != "none"]
        files = user_files + glob
    else:
        files = [DEFAULT_KNOWN_HOSTS]
    expanded = tuple(os.path.expanduser(f) for f in files)
    # The first file is where keys are kept; the others are only read (a global
    # `GlobalKnownHostsFile /dev/null` is the usual way to say "none"), and one that is no
    # regular file is skipped there, never opened.
    kind = not_regular(expanded[0])
    if kind is not None:
        named_by = "--known-hosts" if target.known_hosts else "known_hosts file"
        raise HostKeyConfigError(
            f"{named_by} {expanded[0]}: {kind}, it cannot keep host keys: refused (a key "
            f"would be trusted every time, changed or not); name a known_hosts file, or pass "
            f"{OPT_OUT} to connect without checking"
        )
    accept_new = bool(strict) and strict[0] == "accept-new"
    return HostKeyPolicy(
        files=expanded,
        record_to=expanded[0],
        accept_new=accept_new,
        said_by=where.get("StrictHostKeyChecking") if accept_new else None,
    )


def _is_dev_null(path: str) -> bool:
    try:
        return os.path.realpath(os.path.expanduser(path)) == "/dev/null"
    except OSError:
        return False


def known_hosts(policy: HostKeyPolicy) -> asyncssh.SSHKnownHosts:
    """The policy's known_hosts files as one set (a missing file is skipped; each read
    bounded, a regular file only: TextFileError otherwise)."""
    import asyncssh

    texts = []
    for f in policy.files:
        if os.path.exists(f) and not_regular(f) is None:  # the first one checked: policy
            text = read_text_file(f, f"known_hosts file {f}", MAX_KNOWN_HOSTS_BYTES)
            try:
                asyncssh.import_known_hosts(text)  # each file alone, so a bad line names it
            except ValueError as e:
                raise TextFileError(f"known_hosts file {f}: {str(e)[:200]}") from None
            texts.append(text)
    return asyncssh.import_known_hosts("\n".join(texts))


Matched = tuple[list[Any], ...]  # asyncssh's: host keys, CA keys, revoked keys, x509 ...


def matched(known: asyncssh.SSHKnownHosts, host: str, addr: str, port: int | None) -> Matched:
    """`known.match`, with the revoked keys of a `[host]:port` entry kept: asyncssh drops
    them when no trusted key names the port and it falls back to the host alone."""
    found = [list(x) for x in known.match(host, addr, port)]
    if port and port != 22:
        for name in {host, addr} - {""}:
            # As one bracketed name, no address: the lookup asyncssh makes with the port.
            for key in known.match(f"[{name}]:{port}", "", None)[2]:
                if key not in found[2]:
                    found[2].append(key)
    return tuple(found)


def _client_base() -> type:
    import asyncssh

    return asyncssh.SSHClient


def make_client(policy: HostKeyPolicy, known: asyncssh.SSHKnownHosts) -> Any:
    """An asyncssh client that, under accept-new, trusts the key of a host that has no entry
    at all in `known` (asyncssh asks it only for a key not in `known`, and then checks that
    the server holds the key's private half). A host with an entry is never trusted anew."""

    class TofuClient(_client_base()):  # type: ignore[misc]
        learned: tuple[str, int, Any] | None = None

        def validate_host_public_key(self, host: str, addr: str, port: int, key: Any) -> bool:
            if not policy.accept_new:
                return False
            if any(matched(known, host, addr, port)):  # known (keys, CAs, revoked): not new
                return False
            self.learned = (host, port, key)
            return True

    return TofuClient()


def record_host_key(path: str, host: str, port: int, key: asyncssh.SSHKey) -> str:
    """Append `host`'s key to the known_hosts file at `path`, as OpenSSH writes it."""
    name = host if not port or port == 22 else f"[{host}]:{port}"
    key_type, key_b64 = key.export_public_key("openssh").decode().split()[:2]
    line = f"{name} {key_type} {key_b64}\n"
    folder = os.path.dirname(path)
    if folder:
        os.makedirs(folder, mode=0o700, exist_ok=True)
    with open(path, "a+", encoding="utf-8") as f:
        f.seek(0, os.SEEK_END)
        if f.tell() > 0:
            f.seek(f.tell() - 1)
            if f.read(1) != "\n":
                line = "\n" + line
        f.write(line)
    return line.strip()

"""A command line's first word that is no command: a slip of the keyboard, or a host?

`dflash-tui stauts` would otherwise be taken as the host `stauts` and sit retrying a
connection that can never come. A word close to a command (difflib) is refused as a slip
unless it names a host: a configured target, an ~/.ssh/config alias, `local`, or something
shaped like a host (a dot, `@` or `:` in it).
"""

from __future__ import annotations

import difflib
import os
import re
from collections.abc import Iterable
from pathlib import Path

# Close enough to be a slip: `stauts`, `lanch`, `rusn` and `dmeo` are; `gpu-box` is not.
CUTOFF = 0.75


def ssh_aliases(path: Path | None = None) -> set[str]:
    """The literal names of `Host` lines in ~/.ssh/config (patterns with * or ? skipped);
    an unreadable file has none."""
    path = path or Path(os.path.expanduser("~/.ssh/config"))
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return set()
    names: set[str] = set()
    for line in text.splitlines():
        m = re.match(r"\s*host\s*[=\s]\s*(.+)", line, re.IGNORECASE)
        if m:
            for word in m.group(1).split():
                if not any(c in word for c in "*?!"):
                    names.add(word)
    return names


def looks_like_host(word: str, configured: Iterable[str], aliases: Iterable[str]) -> bool:
    return (
        word == "local"
        or any(c in word for c in ".@:")
        or word in set(configured)
        or word in set(aliases)
    )


def slip_for(
    word: str,
    commands: Iterable[str],
    configured: Iterable[str] = (),
    aliases: Iterable[str] | None = None,
) -> str | None:
    """The command `word` was meant to be, or None (it is a command, a host, or far from
    any command). The ssh config is read only when the word is close to a command."""
    commands = list(commands)
    if word in commands or word.startswith("-"):
        return None
    close = difflib.get_close_matches(word, commands, n=1, cutoff=CUTOFF)
    if not close:
        return None
    if looks_like_host(word, configured, ssh_aliases() if aliases is None else aliases):
        return None
    return close[0]


def slip(word: str, commands: Iterable[str]) -> str | None:
    """`slip_for` against the hosts the user configured (config.toml's targets and groups);
    a config.toml that cannot be read names none here (the target's own resolution says what
    is wrong with it)."""
    from dflash_tui.targets import TargetError, group_names, load_user_targets

    try:
        configured = list(load_user_targets()) + group_names()
    except TargetError:
        configured = []
    return slip_for(word, commands, configured)

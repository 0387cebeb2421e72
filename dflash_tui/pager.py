"""`o`: the step log the store holds, in the operator's $PAGER (plain `less` without one).

The text is what the pane shows, through the terminal boundary (dflash_tui/sanitize.py):
no escape sequence from the host reaches the pager, so it needs no `-R`. Written to a
private temporary file the pager reads, removed after it exits."""

from __future__ import annotations

import os
import shlex
import tempfile
from collections.abc import Iterable, Mapping
from pathlib import Path

from dflash_tui import sanitize

DEFAULT = "less"


class PagerError(ValueError):
    """$PAGER that cannot be read as a command line, said in one line."""


def command(environ: Mapping[str, str]) -> list[str]:
    text = environ.get("PAGER", "").strip() or DEFAULT
    try:
        argv = shlex.split(text)
    except ValueError as e:
        raise PagerError(f"$PAGER {text!r}: {e}") from None
    return argv or [DEFAULT]


def write_log(lines: Iterable[str], run_id: str | None) -> Path:
    """The lines, sanitised, one per line, in a new file only this user can read."""
    name = sanitize.field(run_id or "no-run").replace("/", "_").replace("\\", "_")[:80]
    fd, path = tempfile.mkstemp(prefix=f"dflash-{name}-", suffix=".log")
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        for line in lines:
            f.write(sanitize.line(line) + "\n")
    return Path(path)

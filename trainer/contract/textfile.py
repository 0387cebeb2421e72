"""A user's text file (a config, a known_hosts file), read so that no file can hang or flood
the reader: only a regular file is opened (a FIFO would block the open, /dev/zero never
ends, a directory is no text), at most `limit` bytes are read, and bytes that are not UTF-8
are named by their offset. Every refusal is one `TextFileError` line naming the file.

Unlike `typed.read_bounded` (run-dir files, where a symlink is refused), a symlink here is
followed: a user's config linked from a dotfiles repository is ordinary.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

MAX_USER_FILE_BYTES = 4 << 20  # a config or known_hosts file; a larger one is a mistake


class TextFileError(ValueError):
    """A file that is not readable text; the message is one line naming it."""


def file_kind(mode: int) -> str:
    """What a file of this `st_mode` is, in words ("a FIFO", "a folder")."""
    if stat.S_ISREG(mode):
        return "a regular file"
    if stat.S_ISDIR(mode):
        return "a folder"
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISSOCK(mode):
        return "a socket"
    if stat.S_ISLNK(mode):
        return "a symlink"
    return "a device"


def not_regular(path: str | Path) -> str | None:
    """Why `path` (followed) is no regular file ("a FIFO", ...), None when it is one or when
    it does not exist."""
    try:
        mode = os.stat(path).st_mode
    except (FileNotFoundError, NotADirectoryError):
        return None
    except OSError as e:
        return e.strerror or str(e)
    return None if stat.S_ISREG(mode) else file_kind(mode)


def read_text_file(path: str | Path, what: str, limit: int = MAX_USER_FILE_BYTES) -> str:
    """The file's text. `what` names it in the message ("--config c.toml"); the reasons:
    not found, not a regular file (checked before opening, so a FIFO never blocks), too
    large, unreadable, not UTF-8 (at byte N)."""
    try:
        mode = os.stat(path).st_mode
    except (FileNotFoundError, NotADirectoryError):
        raise TextFileError(f"{what}: not found") from None
    except OSError as e:
        raise TextFileError(f"{what}: cannot read it ({e.strerror or e})") from None
    if not stat.S_ISREG(mode):
        raise TextFileError(f"{what}: {file_kind(mode)}, not a regular file: refused")
    try:
        # O_NONBLOCK: should the path be swapped for a FIFO after the stat, the open does not
        # wait for a writer; the fstat below then refuses it.
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except OSError as e:
        raise TextFileError(f"{what}: cannot read it ({e.strerror or e})") from None
    with os.fdopen(fd, "rb") as f:
        try:
            mode = os.fstat(fd).st_mode
            if not stat.S_ISREG(mode):
                raise TextFileError(f"{what}: {file_kind(mode)}, not a regular file: refused")
            raw = f.read(limit + 1)
        except OSError as e:
            raise TextFileError(f"{what}: cannot read it ({e.strerror or e})") from None
    if len(raw) > limit:
        raise TextFileError(f"{what}: larger than {limit} bytes: refused")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise TextFileError(f"{what}: not UTF-8 text (byte {e.start})") from None

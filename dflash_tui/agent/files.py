"""Reading a run's files: never through a symlink, never blocking on a FIFO; one file's new
complete lines, heartbeat.json's changes, and inotify to sleep until either happens.

Nothing outside the run root is read through it: a run dir is a real folder directly under
the root, and a run's file a regular file directly in it. Each is opened without following a
symlink (O_NOFOLLOW, the file relative to its folder's descriptor), so a planted
`runs/evil -> /etc` or `train.log -> /etc/passwd` is refused, not followed; a FIFO is opened
with O_NONBLOCK and refused as no regular file, so it never stalls the agent.
"""

from __future__ import annotations

import errno
import os
import re
import stat
from collections.abc import Callable
from typing import Any

from dflash_tui.agent.errors import CommandError
from trainer.contract.heartbeat import MAX_HEARTBEAT_BYTES, parse_heartbeat
from trainer.contract.protocol import MAX_TEXT_BYTES, TAIL_BYTES
from trainer.contract.textfile import file_kind
from trainer.contract.typed import Unreadable, parse_json, read_bounded

READ_CHUNK = 1 << 20  # bytes read per file per poll: bounded work, bounded latency
SAFE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")  # one plain name: no `..`, no /
_READ = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC


class Refused(CommandError):
    """A path under the run root that is not what a run's folder or file is (a symlink, a FIFO,
    a device): refused, never followed. The message says what it is."""


def what_is(path: str) -> str:
    """What `path` itself is, in words ("a symlink to /etc", "a FIFO")."""
    try:
        mode = os.lstat(path).st_mode
    except OSError:
        return "gone"
    if stat.S_ISLNK(mode):
        try:
            return f"a symlink to {os.readlink(path)}"
        except OSError:
            return "a symlink"
    return file_kind(mode)


def open_dir(path: str) -> int:
    """A folder's descriptor, refused when `path` itself is a symlink or no folder (the
    folders above it are followed: the run root may live behind a symlink)."""
    try:
        return os.open(path, _READ | os.O_DIRECTORY)
    except OSError as e:
        if e.errno in (errno.ELOOP, errno.ENOTDIR):
            raise Refused(f"{path} is {what_is(path)}: refused, not followed") from None
        raise


def open_in(folder: str, name: str) -> int:
    """`folder/name` opened for reading: the folder and the file each without following a
    symlink, the file relative to the folder's descriptor, and only a regular file (opening
    a FIFO would block the agent; O_NONBLOCK makes that open return). FileNotFoundError when
    either is missing."""
    if not SAFE_NAME.match(name):
        raise Refused(f"bad file name {name!r}")
    dir_fd = open_dir(folder)
    path = os.path.join(folder, name)
    try:
        fd = os.open(name, _READ | os.O_NONBLOCK, dir_fd=dir_fd)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise Refused(f"{path} is {what_is(path)}: refused, not followed") from None
        raise
    finally:
        os.close(dir_fd)
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise Refused(f"{path} is {what_is(path)}, not a regular file: refused")
    return fd


def read_tail(folder: str, name: str, max_bytes: int) -> str:
    """The last `max_bytes` of `folder/name` as text (open_in's rules and errors)."""
    with os.fdopen(open_in(folder, name), "rb") as f:
        size = os.fstat(f.fileno()).st_size
        f.seek(max(0, size - max_bytes))
        return f.read(max_bytes).decode("utf-8", "replace")


def read_page(
    folder: str, name: str, max_bytes: int, before: int | None = None, lines: bool = False
) -> tuple[str, int, int]:
    """The `max_bytes` of `folder/name` before byte `before` (None: its end) as text, where
    that text starts and the file's size (open_in's rules and errors). `lines`: from the
    first line that starts in the range. A line longer than a page is in none whole: its
    pages give nothing (each next page ends where this one began) and its head comes cut,
    at the end of the page before, for the reader to count as unreadable."""
    with os.fdopen(open_in(folder, name), "rb") as f:
        size = os.fstat(f.fileno()).st_size
        end = size if before is None else max(0, min(before, size))
        start = max(0, end - max_bytes)
        if not lines or start == 0:
            f.seek(start)
            return f.read(end - start).decode("utf-8", "replace"), start, size
        # A line starts at `start` when the byte before it ends one: read that byte too.
        f.seek(start - 1)
        data = f.read(end - start + 1)
        cut = data.find(b"\n") + 1
        if cut == 0 or cut == len(data):  # no line starts in the range: skip it whole
            return "", start, size
        return data[cut:].decode("utf-8", "replace"), start - 1 + cut, size


def read_after(folder: str, name: str, offset: int, max_bytes: int) -> tuple[str, int]:
    """What was appended to `folder/name` past `offset` (at most its last `max_bytes`), and
    the file's size now (open_in's rules and errors)."""
    with os.fdopen(open_in(folder, name), "rb") as f:
        size = os.fstat(f.fileno()).st_size
        f.seek(max(offset, size - max_bytes) if size >= offset else 0)
        return f.read(max_bytes).decode("utf-8", "replace"), size


def size_or_zero(folder: str, name: str) -> int:
    """`folder/name`'s size (open_in's rules), or 0 when it is missing or refused."""
    try:
        return read_after(folder, name, 1 << 62, 0)[1]
    except (OSError, Refused):
        return 0


def tail_or_empty(folder: str, name: str, max_bytes: int) -> str:
    """read_tail, or "" when the file is missing, unreadable or refused."""
    try:
        return read_tail(folder, name, max_bytes)
    except (OSError, Refused):
        return ""


class FileFollower:
    """Complete lines appended to one file, with their byte offsets.

    Survives the file not existing yet, truncation in place (size < offset: restart at the
    new end) and replacement (a new inode: rotation, restart at 0). A line longer than
    `max_text` is cut there and marked, and the rest of it skipped: memory stays bounded."""

    def __init__(
        self,
        path: str,
        offset: int | None = None,
        tail_bytes: int = TAIL_BYTES,
        max_text: int = MAX_TEXT_BYTES,
    ):
        self.path = path
        self.folder, self.name = os.path.split(path)
        self.offset = offset  # next byte to read; None = decide at first sight
        self.tail_bytes = tail_bytes
        self.max_text = max_text  # a longer line is cut here, marked, and its rest skipped
        self.inode: int | None = None
        self.partial = b""  # the start of an unfinished line (at most max_text bytes of it)
        self.skipped = 0  # bytes of the unfinished line dropped past max_text
        self.refused: str | None = None  # why the file is not followed (a symlink, a FIFO)

    def poll(self) -> tuple[list[tuple[int, int, str]], dict[str, Any] | None]:
        """-> (lines [(offset, end, text)], notice {size, reason} or None). The file is opened
        through open_in each time (never through a symlink); a refused one yields nothing and
        says why in `refused`."""
        try:
            fd = open_in(self.folder, self.name)
        except FileNotFoundError:
            return [], None
        except Refused as e:
            self.refused = str(e)
            return [], None
        self.refused = None
        with os.fdopen(fd, "rb") as f:
            return self._read(f, os.fstat(fd))

    def _read(
        self, f: Any, st: os.stat_result
    ) -> tuple[list[tuple[int, int, str]], dict[str, Any] | None]:
        notice = None
        if self.inode is not None and st.st_ino != self.inode:
            notice = {"size": st.st_size, "reason": "replaced"}
            self.offset, self.partial, self.skipped = 0, b"", 0
        elif self.offset is not None and st.st_size < self._read_to():
            notice = {"size": st.st_size, "reason": "truncated"}
            self.offset, self.partial, self.skipped = st.st_size, b"", 0
        self.inode = st.st_ino
        if self.offset is None:
            self.offset = 0
            if st.st_size > self.tail_bytes:
                self.offset = _line_start_after(f, st.st_size - self.tail_bytes)
        start = self._read_to()
        if st.st_size <= start:
            return [], notice
        f.seek(start)
        data = f.read(min(READ_CHUNK, st.st_size - start))
        lines = []
        pos = 0  # in `data`
        while pos < len(data):
            nl = data.find(b"\n", pos)
            piece = data[pos:] if nl < 0 else data[pos:nl]
            room = self.max_text - len(self.partial)
            self.partial += piece[:room]
            self.skipped += max(0, len(piece) - room)
            if nl < 0:
                break
            lines.append((self.offset, start + nl + 1, self._text()))
            self.offset, self.partial, self.skipped = start + nl + 1, b"", 0
            pos = nl + 1
        return lines, notice

    def _read_to(self) -> int:
        """The next byte to read: the line in progress is kept (in part) or skipped."""
        return (self.offset or 0) + len(self.partial) + self.skipped

    def _text(self) -> str:
        text = self.partial.decode("utf-8", "replace")
        if self.skipped:
            total = len(self.partial) + self.skipped
            text += f" … [line of {total:,} bytes cut at {len(self.partial):,}]"
        return text


def _line_start_after(f: Any, pos: int) -> int:
    f.seek(pos)
    while True:
        chunk = f.read(65536)
        if not chunk:
            return pos
        nl = chunk.find(b"\n")
        if nl >= 0:
            return pos + nl + 1
        pos += len(chunk)


class HeartbeatWatch:
    """heartbeat.json, re-read when its inode, mtime or size changes and checked with the
    contract's reader. A torn or foreign file is an error to report; the last good one
    stays what the monitor shows."""

    def __init__(
        self,
        path: str,
        parse: Callable[[Any, str], Any] = parse_heartbeat,
        limit: int = MAX_HEARTBEAT_BYTES,
    ) -> None:
        self.path = path
        self.sig: tuple[int, int, int] | None = None
        self.last_good: Any = None
        self.parse, self.limit = parse, limit  # a rank's heartbeat: RankWatch

    def poll(self) -> tuple[str, Any] | None:
        """-> ("ok", the heartbeat as written) | ("error", why) | None when unchanged."""
        try:
            st = os.lstat(self.path)  # the name itself: read_bounded refuses a symlink there
        except FileNotFoundError:
            return None
        sig = (st.st_ino, st.st_mtime_ns, st.st_size)
        if sig == self.sig:
            return None
        self.sig = sig
        name = os.path.basename(self.path)
        raw = read_bounded(self.path, self.limit)
        if raw is None:
            return None
        data = raw if isinstance(raw, Unreadable) else parse_json(raw, name, self.limit)
        if isinstance(data, Unreadable):
            return ("error", str(data))
        checked = self.parse(data, name)
        if isinstance(checked, Unreadable):
            return ("error", str(checked))
        # The event carries the file as written: a newer trainer's extra fields reach the
        # monitor, which parses it with the same reader.
        self.last_good = data
        return ("ok", data)


class Inotify:
    """Linux inotify through ctypes: the agent sleeps until a followed file changes.

    Event-driven following keeps latency at a few ms and idle CPU near zero; where inotify
    is missing (not Linux, a filesystem without it) the agent falls back to fast polling."""

    # MODIFY ATTRIB CLOSE_WRITE MOVED_TO CREATE DELETE
    MASK = 0x2 | 0x4 | 0x8 | 0x80 | 0x100 | 0x200
    DONT_FOLLOW = 0x02000000  # IN_DONT_FOLLOW: a run dir swapped for a symlink is not watched

    def __init__(self) -> None:
        import ctypes
        import ctypes.util

        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        self._add = libc.inotify_add_watch
        self._add.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_uint32]
        self._rm = libc.inotify_rm_watch
        self.fd = libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
        if self.fd < 0:
            raise OSError(ctypes.get_errno(), "inotify_init1 failed")
        self.watches: dict[str, int] = {}  # folder -> watch descriptor

    def watch(self, paths: list[str]) -> None:
        """Watch exactly these folders (missing ones are skipped: the poll covers them)."""
        for path in list(self.watches):
            if path not in paths:
                self._rm(self.fd, self.watches.pop(path))
        for path in paths:
            if path not in self.watches and os.path.isdir(path) and not os.path.islink(path):
                wd = self._add(self.fd, os.fsencode(path), self.MASK | self.DONT_FOLLOW)
                if wd >= 0:
                    self.watches[path] = wd

    def drain(self) -> None:
        while True:
            try:
                if not os.read(self.fd, 65536):
                    return
            except BlockingIOError:
                return

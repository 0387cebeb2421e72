"""The C-level signal disposition, which Python's `signal.getsignal` does not show.

A native library can take a signal from under Python with its own `sigaction`: Python still
reports its handler, yet the kernel calls the library's. On the GPU this is what silenced
SIGUSR1: Triton's compiler runs LLVM in-process, and LLVM installs its handlers the first time
it compiles (SIGUSR1 as its "info" signal, swallowed; SIGTERM, SIGINT and SIGUSR2 as interrupts
it re-raises to the previous handler, so those kept working). `Disposition` records the
kernel's entry for a signal so that it can be compared and put back from any thread.

Linux/glibc layout; elsewhere `read` returns None and nothing is guarded.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import sys


class _Sigaction(ctypes.Structure):
    # glibc's struct sigaction on x86_64 and aarch64.
    _fields_ = [
        ("handler", ctypes.c_void_p),
        ("mask", ctypes.c_ulong * (128 // ctypes.sizeof(ctypes.c_ulong))),
        ("flags", ctypes.c_int),
        ("restorer", ctypes.c_void_p),
    ]


class _DlInfo(ctypes.Structure):
    _fields_ = [
        ("fname", ctypes.c_char_p),
        ("fbase", ctypes.c_void_p),
        ("sname", ctypes.c_char_p),
        ("saddr", ctypes.c_void_p),
    ]


def _libc() -> ctypes.CDLL | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    except OSError:
        return None


_LIBC = _libc()


class Disposition:
    """One signal's kernel entry, as read at one moment."""

    def __init__(self, signum: int, raw: _Sigaction) -> None:
        self.signum, self._raw = signum, raw

    @property
    def handler(self) -> int:
        return int(self._raw.handler or 0)

    def restore(self) -> bool:
        """Put this entry back (any thread may). False if the kernel refused."""
        assert _LIBC is not None
        return _LIBC.sigaction(self.signum, ctypes.byref(self._raw), None) == 0


def read(signum: int) -> Disposition | None:
    if _LIBC is None:
        return None
    raw = _Sigaction()
    if _LIBC.sigaction(signum, None, ctypes.byref(raw)) != 0:
        return None
    return Disposition(signum, raw)


def owner(address: int) -> str:
    """The shared object (and symbol, when exported) a handler's address lies in."""
    if address in (0, 1):
        return "SIG_DFL" if address == 0 else "SIG_IGN"
    try:
        dladdr = ctypes.CDLL(None).dladdr
    except (OSError, AttributeError):
        return f"{address:#x}"
    info = _DlInfo()
    if not dladdr(ctypes.c_void_p(address), ctypes.byref(info)) or not info.fname:
        return f"{address:#x}"
    where = os.path.basename(info.fname.decode(errors="replace")) or "the executable"
    return f"{where}:{info.sname.decode(errors='replace')}" if info.sname else where

"""A diagnosis probe for SIGUSR1 on a live trainer (issue 13): put this folder first on
PYTHONPATH and set SIGPROBE_LOG=FILE. Logs every signal.signal / faulthandler.register call
for SIGUSR1/SIGUSR2 (with the caller), and each change of the Python-level and the C-level
(sigaction) handlers of SIGUSR1, SIGUSR2 and SIGTERM, from a watcher thread."""

import ctypes
import faulthandler
import os
import signal
import threading
import time
import traceback

LOG = os.environ.get("SIGPROBE_LOG")


def _log(msg: str) -> None:
    with open(LOG, "a") as f:  # type: ignore[arg-type]
        f.write(f"{time.time():.3f} pid={os.getpid()} {msg}\n")


class _Sigaction(ctypes.Structure):
    _fields_ = [
        ("handler", ctypes.c_void_p),
        ("mask", ctypes.c_ulong * 16),
        ("flags", ctypes.c_int),
        ("restorer", ctypes.c_void_p),
    ]


def _c_handler(sig: int) -> str:
    libc = ctypes.CDLL(None, use_errno=True)
    old = _Sigaction()
    libc.sigaction(sig, None, ctypes.byref(old))
    return f"{old.handler or 0:#x}/flags={old.flags:#x}"


if LOG:
    _signal, _register = signal.signal, faulthandler.register

    def _patched_signal(sig, handler):  # type: ignore[no-untyped-def]
        if sig in (signal.SIGUSR1, signal.SIGUSR2):
            stack = "".join(traceback.format_stack(limit=10))
            _log(f"signal.signal({sig}, {handler!r}) from\n{stack}")
        return _signal(sig, handler)

    def _patched_register(sig, *a, **k):  # type: ignore[no-untyped-def]
        _log(f"faulthandler.register({sig}) from\n{''.join(traceback.format_stack(limit=10))}")
        return _register(sig, *a, **k)

    signal.signal = _patched_signal  # type: ignore[assignment]
    faulthandler.register = _patched_register  # type: ignore[assignment]

    def _watch() -> None:
        last = None
        while True:
            now = [
                (name, repr(signal.getsignal(s)), _c_handler(s))
                for name, s in (
                    ("USR1", signal.SIGUSR1),
                    ("USR2", signal.SIGUSR2),
                    ("TERM", signal.SIGTERM),
                )
            ]
            if now != last:
                _log(f"handlers {now}")
                last = now
            time.sleep(0.5)

    threading.Thread(target=_watch, name="sigprobe", daemon=True).start()

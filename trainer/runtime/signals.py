"""Signals an operator sends a live run.

  SIGUSR1  every thread's stack, with thread names, into stacks-<time>.txt; training goes on.
  SIGUSR2  the same through faulthandler's C-level handler: works even when the interpreter
           is wedged (a thread holding the GIL in C code), but without thread names.
  SIGTERM  finish the current step, checkpoint, exit 0.
  SIGINT   as SIGTERM.

Python runs signal handlers on the main thread, between any two of its bytecodes, and runs a
second one inside the first. A handler that took a lock (the log's, an Event's, the run
state's) deadlocked whenever the main thread already held it, in its own code or in the
handler the second signal interrupted (CI: a SIGUSR1 landing while the first one's log line
was being written, then the SIGTERM, and the run never stopped). So the handlers only put the
request on a SimpleQueue (whose put is reentrant: made for this) and a "signals" thread,
which no handler interrupts, does the work. The main thread only supervises (it waits on
events with timeouts), so a request is served within milliseconds.

A native library may take these signals from under Python (on the GPU, Triton's in-process
LLVM takes SIGUSR1 and swallows it: see trainer/runtime/sigaction.py). A guard thread compares the
kernel's entries with ours five times a second and puts ours back, saying once which
library took them.
"""

from __future__ import annotations

import faulthandler
import queue
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import IO

from trainer.runtime import sigaction

# The signals an operator sends; the fatal ones stay with whoever chains them (LLVM's handler
# re-raises to faulthandler's).
GUARDED = (signal.SIGUSR1, signal.SIGUSR2, signal.SIGTERM, signal.SIGINT)
GUARD_PERIOD_S = 0.2


def stacks_path(run_dir: Path) -> Path:
    stamp = time.strftime("%Y%m%d-%H%M%S")
    path = run_dir / f"stacks-{stamp}.txt"
    n = 1
    while path.exists():  # two dumps in one second: never overwrite the first
        path = run_dir / f"stacks-{stamp}-{n}.txt"
        n += 1
    return path


def write_named_stacks(out: IO[str], roles: dict[int, str] | None = None) -> None:
    """Every Python thread's stack, headed by its name (and pipeline role when known)."""
    frames = sys._current_frames()
    out.write(f"# {len(frames)} threads at {time.strftime('%Y-%m-%d %H:%M:%S')}\n\n")
    for t in sorted(threading.enumerate(), key=lambda t: t.name):
        frame = frames.get(t.ident) if t.ident is not None else None
        role = (roles or {}).get(t.ident or 0, "")
        out.write(f'Thread "{t.name}"{f" role={role}" if role else ""} native_id={t.native_id}\n')
        if frame is not None:
            out.write("".join(traceback.format_stack(frame)))
        out.write("\n")


class SignalHandlers:
    def __init__(
        self,
        run_dir: Path,
        on_stop: Callable[[str], None],
        roles: Callable[[], dict[int, str]],
        on_dump: Callable[[Path], None] = lambda _p: None,
    ) -> None:
        self.run_dir, self.on_stop, self.roles, self.on_dump = run_dir, on_stop, roles, on_dump
        self._fallback: IO[str] | None = None
        self._ours: dict[int, sigaction.Disposition] = {}
        self._guard_stop = threading.Event()
        self._guard_lock = threading.Lock()  # a guard pass never undoes ignore_stops
        # What the handlers asked for: "dump", or the name of a stop signal.
        self._requests: queue.SimpleQueue[str] = queue.SimpleQueue()

    def install(self) -> None:
        # The thread first: a signal that comes at once is served.
        threading.Thread(target=self._serve, name="signals", daemon=True).start()
        signal.signal(signal.SIGUSR1, self._dump)
        signal.signal(signal.SIGTERM, self._stop)
        signal.signal(signal.SIGINT, self._stop)
        # Kept open for the life of the process: the C handler cannot open files.
        self._fallback = open(self.run_dir / "stacks-sigusr2.txt", "a")  # noqa: SIM115
        faulthandler.register(signal.SIGUSR2, file=self._fallback, all_threads=True)
        faulthandler.enable(file=self._fallback, all_threads=True)  # and on fatal signals
        for sig in GUARDED:
            if (mine := sigaction.read(sig)) is not None:
                self._ours[sig] = mine

    def guard(self) -> dict[str, str]:
        """Put back each of our handlers that a native library replaced at the C level:
        {signal name: the library that had taken it}. Any thread may call it."""
        taken: dict[str, str] = {}
        with self._guard_lock:
            if self._guard_stop.is_set():
                return taken
            for sig, mine in self._ours.items():
                now = sigaction.read(sig)
                if now is not None and now.handler != mine.handler and mine.restore():
                    taken[signal.Signals(sig).name] = sigaction.owner(now.handler)
        return taken

    def start_guard(self, on_taken: Callable[[dict[str, str]], None]) -> threading.Thread:
        """A daemon thread running `guard` every GUARD_PERIOD_S for the life of the process."""

        def loop() -> None:
            while not self._guard_stop.wait(GUARD_PERIOD_S):
                if taken := self.guard():
                    on_taken(taken)

        th = threading.Thread(target=loop, name="signal-guard", daemon=True)
        th.start()
        return th

    def ignore_stops(self) -> None:
        """The run has ended (its final heartbeat is written): a late SIGTERM or SIGINT (a
        second kill, a group signal during teardown) has nothing left to stop. Ignored, it
        cannot turn a clean exit into death by signal while the interpreter shuts down
        (which puts back the default handlers)."""
        with self._guard_lock:
            self._guard_stop.set()
            for sig in (signal.SIGTERM, signal.SIGINT):
                signal.signal(sig, signal.SIG_IGN)

    def _dump(self, _signum: int, _frame: FrameType | None) -> None:
        self._requests.put("dump")  # reentrant; nothing else here (the module's docstring)

    def _stop(self, signum: int, _frame: FrameType | None) -> None:
        self._requests.put(signal.Signals(signum).name)

    def _serve(self) -> None:
        """The handlers' work, one request at a time. The requests queued behind one are taken
        with it: a storm of SIGUSR1s writes one dump per pass, not a backlog of thousands."""
        while True:
            asked = {self._requests.get()}
            while True:
                try:
                    asked.add(self._requests.get_nowait())
                except queue.Empty:
                    break
            try:
                for name in sorted(asked - {"dump"}):
                    self.on_stop(name)
                if "dump" in asked:
                    self.on_dump(self.write_dump())
            except Exception:  # a full disk, say: said, and the next signal is still served
                traceback.print_exc()

    def write_dump(self) -> Path:
        path = stacks_path(self.run_dir)
        with open(path, "w") as f:
            write_named_stacks(f, self.roles())
            # faulthandler's view too: it also shows where C code is waiting.
            f.write("# faulthandler\n")
            f.flush()
            faulthandler.dump_traceback(file=f, all_threads=True)
        return path

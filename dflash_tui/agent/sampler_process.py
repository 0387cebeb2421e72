"""The agent's samplers (GPUs, the host, the followed run's processes, the runs list) in a
child process of their own, so that the loop that forwards a run's lines never waits for them.

As threads of the agent they held its GIL in Python for milliseconds a sample (8 GPUs behind
NVML's Python binding, a /proc scan of the run's process group), and on a loaded host a
sampler preempted while holding it held the loop's next line back for a whole scheduler
slice: line latency p99 26-44 ms while a run trained beside it (issue 32). The runs list
read every run's files on the loop itself (~1 ms a run every 10 s). In a process of their
own they share only the CPU with the loop, never the GIL.

The child is forked before the agent starts any thread. It writes its events, whole JSON
lines, into a pipe that the loop relays to stdout between its own (`SamplerChild.relay`);
the loop tells it which run it follows over another pipe (one run id a line, an empty line
for none), and its end of that pipe closing (the agent gone) ends the child. Where fork is
missing or fails, or the child dies, the samplers run as threads again (`Agent.run`); the
agent's `--sampler-threads` asks for that (bench/agent_latency.py's comparison).
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from typing import Protocol

from dflash_tui.agent.gpus import Gpus
from dflash_tui.agent.output import Out

READ_BYTES = 1 << 16
REAP_S = 2.0  # at most, for the child to end once told


class Sampled(Protocol):
    """What of the agent (loop.Agent) the child runs: its sampler loops and what they read."""

    out: Out
    gpus: Gpus
    run_id: str | None
    stop: threading.Event

    def gpu_loop(self) -> None: ...
    def host_loop(self) -> None: ...
    def procs_loop(self) -> None: ...
    def runs_loop(self) -> None: ...


class SamplerChild:
    """The parent's ends: the child's events to relay, the followed run to tell it."""

    def __init__(self, pid: int, events: int, follow: int) -> None:
        self.pid = pid
        self.events = events  # read end, non-blocking: the loop selects on it
        self.follow_fd = follow
        self._partial = b""  # a line the child has not finished writing yet

    def relay(self, out: Out) -> bool:
        """Each whole line the child has written, to the agent's stdout as it is; False once
        the child has gone (end of file)."""
        try:
            data = os.read(self.events, READ_BYTES)
        except BlockingIOError:
            return True
        except OSError:
            data = b""
        if not data:
            return False
        *lines, self._partial = (self._partial + data).split(b"\n")
        for line in lines:
            if line:
                out.write_line(line + b"\n")
        return True

    def follow(self, run_id: str | None) -> None:
        """The run the process table samples (None: none)."""
        with contextlib.suppress(OSError):  # gone: the loop falls back when it reads EOF
            os.write(self.follow_fd, f"{run_id or ''}\n".encode())

    def close(self) -> None:
        for fd in (self.follow_fd, self.events):
            with contextlib.suppress(OSError):
                os.close(fd)
        # It ends at once on either pipe closing (or has ended: its events pipe said so);
        # reaped here, never left a zombie for as long as the agent lives.
        deadline = time.monotonic() + REAP_S
        with contextlib.suppress(OSError):
            while os.waitpid(self.pid, os.WNOHANG) == (0, 0) and time.monotonic() < deadline:
                time.sleep(0.01)


def start(agent: Sampled) -> SamplerChild | None:
    """Fork the samplers' process (before the agent has any thread); None where it cannot
    be forked."""
    if not hasattr(os, "fork"):
        return None
    events_r, events_w = os.pipe()
    follow_r, follow_w = os.pipe()
    try:
        pid = os.fork()
    except OSError:
        for fd in (events_r, events_w, follow_r, follow_w):
            os.close(fd)
        return None
    if pid == 0:  # the child: never returns into the agent's loop
        code = 1
        try:
            os.close(events_r)
            os.close(follow_w)
            _serve(agent, events_w, follow_r)
            code = 0
        finally:
            os._exit(code)
    os.close(events_w)
    os.close(follow_r)
    os.set_blocking(events_r, False)
    return SamplerChild(pid, events_r, follow_w)


def _serve(agent: Sampled, events_w: int, follow_r: int) -> None:
    """The child: the sampler threads, until the agent's end of `follow_r` closes."""
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):  # the ssh channel is the agent's alone: its session ends with it
        os.dup2(devnull, fd)
    agent.out = Out(os.fdopen(events_w, "wb"))
    agent.gpus = Gpus()  # its own NVML session: the parent's was opened before the fork
    for target, name in (
        (agent.gpu_loop, "gpu"),
        (agent.host_loop, "host"),
        (agent.procs_loop, "procs"),
        (agent.runs_loop, "runs"),
    ):
        threading.Thread(target=target, name=name, daemon=True).start()
    with os.fdopen(follow_r, "rb") as told:
        for line in told:
            agent.run_id = line.decode("utf-8", "replace").strip() or None
    agent.stop.set()

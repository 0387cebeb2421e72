"""The agent's loop: one thread that follows one run's files, lists the runs, reports the
followed run's liveness and carries out commands; a stdin thread and a GPU thread feed it.

The loop sleeps in select() on a wake pipe (a command arrived) and inotify (a followed file
changed), so a new line reaches the monitor within milliseconds and an idle agent costs
next to nothing. Commands that wait (kill, launch, deploy) run on threads of their own.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import queue
import select
import shutil
import socket
import sys
import threading
import time
import traceback
from typing import Any

from dflash_tui.agent.commands import HANDLERS
from dflash_tui.agent.errors import CommandError
from dflash_tui.agent.files import FileFollower, HeartbeatWatch, Inotify
from dflash_tui.agent.gpus import Gpus
from dflash_tui.agent.host import HostProbe
from dflash_tui.agent.kernel_log import XidWatch
from dflash_tui.agent.output import Out
from dflash_tui.agent.proc_table import ProcTable
from dflash_tui.agent.rank_watch import RankWatch
from dflash_tui.agent.runs import LOCK_PAUSE_S, AliveProbe, RunRoot
from dflash_tui.agent.sampler_process import SamplerChild
from dflash_tui.agent.sampler_process import start as start_samplers
from dflash_tui.agent.stdin import Rejected, parse_command, read_lines
from trainer.contract.protocol import (
    FOLLOWED_FILES,
    PROTOCOL_VERSION,
    QUICK_COMMANDS,
    Command,
    Deployed,
    Follow,
    GpuSample,
    HeartbeatError,
    HeartbeatEvent,
    Hello,
    Line,
    Liveness,
    Log,
    Progress,
    RankHeartbeatEvent,
    Result,
    RunInfo,
    RunsEvent,
    Truncated,
)
from trainer.contract.records import HEARTBEAT
from trainer.contract.typed import Invalid, decode, encode, read_bounded

RUNS_EVERY_S = 10.0  # the runs list also goes out at once on a change
LIVENESS_EVERY_S = 5.0  # the liveness event too
PERIODIC_S = 1.0  # how often the loop looks for new runs and liveness changes


class Agent:
    def __init__(self, args: argparse.Namespace, out: Out) -> None:
        self.args = args
        self.out = out
        self.remote_dir = os.path.abspath(os.path.expanduser(args.remote_dir))
        self.runs = RunRoot(os.path.abspath(os.path.expanduser(args.run_root)))
        self.alive_probe = AliveProbe(self.runs)
        self.commands: queue.Queue[Command | None] = queue.Queue()  # None: stdin closed
        self.stop = threading.Event()
        self.wake_r, self.wake_w = os.pipe()
        os.set_blocking(self.wake_r, False)
        os.set_blocking(self.wake_w, False)
        # What is followed. The follow command (loop thread) and the file poll share it.
        self.lock = threading.Lock()
        self.follow_target: str | None = None  # a run id or "latest"; None until asked
        self.from_start: list[str] = []  # files followed from byte 0 (FollowRun.from_start)
        self.run_id: str | None = None
        self.followers: dict[str, FileFollower] = {}
        self.heartbeat: HeartbeatWatch | None = None
        self.rank_watch: RankWatch | None = None
        self.last_liveness: tuple[Any, ...] | None = None
        self.last_liveness_at = 0.0
        self.last_runs: tuple[Any, ...] | None = None
        self.last_runs_at = 0.0
        self.said_refused: dict[str, str] = {}  # symlinks under the run root, warned about
        vendored = os.path.join(self.remote_dir, "current", "_vendor")
        if os.path.isdir(vendored):
            sys.path.insert(0, vendored)  # the pynvml that deploy carried along
        self.gpus = Gpus()
        self.samplers: SamplerChild | None = None  # their process (None: threads of this one)

    # -- plumbing ----------------------------------------------------------------------------
    def hello(self) -> None:
        self.out.emit(
            Hello(
                version=PROTOCOL_VERSION,
                pid=os.getpid(),
                host=socket.gethostname(),
                python=sys.executable,
                python_version=sys.version.split()[0],
                run_root=self.runs.path,
                remote_dir=self.remote_dir,
                gpu_backend=self.gpus.backend,
                gpu_reason=self.gpus.reason,
                pyspy=bool(shutil.which("py-spy")),
                deployed=self.deployed(),
            )
        )

    def deployed(self) -> Deployed | None:
        """deployed.json, or None when nothing (readable) was deployed."""
        # Bounded, regular files only: a FIFO there would block the agent before its hello.
        raw = read_bounded(os.path.join(self.remote_dir, "deployed.json"), 65536)
        if not isinstance(raw, bytes):
            return None
        try:
            return decode(Deployed, json.loads(raw))
        except (ValueError, RecursionError, Invalid):
            return None

    def log(self, level: str, message: str) -> None:
        self.out.emit(Log(level=level, message=message))

    def progress(self, cmd: Command, message: str) -> None:
        self.out.emit(Progress(id=cmd.id, message=message))

    def read_stdin(self) -> None:
        for line in read_lines(sys.stdin.buffer):
            try:
                got = parse_command(line)
            except Exception as e:  # a bug in a decoder: answer it, keep reading
                got = Rejected(None, f"command unreadable: {type(e).__name__}: {e}")
            if isinstance(got, Rejected):
                self.out.emit(Result(id=got.id, ok=False, error=got.error))
                if got.id is None:  # nothing to match it with: say it where a person looks
                    self.log("error", f"bad command line: {got.error}")
            elif got is not None:
                self.commands.put(got)
                self.wake()
        self.commands.put(None)  # EOF: the client went away
        self.wake()

    def wake(self) -> None:
        with contextlib.suppress(OSError):
            os.write(self.wake_w, b"x")

    def run(self) -> None:
        self.hello()
        if not self.args.sampler_threads:  # forked before this process has any thread
            self.samplers = start_samplers(self)
        threading.Thread(target=self.read_stdin, name="stdin", daemon=True).start()
        if self.samplers is None:
            self.sampler_threads()
        try:
            self.serve()
        finally:
            if self.samplers is not None:
                self.samplers.close()

    def sampler_threads(self) -> None:
        """The samplers as threads of the agent: where their process could not be forked."""
        threading.Thread(target=self.gpu_loop, name="gpu", daemon=True).start()
        threading.Thread(target=self.host_loop, name="host", daemon=True).start()
        threading.Thread(target=self.procs_loop, name="procs", daemon=True).start()

    def relay_samples(self) -> None:
        """The samplers' process's events out; once it has gone, its samplers as threads."""
        child = self.samplers
        if child is None or child.relay(self.out):
            return
        self.samplers = None
        child.close()
        self.log("warning", "the samplers' process ended: sampling in the agent's own")
        self.sampler_threads()

    def serve(self) -> None:
        inotify = None
        why = "--no-inotify"
        if not self.args.no_inotify:
            try:
                inotify = Inotify()
            except (OSError, AttributeError) as e:
                why = f"no inotify: {e}"
        if inotify is None:
            self.log(
                "info",
                f"following files by polling every {self.args.poll_interval * 1e3:.0f} ms ({why})",
            )
        # With inotify, a slow poll is only the safety net for missed events.
        poll = 0.5 if inotify is not None else self.args.poll_interval
        next_periodic = 0.0
        while not self.stop.is_set():
            waits = [self.wake_r] + ([inotify.fd] if inotify is not None else [])
            if self.samplers is not None:
                waits.append(self.samplers.events)
            timeout = max(0.0, min(poll, next_periodic - time.monotonic()))
            ready, _, _ = select.select(waits, [], [], timeout)
            if self.samplers is not None and self.samplers.events in ready:
                self.relay_samples()
            if self.wake_r in ready:
                with contextlib.suppress(BlockingIOError):
                    os.read(self.wake_r, 4096)
                if not self.drain_commands():
                    break
            if inotify is not None and inotify.fd in ready:
                inotify.drain()
            try:
                if time.monotonic() >= next_periodic:
                    settled, alive = self.alive_probe.poll()
                    if settled:
                        next_periodic = time.monotonic() + PERIODIC_S
                        self.check_runs(alive)
                    else:  # the lock was held: look again soon, following files meanwhile
                        next_periodic = time.monotonic() + LOCK_PAUSE_S
                self.follow_files()
                if inotify is not None:
                    inotify.watch(self.watched_dirs())
            except Exception as e:  # never die of a monitoring hiccup
                self.log("error", f"tick: {e}")
        self.stop.set()

    def drain_commands(self) -> bool:
        """Run every queued command; False once stdin has closed."""
        while True:
            try:
                cmd = self.commands.get_nowait()
            except queue.Empty:
                return True
            if cmd is None:
                return False
            self.dispatch(cmd)

    def watched_dirs(self) -> list[str]:
        dirs = [self.runs.path]
        if self.run_id is not None:
            dirs.append(self.runs.run_dir(self.run_id))
        return dirs

    def gpu_loop(self) -> None:
        backend = self.gpus.backend
        if backend == "none":
            self.out.emit(GpuSample(backend="none", state="no_gpu", reason=self.gpus.reason))
            return
        last_error = None
        xids = XidWatch()
        while not self.stop.is_set():
            try:
                devices = self.gpus.sample()
                xids.refresh()
                self.out.emit(
                    GpuSample(
                        backend=backend,
                        devices=devices,
                        xids=xids.xids,
                        kernel_log=xids.unreadable,
                    )
                )
                last_error = None
            except Exception as e:
                if str(e) != last_error:  # say it once, not every second
                    last_error = str(e)
                    self.out.emit(GpuSample(backend=backend, state="error", reason=str(e)))
            self.stop.wait(self.args.gpu_interval)

    def host_loop(self) -> None:
        """A host sample a second after start (its CPU use needs an interval), then every
        --host-interval seconds."""
        probe = HostProbe(self.runs.path)
        wait = min(1.0, self.args.host_interval)
        while not self.stop.wait(wait):
            wait = self.args.host_interval
            try:
                self.out.emit(probe.sample())
            except Exception as e:  # never die of a monitoring hiccup
                self.log("error", f"host sample: {type(e).__name__}: {e}")

    def procs_loop(self) -> None:
        """The followed run's process group (proc_table.py) on the host sample's period,
        and at once (within half a second) when the followed run changes."""
        table = ProcTable(self.runs)
        sampled: tuple[str | None, float] = (None, 0.0)  # (run id, monotonic time)
        while not self.stop.wait(0.5):
            run_id = self.run_id
            if run_id is None or (
                run_id == sampled[0] and time.monotonic() - sampled[1] < self.args.host_interval
            ):
                continue
            sampled = (run_id, time.monotonic())
            try:
                self.out.emit(table.sample(run_id))
            except Exception as e:  # never die of a monitoring hiccup
                self.log("error", f"procs sample: {type(e).__name__}: {e}")

    # -- following ---------------------------------------------------------------------------
    def follow_files(self) -> None:
        with self.lock:
            run_id = self.run_id
            followers = dict(self.followers)
            hb = self.heartbeat
            ranks = self.rank_watch
        if run_id is None:
            return
        # The files' new lines first: a step line is what an operator waits on, and reading
        # and checking a heartbeat (~1 ms) before it was on every line's path that came
        # with one.
        for name, follower in followers.items():
            refused = follower.refused
            try:
                lines, notice = follower.poll()
            except OSError as e:
                self.log("warning", f"{name}: {e}")
                continue
            if follower.refused is not None and follower.refused != refused:
                self.log("warning", follower.refused)  # once, not every tick
            if notice:
                self.out.emit(Truncated(run_id=run_id, file=name, **notice))
            for offset, end, text in lines:
                self.out.emit(Line(run_id=run_id, file=name, offset=offset, end=end, text=text))
        if hb is not None:
            got = hb.poll()
            if got is not None:
                kind, value = got
                if kind == "ok":
                    self.out.emit(HeartbeatEvent(run_id=run_id, data=value))
                else:
                    self.out.emit(HeartbeatError(run_id=run_id, error=value))
        for rank, kind, value in ranks.poll() if ranks is not None else []:
            if kind == "ok":
                self.out.emit(RankHeartbeatEvent(run_id=run_id, rank=rank, data=value))
            else:
                self.out.emit(RankHeartbeatEvent(run_id=run_id, rank=rank, error=value))

    def set_follow(self, run_id: str, offsets: dict[str, int], resumed: bool = False) -> None:
        d = self.runs.run_dir(run_id)
        followers = {}
        for name in FOLLOWED_FILES:
            off = offsets.get(name)
            followers[name] = FileFollower(
                os.path.join(d, name),
                off if off is not None and off >= 0 else None,
                self.args.tail_bytes,
            )
        with self.lock:
            self.run_id = run_id
            self.followers = followers
            self.heartbeat = HeartbeatWatch(os.path.join(d, HEARTBEAT))
            self.rank_watch = RankWatch(d)
            self.last_liveness = None
        if self.samplers is not None:
            self.samplers.follow(run_id)
        self.out.emit(Follow(run_id=run_id, run_dir=d, resumed=resumed))

    def follow_nothing(self) -> None:
        with self.lock:
            self.run_id = None
        if self.samplers is not None:
            self.samplers.follow(None)
        # Said, not left silent: a one-shot `status` knows at once there is no run to wait for.
        self.out.emit(Follow(run_id=None))

    # -- the runs list and liveness ----------------------------------------------------------
    def check_runs(self, alive: str | None) -> None:
        """Once a second, given the alive run (`AliveProbe`): new runs, liveness; the runs
        list (`runs_changed`) only where the samplers have no process of their own, which
        lists them (`runs_loop`): each run's files read, ~1 ms a run, a stall of the loop
        on a host of many runs."""
        ids = self.runs.run_ids()
        for name, why in self.runs.refused.items():
            if self.said_refused.get(name) != why:  # once per planted name, not every second
                self.log("warning", f"{os.path.join(self.runs.path, name)} is {why}")
        self.said_refused = dict(self.runs.refused)
        if self.follow_target == "latest" and ids and ids[-1] != self.run_id:
            self.set_follow(ids[-1], dict.fromkeys(self.from_start, 0))
        if self.samplers is None:
            self.runs_changed(alive, ids)
        self.check_liveness(alive, time.time())

    def runs_changed(self, alive: str | None, ids: list[str]) -> None:
        """The runs list on a change (a run added, another alive), and every RUNS_EVERY_S."""
        sig = (tuple(ids), alive)
        now = time.time()
        if sig != self.last_runs or now - self.last_runs_at > RUNS_EVERY_S:
            self.last_runs, self.last_runs_at = sig, now
            self.emit_runs(alive, ids)

    def runs_loop(self) -> None:
        """The runs list, from the samplers' process: looked at at once, then every
        PERIODIC_S (alive_run may sleep here: this is no loop a line waits on)."""
        while True:
            try:
                self.runs_changed(self.runs.alive_run(), self.runs.run_ids())
            except Exception as e:  # never die of a monitoring hiccup
                self.log("error", f"runs list: {type(e).__name__}: {e}")
            if self.stop.wait(PERIODIC_S):
                return

    def emit_runs(self, alive: str | None = None, ids: list[str] | None = None) -> None:
        alive = self.runs.alive_run() if alive is None else alive
        ids = self.runs.run_ids() if ids is None else ids
        infos = []
        for run_id in ids:
            try:
                infos.append(self.runs.info(run_id, alive))
            except Exception as e:  # one odd run never hides the others
                infos.append(RunInfo(run_id=run_id, error=f"{type(e).__name__}: {e}"))
        self.out.emit(RunsEvent(runs=infos, alive_run=alive))

    def check_liveness(self, alive_run: str | None, now: float) -> None:
        run_id = self.run_id
        if run_id is None:
            return
        alive, proc, exit_record = self.runs.liveness(run_id, alive_run)
        exit_json = json.dumps(encode(exit_record), sort_keys=True)
        state = (run_id, alive, proc.pid, proc.pgid, exit_json)
        if state != self.last_liveness or now - self.last_liveness_at >= LIVENESS_EVERY_S:
            self.last_liveness, self.last_liveness_at = state, now
            self.out.emit(
                Liveness(run_id=run_id, alive=alive, pid=proc.pid, pgid=proc.pgid, exit=exit_record)
            )

    # -- commands ----------------------------------------------------------------------------
    def dispatch(self, cmd: Command) -> None:
        handler = HANDLERS[type(cmd)]

        def work() -> None:
            try:
                data = handler(self, cmd)
                self.out.emit(Result(id=cmd.id, ok=True, data=data))
            except CommandError as e:
                self.out.emit(Result(id=cmd.id, ok=False, error=str(e), bad_input=e.bad_input))
            except Exception as e:
                self.out.emit(
                    Result(
                        id=cmd.id,
                        ok=False,
                        error=f"{type(e).__name__}: {e}",
                        traceback=traceback.format_exc(),
                    )
                )

        if cmd.cmd in QUICK_COMMANDS:
            work()
        else:  # long commands must not stall the stream
            threading.Thread(target=work, name=f"cmd-{cmd.cmd}", daemon=True).start()

"""The run root: which folders are runs, the launch lock, each run's process, the one
liveness rule, and each run's line in the runs list (`RunInfo`, built from the contract's
readers: a torn or foreign file is named in `unreadable`, never a crash of the list).

Nothing outside the run root is read through it: a run dir is a real folder directly under
the root, and a run's file a regular file directly in it. Each is opened without following a
symlink (O_NOFOLLOW, the file relative to its folder's descriptor), so a planted
`runs/evil -> /etc` or `train.log -> /etc/passwd` is refused, not followed.
"""

from __future__ import annotations

import dataclasses
import errno
import fcntl
import json
import os
import re
import socket
import stat
import time
from typing import Any, TypeVar

from dflash_tui.agent.errors import CommandError
from dflash_tui.agent.files import SAFE_NAME, Refused, open_dir, open_in, tail_or_empty, what_is
from dflash_tui.agent.procs import pid_alive
from dflash_tui.agent.resume import Checkpoints
from trainer.contract.checkpoints import CheckpointUse, ResumePoint, Skipped, pt_name, step_of
from trainer.contract.comparable import signature_of
from trainer.contract.environment import read_environment, read_preflight
from trainer.contract.heartbeat import Heartbeat, read_heartbeat
from trainer.contract.nodes import new_run_id
from trainer.contract.outcomes import CRASH, DIED, outcome_of
from trainer.contract.phases import phase_durations
from trainer.contract.protocol import RunEval, RunInfo
from trainer.contract.records import (
    ACTIVE,
    CHECKPOINTS,
    CONFIG,
    EXIT,
    HEARTBEAT,
    LAUNCH,
    LAUNCH_LOCK,
    LAUNCH_LOG,
    METRICS,
    RUN_FILES,
    TRAIN_LOG,
    ExitRecord,
    LaunchRecord,
    read_config,
    read_exit,
    read_launch,
    write_json_atomic,
)
from trainer.contract.steplines import parse_step_line
from trainer.contract.typed import Unreadable, read_bounded

LOCK_NAME = LAUNCH_LOCK  # flock-ed while a run lives (launched, or started by hand)
ACTIVE_NAME = ACTIVE  # which run holds the lock: {run_id, wrapper_pid}
SAFE_ID = SAFE_NAME  # a run id: one plain name, no `..`, no slash
CHECKPOINT_NAME = re.compile(r"^step-\d+\.pt$")
LAST_WORDS_BYTES = 16 * 1024  # how much of a log's end to search for its last words
METRICS_CHUNK = 4 << 20  # bytes of metrics.jsonl held at once while summarising it
MAX_LINEAGE = 16  # runs followed back for one with no good checkpoint of its own

T = TypeVar("T")


@dataclasses.dataclass(frozen=True)
class Process:
    """A run's trainer process, as its records name it."""

    pid: int | None = None
    pgid: int | None = None
    start: int | None = None  # proc_start: with the pid, it names the process
    here: bool = True  # recorded on this host (a shared run root may hold other hosts' runs)
    host: str | None = None  # the host its heartbeat names
    launched: bool = False  # launch.json is there: the run holds the launch lock while it lives
    schema: int | None = None  # its heartbeat's schema (1 recorded no start time)


def process_of(launch: LaunchRecord | None, hb: Heartbeat | None) -> Process:
    """launch.json's pid (the wrapper wrote it), else the heartbeat's (a run started by hand)."""
    known = Process(
        here=hb is None or hb.host == socket.gethostname(),
        host=hb.host if hb else None,
        launched=launch is not None,
        schema=hb.schema if hb else None,
    )
    if launch is not None and launch.pid:
        start = launch.proc_start
        if start is None and hb is not None and hb.pid == launch.pid:
            start = hb.proc_start
        return dataclasses.replace(
            known, pid=launch.pid, pgid=launch.pgid or launch.pid, start=start
        )
    if hb is not None:
        return dataclasses.replace(known, pid=hb.pid, pgid=hb.process_group, start=hb.proc_start)
    return known


def read_process(run_dir: str) -> Process:
    """The run's process as the files in `run_dir` name it (process_of)."""
    launch, hb = read_launch(run_dir), read_heartbeat(os.path.join(run_dir, HEARTBEAT))
    return process_of(
        launch if isinstance(launch, LaunchRecord) else None,
        hb if isinstance(hb, Heartbeat) else None,
    )


def is_alive(run_id: str, alive_run: str | None, has_exit: bool, proc: Process) -> bool:
    """THE liveness rule; the runs list and the liveness event both ask it.

    A run is alive iff the run root's launch lock is held and .active.json names it, or it
    has no exit.json and its recorded process, on this host, is alive, not a zombie, and
    (when its start time is recorded) the process that started then: a reused pid is not it.
    """
    if alive_run == run_id:
        return True
    return not has_exit and proc.here and pid_alive(proc.pid, proc.start)


def _readable(value: T | Unreadable | None, name: str, unreadable: list[str]) -> T | None:
    """A reader's value, or None; an Unreadable one is named in `unreadable`."""
    if isinstance(value, Unreadable):
        unreadable.append(name)
        return None
    return value


def newest_checkpoint(run_dir: str) -> str | None:
    """checkpoints/step-*.pt with the highest step, relative to the run dir."""
    try:
        fd = open_dir(os.path.join(run_dir, CHECKPOINTS))
    except (OSError, Refused):
        return None
    try:
        names = [n for n in os.listdir(fd) if CHECKPOINT_NAME.match(n)]
    except OSError:
        return None
    finally:
        os.close(fd)
    if not names:
        return None
    newest = max(names, key=lambda n: int(n[len("step-") : -len(".pt")]))
    return f"{CHECKPOINTS}/{newest}"


def checkpoint_use(run_dir: str, config: dict[str, Any] | None) -> CheckpointUse | None:
    """How many checkpoints the run has, the newest's step and size (the file itself, not what
    a symlink there names), and how often config.json says it writes one."""
    try:
        fd = open_dir(os.path.join(run_dir, CHECKPOINTS))
    except (OSError, Refused):
        return None
    try:
        steps = sorted(s for n in os.listdir(fd) if (s := step_of(n)) is not None)
        sizes = {}
        for step in reversed(steps):  # the newest regular one: a symlink is no checkpoint
            try:
                st = os.stat(pt_name(step), dir_fd=fd, follow_symlinks=False)
            except OSError:
                continue
            if stat.S_ISREG(st.st_mode):
                sizes[step] = st.st_size
                break
    except OSError:
        return None
    finally:
        os.close(fd)
    if not sizes:
        return None
    ((newest, size),) = sizes.items()
    train = config.get("train") if config is not None else None
    every = train.get("checkpoint_every") if isinstance(train, dict) else None
    sound = isinstance(every, int) and not isinstance(every, bool) and every >= 0
    return CheckpointUse(len(steps), newest, size, every if sound else None)


def last_words(run_dir: str) -> str:
    """The last line of train.log, else launch.log, that is not a step line: what a run said
    before it ended without recording an error ("error: train.lr: expected a number")."""
    for name in (TRAIN_LOG, LAUNCH_LOG):
        text = tail_or_empty(run_dir, name, LAST_WORDS_BYTES)
        for raw in reversed(text.splitlines()):
            line = raw.strip()
            if line and parse_step_line(line) is None:
                return line
    return ""


def run_eval(hb: Heartbeat | None, config: dict[str, Any] | None) -> RunEval | None:
    """The heartbeat's eval for the runs list, with what config.json adds to its settings:
    which data the held-out samples are of (data.path), how long a prompt is at most
    (eval.prompt_len)."""
    if hb is None or hb.eval is None:
        return None
    data = config.get("data") if config is not None else None
    path = data.get("path") if isinstance(data, dict) else None
    section = config.get("eval") if config is not None else None
    prompt_len = section.get("prompt_len") if isinstance(section, dict) else None
    return RunEval.of(
        hb.eval,
        path if isinstance(path, str) else "",
        prompt_len if isinstance(prompt_len, int) and not isinstance(prompt_len, bool) else 0,
    )


@dataclasses.dataclass
class _MetricsSummary:
    inode: int
    offset: int = 0  # bytes of metrics.jsonl summarised so far (whole lines)
    best: float | None = None
    last: float | None = None
    steps: int = 0

    def add(self, raw: bytes) -> None:
        # Two fields of a row, read directly: decoding every row as a MetricsRow would make
        # the first look at a 1 GB metrics file take minutes.
        try:
            row = json.loads(raw)
        except (ValueError, RecursionError):
            return
        tok = row.get("tok_s") if isinstance(row, dict) else None
        if isinstance(tok, bool) or not isinstance(tok, int | float):
            return
        self.last = float(tok)
        self.best = self.last if self.best is None else max(self.best, self.last)
        step = row.get("step")
        if isinstance(step, int) and not isinstance(step, bool):
            self.steps = step


# A run holds the launch lock for its whole life, a liveness probe for microseconds: the
# lock held at LOCK_TRIES tries LOCK_PAUSE_S apart is a run's.
LOCK_TRIES = 3
LOCK_PAUSE_S = 0.02


def take_lock(fd: int, tries: int, pause_s: float = LOCK_PAUSE_S) -> bool:
    """flock `fd` exclusively, without blocking for long. A run holds the launch lock for
    its whole life; every agent's liveness probe (this one's, another monitor's) holds it
    for microseconds, once a second: a few tries tell the two apart, so a launch or a probe
    never mistakes a probe for a run."""
    for attempt in range(tries):
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            if attempt + 1 < tries:
                time.sleep(pause_s)
    return False


def _is_real(path: str, kind: int) -> bool:
    """`path` itself (not what a symlink there names) is a file of this kind (stat.S_IFDIR…)."""
    try:
        return stat.S_IFMT(os.lstat(path).st_mode) == kind
    except OSError:
        return False


def _is_there_not_a_file(path: str) -> bool:
    """Something other than a regular file is at `path` (a folder, a FIFO, a symlink)."""
    try:
        return not stat.S_ISREG(os.lstat(path).st_mode)
    except OSError:
        return False


class AliveProbe:
    """`RunRoot.alive_run` for the agent's loop, which must never sleep (a line waiting to go
    out waited with it: 40 ms once a second while a run held the lock, issue 32). Each
    `poll` is one try at the lock; a held lock is tried again LOCK_PAUSE_S later, by the
    loop's own timer, and taken as a run's only after LOCK_TRIES tries, as alive_run does."""

    def __init__(self, root: RunRoot) -> None:
        self.root = root
        self.held = 0  # tries in a row that found the lock held

    def poll(self) -> tuple[bool, str | None]:
        """(settled, the alive run as alive_run says it); not settled: poll again in
        LOCK_PAUSE_S."""
        if not self.root.lock_held():
            self.held = 0
            return True, None
        self.held += 1
        if self.held < LOCK_TRIES:
            return False, None
        self.held = 0
        return True, self.root.active_run() or "?"


class RunRoot:
    def __init__(self, path: str) -> None:
        self.path = path
        self._metrics: dict[str, _MetricsSummary] = {}
        self._created: dict[str, float] = {}  # read once: it never changes
        # Names under the root that look like runs but are refused (a symlink), with why:
        # never listed as runs, never followed.
        self.refused: dict[str, str] = {}
        self.checkpoints = Checkpoints()

    def run_dir(self, run_id: str) -> str:
        """The run's path (its id checked: one plain name, no `..`, no slash)."""
        if not isinstance(run_id, str) or not SAFE_ID.match(run_id):
            raise ValueError(f"bad run id {run_id!r}")
        return os.path.join(self.path, run_id)

    def checked_dir(self, run_id: str) -> str:
        """run_dir, for a command about the run: it must be there, a real folder directly
        under the run root (a symlink there is refused, whatever it names)."""
        try:
            d = self.run_dir(run_id)
        except ValueError as e:
            raise CommandError(str(e), bad_input=True) from None
        if _is_real(d, stat.S_IFDIR):
            return d
        if not os.path.lexists(d):
            raise CommandError(f"no run {run_id!r} under {self.path}", bad_input=True)
        raise Refused(f"{d} is {what_is(d)}: not a run, refused")

    def is_run(self, name: str) -> bool:
        """A real folder (not a symlink) with config.json (the trainer started) or launch.json
        (the agent launched it: a run that died before start has nothing else)."""
        d = os.path.join(self.path, name)
        return (
            bool(SAFE_ID.match(name))
            and _is_real(d, stat.S_IFDIR)
            and any(_is_real(os.path.join(d, f), stat.S_IFREG) for f in RUN_FILES)
        )

    def run_ids(self) -> list[str]:
        """Oldest first. A symlink under the root is no run: it is not listed (listing it
        would invite following it), and `refused` says why it was left out."""
        try:
            names = os.listdir(self.path)
        except FileNotFoundError:
            return []
        self.refused = {
            n: f"{what_is(os.path.join(self.path, n))}: not a run, not followed"
            for n in names
            if SAFE_ID.match(n) and os.path.islink(os.path.join(self.path, n))
        }
        return sorted((n for n in names if self.is_run(n)), key=self.created)

    def latest(self) -> str | None:
        ids = self.run_ids()
        return ids[-1] if ids else None

    def created(self, run_id: str) -> float:
        """When the run began: launch.json's launched_at for a launched run (it is there
        before config.json, so every session reads the same value), else config.json's
        run.created, else the folder's mtime."""
        if run_id not in self._created:
            self._created[run_id] = self._read_created(run_id)
        return self._created[run_id]

    def _read_created(self, run_id: str) -> float:
        d = os.path.join(self.path, run_id)
        launch = read_launch(d)
        if isinstance(launch, LaunchRecord) and launch.launched_at:
            return launch.launched_at
        config = read_config(d)
        run = config.get("run") if isinstance(config, dict) else None
        created = run.get("created") if isinstance(run, dict) else None
        if isinstance(created, int | float) and not isinstance(created, bool):
            return float(created)
        try:
            return os.stat(d).st_mtime
        except OSError:
            return 0.0

    # -- the launch lock: whether *a* run is alive; .active.json says which ----------------
    def lock_path(self) -> str:
        return os.path.join(self.path, LOCK_NAME)

    def open_lock(self, create: bool = False) -> int:
        """The launch lock's descriptor: the file itself, never what a symlink there names,
        and never a FIFO (it would block the agent). FileNotFoundError when it is not there
        (and not `create`), Refused when it is no regular file."""
        flags = os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
        flags |= os.O_RDWR | os.O_CREAT if create else os.O_RDONLY
        path = self.lock_path()
        try:
            fd = os.open(path, flags, 0o644)
        except OSError as e:
            if e.errno == errno.ELOOP:
                raise Refused(f"{path} is {what_is(path)}: refused, not followed") from None
            raise
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            raise Refused(f"{path} is {what_is(path)}, not a regular file: refused")
        return fd

    def alive_run(self) -> str | None:
        """The run holding the launch lock ("?" when .active.json does not say), or None (also
        when the lock is no regular file: refused, so it says nothing). Sleeps between its
        tries: for a command's thread; the agent's loop asks an `AliveProbe`."""
        for attempt in range(LOCK_TRIES):
            if not self.lock_held():
                return None
            if attempt + 1 < LOCK_TRIES:
                time.sleep(LOCK_PAUSE_S)
        return self.active_run() or "?"

    def lock_held(self) -> bool:
        """One try at the launch lock, never waiting: False when it was free (or is not
        there, or refused), True when something held it just now (a run, or a probe)."""
        try:
            fd = self.open_lock()
        except (OSError, Refused):
            return False
        try:
            if not take_lock(fd, tries=1):
                return True
            fcntl.flock(fd, fcntl.LOCK_UN)
            return False
        finally:
            os.close(fd)

    def active_run(self) -> str | None:
        """The run .active.json names (the last one launched)."""
        raw = read_bounded(os.path.join(self.path, ACTIVE_NAME), 65536)
        if not isinstance(raw, bytes):
            return None
        try:
            data = json.loads(raw)
        except (ValueError, RecursionError):
            return None
        run_id = data.get("run_id") if isinstance(data, dict) else None
        return run_id if isinstance(run_id, str) and run_id else None

    def set_active(self, run_id: str, wrapper_pid: int) -> None:
        write_json_atomic(
            os.path.join(self.path, ACTIVE_NAME), {"run_id": run_id, "wrapper_pid": wrapper_pid}
        )

    # -- one run ---------------------------------------------------------------------------
    def liveness(
        self, run_id: str, alive_run: str | None
    ) -> tuple[bool, Process, ExitRecord | None]:
        """(alive, its process, its exit record) for the liveness event."""
        d = self.run_dir(run_id)
        exit_read = read_exit(d)
        proc = read_process(d)
        alive = is_alive(run_id, alive_run, exit_read is not None, proc)
        return alive, proc, exit_read if isinstance(exit_read, ExitRecord) else None

    def info(self, run_id: str, alive_run: str | None) -> RunInfo:
        d = self.run_dir(run_id)
        unreadable: list[str] = []
        config = _readable(read_config(d), CONFIG, unreadable)
        launch = _readable(read_launch(d), LAUNCH, unreadable)
        hb = _readable(read_heartbeat(os.path.join(d, HEARTBEAT)), HEARTBEAT, unreadable)
        exit_read = read_exit(d)
        exit_record = _readable(exit_read, EXIT, unreadable)
        alive = is_alive(run_id, alive_run, exit_read is not None, process_of(launch, hb))
        checkpoint = newest_checkpoint(d)
        resume = self.resume_point(run_id, d)
        outcome = outcome_of(alive, hb, exit_record, checkpoint, resume=resume)
        recorded_error = (hb is not None and hb.error is not None) or bool(
            exit_record and exit_record.error
        )
        if outcome.kind in (DIED, CRASH) and not recorded_error:
            # Only these summaries quote the logs: read them only for these runs.
            outcome = outcome_of(alive, hb, exit_record, checkpoint, last_words(d), resume)
        best, last, steps = self._metrics_summary(run_id, d)
        for fname in (METRICS, TRAIN_LOG):  # followed, not decoded: refused if not a file
            if _is_there_not_a_file(os.path.join(d, fname)):
                unreadable.append(fname)
        name = config.get("name") if config is not None else None
        return RunInfo(
            run_id=run_id,
            created=self.created(run_id),
            name=name if isinstance(name, str) else launch.name if launch else None,
            phase=hb.phase if hb else None,
            step=hb.step if hb else None,
            alive=alive,
            exit=exit_record,
            outcome=outcome,
            best_tok_s=best,
            last_tok_s=last,
            steps=steps,
            error=hb.error.message if hb and hb.error else None,
            phases=phase_durations(hb.phase_history, hb.now, final=hb.final) if hb else {},
            target_load_s=hb.target_load_s() if hb else None,
            role_memory=hb.role_peaks() if hb else {},
            signature=signature_of(config, hb.devices if hb else None) if config else None,
            schema=hb.schema if hb else None,
            unreadable=unreadable,
            environment=read_environment(config),
            preflight=read_preflight(config),
            resume=resume,
            eval=run_eval(hb, config),
            checkpoints=checkpoint_use(d, config),
        )

    def resume_point(self, run_id: str, run_dir: str) -> ResumePoint:
        """Where a restart of `run_id` (in `run_dir`, as the caller has it) continues: its
        newest good checkpoint. A run with none of its own that was itself resumed
        (launch.json's `resumed_from`) continues from its parent's, and so on back: a resumed
        run SIGKILLed before its first checkpoint does not send the next restart back to step
        0. Once a parent is used, every skipped name is prefixed with its run id."""
        skipped: list[tuple[str, str, str]] = []  # (run id, name, why)
        current, current_dir, seen = run_id, run_dir, {run_id}
        point = ResumePoint(run_id)
        for _ in range(MAX_LINEAGE):
            choice = self.checkpoints.choice(current_dir)
            skipped += [(current, n, why) for n, why in choice.skipped]
            if choice.name is not None:
                point = ResumePoint(current, choice.name, choice.step, choice.verified)
                break
            parent = self._parent(current_dir)
            if parent is None or parent in seen:
                break
            skipped.append((current, "", "no good checkpoint of its own: its parent's"))
            current, current_dir = parent, self.run_dir(parent)
            seen.add(parent)
        lineage = current != run_id
        point.skipped = [
            Skipped(f"{r}/{n}".rstrip("/") if lineage else n, why) for r, n, why in skipped
        ]
        return point

    def _parent(self, run_dir: str) -> str | None:
        """The run the run in `run_dir` resumed from, when it is a run under this root."""
        launch = read_launch(run_dir)
        parent = launch.resumed_from if isinstance(launch, LaunchRecord) else None
        return parent if parent and self.is_run(parent) else None

    def _metrics_summary(self, run_id: str, run_dir: str) -> tuple[float | None, float | None, int]:
        """Best/last tok/s and the last step, read incrementally: a 1 GB metrics file is
        scanned once, in bounded chunks, and then only what was appended."""
        try:
            fd = open_in(run_dir, METRICS)
        except (OSError, Refused):
            return None, None, 0
        with os.fdopen(fd, "rb") as f:
            st = os.fstat(fd)
            s = self._metrics.get(run_id)
            if s is None or s.inode != st.st_ino or st.st_size < s.offset:
                s = self._metrics[run_id] = _MetricsSummary(st.st_ino)
            if st.st_size > s.offset:
                f.seek(s.offset)
                while s.offset < st.st_size:
                    data = f.read(min(METRICS_CHUNK, st.st_size - s.offset))
                    end = data.rfind(b"\n") + 1
                    if end == 0:
                        if len(data) < METRICS_CHUNK:
                            break  # a line still being written
                        end = len(data)  # a "line" longer than a chunk is no row: skip it
                    for raw in data[:end].splitlines():
                        s.add(raw)
                    s.offset += end
                    f.seek(s.offset)
        return s.best, s.last, s.steps

    def new_run_dir(self, name: str) -> tuple[str, str]:
        os.makedirs(self.path, exist_ok=True)
        for _ in range(100):
            run_id = new_run_id(name)  # the contract's rule: a group's monitor names it too
            d = os.path.join(self.path, run_id)
            try:
                os.mkdir(d)
            except FileExistsError:
                continue
            return run_id, d
        raise RuntimeError(f"could not create a fresh run dir under {self.path}")

    def named_run_dir(self, run_id: str) -> str:
        """A fresh run dir of this exact id (one host's part of a job over several hosts:
        the monitor chose the id for all of them); refused if it is there already, never
        reused: its files would mix two launches."""
        d = self.run_dir(run_id)  # the id checked: one plain name
        os.makedirs(self.path, exist_ok=True)
        try:
            os.mkdir(d)
        except FileExistsError:
            raise CommandError(f"run dir {d} exists already: not reused") from None
        return d

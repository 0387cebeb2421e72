"""wrap: the detached parent of one trainer run, and exit.json's writer.

The agent starts `python dflash_agent.py wrap --run-dir D --lock-fd N -- python -m trainer …`
in a session of its own, so the run survives the agent and the SSH connection. The wrapper
starts the trainer in its own process group (a kill signals the group), records the
trainer's pid and start time in launch.json, waits, and writes exit.json. Its own stdout is
launch.log; the trainer's stdout and stderr go to train.log. It outlives the trainer, so it
is where a SIGKILL's sender is looked for (oom.py): the memory cgroup found at the start,
read again right after the death, and the kernel log.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import signal
import subprocess
import time
from typing import Any

from dflash_tui.agent import oom
from dflash_tui.agent.failed_rank import failed_rank_of
from dflash_tui.agent.procs import proc_start
from trainer.contract.heartbeat import Heartbeat, read_heartbeat
from trainer.contract.records import (
    HEARTBEAT,
    LAUNCH,
    MAX_RECORD_BYTES,
    TRAIN_LOG,
    ExitRecord,
    OomCheck,
    write_exit,
    write_json_atomic,
)
from trainer.contract.typed import read_bounded

EXIT_COULD_NOT_START = 127  # the shell's "command not found", and outcomes.py's


def record_exit(
    run_dir: str,
    exit_code: int | None,
    signal_name: str | None = None,
    error: str | None = None,
    started_at: float | None = None,
    oom_check: OomCheck | None = None,
) -> ExitRecord:
    """exit.json, through the contract's one writer, with what the last heartbeat knew."""
    hb = read_heartbeat(os.path.join(run_dir, HEARTBEAT))
    hb = hb if isinstance(hb, Heartbeat) else None
    record = ExitRecord(
        run_id=os.path.basename(run_dir),
        exit_code=exit_code,
        signal=signal_name,
        error=error or (hb.error.message if hb and hb.error else None),
        started_at=started_at,
        ended_at=time.time(),
        final_phase=hb.phase if hb else None,
        step=hb.step if hb else None,
        total_steps=(hb.total_steps or None) if hb else None,
        checkpoint=hb.last_checkpoint.path if hb and hb.last_checkpoint else None,
        oom=oom_check,
        failed_rank=failed_rank_of(run_dir, hb),
    )
    write_exit(run_dir, record)
    return record


def update_launch(run_dir: str, **fields: Any) -> None:
    """Add the started trainer's facts to launch.json. Keys this wrapper does not know stay:
    the agent that wrote the file may be newer than this deployed copy."""
    path = os.path.join(run_dir, LAUNCH)
    # Bounded, a regular file only: a FIFO planted there would block the wrapper for good.
    raw = read_bounded(path, MAX_RECORD_BYTES)
    try:
        data = json.loads(raw) if isinstance(raw, bytes) else None
    except (ValueError, RecursionError):
        data = None
    if not isinstance(data, dict):
        data = {"run_id": os.path.basename(run_dir)}
    data.update(fields)
    try:
        write_json_atomic(path, data)
    except OSError as e:  # a folder planted there: said, and the trainer still waited for
        print(f"could not record the trainer in {path}: {e.strerror or e}", flush=True)


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def wrap(args: argparse.Namespace) -> int:
    run_dir = args.run_dir
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        # A handler, not SIG_IGN: an ignored signal would stay ignored in the trainer.
        signal.signal(sig, lambda *_: None)
    argv = args.argv[1:] if args.argv and args.argv[0] == "--" else args.argv
    print(f"{time.strftime('%H:%M:%S')} wrapper pid {os.getpid()}: {shlex.join(argv)}", flush=True)
    started = time.time()
    try:
        with open(os.path.join(run_dir, TRAIN_LOG), "ab") as log:
            child = subprocess.Popen(
                argv,
                cwd=args.cwd,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                pass_fds=(args.lock_fd,) if args.lock_fd >= 0 else (),
            )
    except OSError as e:
        print(f"could not start the trainer: {e}", flush=True)
        record_exit(
            run_dir,
            EXIT_COULD_NOT_START,
            error=f"could not start {argv[0]}: {e}",
            started_at=started,
        )
        return EXIT_COULD_NOT_START
    if args.lock_fd >= 0:
        os.close(args.lock_fd)  # the trainer holds the lock too, for as long as it lives
    update_launch(
        run_dir,
        pid=child.pid,
        pgid=child.pid,
        wrapper_pid=os.getpid(),
        started_at=started,
        proc_start=proc_start(child.pid),
    )
    memory = oom.watch(child.pid)  # its cgroup is readable only while it lives
    code = child.wait()
    record = record_exit(
        run_dir,
        code if code >= 0 else None,
        _signal_name(-code) if code < 0 else None,
        started_at=started,
        oom_check=oom.check(memory, child.pid) if code == -signal.SIGKILL else None,
    )
    print(f"{time.strftime('%H:%M:%S')} trainer exited: {record.describe()}", flush=True)
    return 0

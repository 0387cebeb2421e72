"""A live process that writes a hostile run dir: a heartbeat whose strings (error, thread
names, states and roles, stage names, a GPU name) are the text in argv[2], refreshed every
0.5 s,
and the trainer's own SIGUSR1 stack dump (trainer/runtime/signals.py) with a thread of that name.

    python tests/infra/hostile_trainer.py RUN_DIR TEXT_FILE HEARTBEAT_SEED

The stand-in is only the training loop (a test cannot make the real trainer name a thread
`\\x1b]0;…`); the files it writes, the signal handling, the dump and the launch lock it
holds (trainer/runtime/launch_lock.py) are the real trainer's, read by the real agent.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import threading
import time
from pathlib import Path

from trainer.runtime import launch_lock
from trainer.runtime.signals import SignalHandlers


def proc_start() -> int:
    """/proc/self/stat field 22 (the agent's liveness check compares it)."""
    stat = Path("/proc/self/stat").read_text()
    return int(stat.rsplit(")", 1)[1].split()[19])


def main() -> None:
    run_dir, text = Path(sys.argv[1]), Path(sys.argv[2]).read_text()
    launch_lock.hold(run_dir.parent)  # as `python -m trainer` started by hand does
    hb = json.loads(Path(sys.argv[3]).read_text())
    stop = threading.Event()
    worker = threading.Thread(target=stop.wait, name=f"drafter-0 {text}", daemon=True)
    worker.start()
    handlers = SignalHandlers(run_dir, lambda _signal: stop.set(), lambda: {worker.ident: text})
    handlers.install()
    started = time.time()
    hb.update(
        run_id=run_dir.name,
        pid=os.getpid(),
        pgid=os.getpgid(0),
        proc_start=proc_start(),
        host=socket.gethostname(),
        phase="training",
        phase_history=[],
        phase_progress=None,
        started_at=started,
        phase_started_at=started,
        last_step_at=started - 3600,  # a stalled loop: a finding names the stuck thread
        exit_code=None,
        error={"thread": f"drafter-0 {text}", "message": text, "traceback": text},
        devices={"cuda:0": {"name": f"NVIDIA {text}", "uuid": "GPU-0"}},
        threads=[
            {
                "name": f"drafter-0 {text}",
                "role": "drafter",
                "device": "cuda:0",
                "state": f"forward {text}",
                "since": started - 3600,
                "cpu_pct": 0.0,
            },
            {  # a thread that loops, its stages named by the host too
                "name": f"target-0 {text}",
                "role": "target",
                "device": "cuda:0",
                "state": "forward",
                "since": started,
                "cpu_pct": 0.0,
                "stages_ms": {f"forward {text}": 200.0, "wait q_hs": 50.0},
            },
        ],
    )
    tmp = run_dir / ".heartbeat.json.tmp"
    while not stop.is_set():
        hb["now"] = time.time()
        hb["threads"][1]["since"] = hb["now"] - 0.1  # it keeps looping
        tmp.write_text(json.dumps(hb))
        os.replace(tmp, run_dir / "heartbeat.json")
        stop.wait(0.5)


if __name__ == "__main__":
    main()

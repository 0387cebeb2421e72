"""Processes mode's launcher: torchrun, with a requested stop ending as the ranks ended.

`python -m trainer --config X` with `runtime.mode = "processes"` execs this (trainer/__main__.py
`exec_torchrun`), so `dflash-tui launch` starts a job as it starts any run. torchrun alone turns
a SIGTERM into a SignalException traceback and exit 1 after its ranks have stopped at one step
and checkpointed, and the run would read as crashed. Here the stop ends with the writer rank's
verdict: exit 0 when the job's heartbeat says it stopped, else 128 + the signal. Any other
failure is torchrun's own (a failed rank: ChildFailedError, exit 1, named in the run dir).

    python -m trainer.distributed.torchrun_job [torchrun's arguments] \
        -m trainer [trainer's arguments]
"""

from __future__ import annotations

import signal
import sys
from pathlib import Path

from trainer.contract.heartbeat import Heartbeat, read_heartbeat
from trainer.contract.phases import STOPPED
from trainer.contract.records import HEARTBEAT


def run_dir_of(argv: list[str]) -> Path | None:
    """The trainer's `--run-dir` in the job's command line (the agent always passes one)."""
    for i, arg in enumerate(argv):
        if arg == "--run-dir" and i + 1 < len(argv):
            return Path(argv[i + 1])
        if arg.startswith("--run-dir="):
            return Path(arg.split("=", 1)[1])
    return None


def stopped_cleanly(run_dir: Path | None) -> bool:
    if run_dir is None:
        return False
    hb = read_heartbeat(run_dir / HEARTBEAT)
    return isinstance(hb, Heartbeat) and hb.phase == STOPPED and hb.exit_code == 0


def main(argv: list[str]) -> int:
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.run import main as torchrun_main

    from trainer.distributed.signals import install_forwarding

    install_forwarding()  # a stack-dump signal reaches every rank, never ends the launcher
    try:
        torchrun_main(argv)
    except SignalException as e:  # the agent has stopped every rank by now (its _shutdown)
        name = signal.Signals(e.sigval).name
        if stopped_cleanly(run_dir_of(argv)):
            print(f"torchrun: {name}: every rank stopped at the same step", flush=True)
            return 0
        print(f"torchrun: {name}: the job did not stop cleanly (see its heartbeat)", flush=True)
        return 128 + int(e.sigval)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

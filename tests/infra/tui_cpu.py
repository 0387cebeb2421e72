"""The TUI's own CPU use, measured as an operator runs it: `dflash-tui local` in a real
tmux pane at 160x48, following a run dir this module writes, sampled from /proc/PID/stat.

Used by bench/monitor_bench.py (the figures in bench/README.md) and by
tests/monitor/test_idle_cost.py (the bound). Only the TUI's process is counted: the agent
it starts is a process of its own, measured by the bench's `agent_cpu`.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
HEARTBEAT = ROOT / "tests" / "fixtures" / "heartbeats" / "training-cpu.json"
STEP = (
    "[0m] step={i} loss={loss:.4f} acc=0.100 streak=1.0 lr=1.00e-04 noise=0.0000 | "
    "tgt=1.00b/s dft=1.00b/s (1.0Ktok/s) | q_pre=[1] q_hs=[1] | epoch~0.00 ETA=1s"
)
RUN_ID = "20260101-000000-bench-0000"


@dataclass
class TuiCpu:
    idle_pct: float  # % of one core, nothing arriving
    idle_bytes_per_s: float  # what it wrote to the terminal meanwhile (tmux pipe-pane)
    busy_pct: float | None  # % of one core while step lines and metrics rows arrive
    lines_per_s: float
    idle_s: float
    busy_s: float


def write_run(remote: Path) -> Path:
    """A run dir as a trainer leaves it after 50 steps: config, a heartbeat (recorded from
    a real CPU run), step lines and metrics rows."""
    d = remote / "runs" / RUN_ID
    d.mkdir(parents=True)
    (d / "config.json").write_text(json.dumps({"name": "bench", "run": {"created": time.time()}}))
    hb = json.loads(HEARTBEAT.read_text())
    hb["run_id"] = RUN_ID
    (d / "heartbeat.json").write_text(json.dumps(hb))
    with open(d / "train.log", "w") as log, open(d / "metrics.jsonl", "w") as metrics:
        for i in range(50):
            append_step(log, metrics, i)
    return d


def append_step(log, metrics, i: int) -> None:
    loss = 2.0 + 8.0 / (1 + i)
    log.write(STEP.format(i=i, loss=loss) + "\n")
    metrics.write(
        json.dumps(
            {
                "step": i,
                "loss": loss,
                "acc": 0.1,
                "streak": 1.0,
                "tok_s": 1000.0,
                "time": time.time(),
            }
        )
        + "\n"
    )
    log.flush()
    metrics.flush()


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def tmux(*args: str) -> str:
    return subprocess.run(["tmux", *args], capture_output=True, text=True, check=True).stdout


def measure(
    workdir: Path,
    idle_s: float = 20.0,
    busy_s: float = 20.0,
    lines_per_s: float = 10.0,
    settle_s: float = 5.0,
    finished: Path | None = None,
    code: Path = ROOT,
) -> TuiCpu:
    """Start the TUI in tmux against a fresh run dir under `workdir`, wait until it shows
    the run, let it settle, then sample its CPU over `idle_s` with nothing arriving and
    over `busy_s` (0: skip) with a step line and a metrics row `lines_per_s` times a
    second. The tmux session is always killed.

    finished: a finished run's dir (the bench trains one), copied in place of the written
    one; no busy phase then: nothing more arrives.
    code: the checkout whose `dflash_tui` runs (the bench compares against main's).
    What the pane received while idle is kept in `workdir/pane-output`."""
    if shutil.which("tmux") is None:
        raise RuntimeError("tmux not installed")
    remote = workdir / "remote"
    if finished is not None:
        run_dir = remote / "runs" / finished.name
        shutil.copytree(finished, run_dir)
        steps = json.loads((finished / "exit.json").read_text())["step"]
        run_id, shown = finished.name, f"step {steps}"  # the header: the log may end in wandb
        busy_s = 0.0
    else:
        run_dir = write_run(remote)
        run_id, shown = RUN_ID, "step=49"
    env = {
        "XDG_CONFIG_HOME": str(workdir / "config"),
        "XDG_STATE_HOME": str(workdir / "state"),
        "TERM": "xterm-256color",
        "PYTHONPATH": str(code),
    }
    exports = " ".join(f"{k}={shlex.quote(v)}" for k, v in env.items())
    py = shlex.quote(sys.executable)
    # exec: the pane's pid is the TUI's. The sleep: a fresh tmux server sizes its pane
    # 80x24 for a moment first.
    cmd = (
        f"sleep 1; cd {shlex.quote(str(code))} && exec env {exports} {py} -m dflash_tui local"
        f" --remote-dir {shlex.quote(str(remote))} --python {py}"
    )
    session = f"dflash-tui-cpu-{os.getpid()}"
    tmux("new-session", "-d", "-s", session, "-x", "160", "-y", "48", cmd)
    try:
        deadline = time.monotonic() + 60
        screen = ""
        while time.monotonic() < deadline:
            screen = tmux("capture-pane", "-t", session, "-p")
            if run_id in screen and shown in screen:
                break
            time.sleep(0.5)
        else:
            raise RuntimeError(f"the TUI did not show the run in 60 s:\n{screen}")
        pid = int(tmux("display-message", "-p", "-t", session, "#{pane_pid}").strip())
        written = workdir / "pane-output"
        tmux("pipe-pane", "-t", session, f"cat > {shlex.quote(str(written))}")
        time.sleep(settle_s)
        b0 = written.stat().st_size if written.exists() else 0
        c0, t0 = cpu_seconds(pid), time.monotonic()
        time.sleep(idle_s)
        elapsed = time.monotonic() - t0
        idle = (cpu_seconds(pid) - c0) / elapsed * 100
        idle_bytes = ((written.stat().st_size if written.exists() else 0) - b0) / elapsed
        tmux("pipe-pane", "-t", session)  # stop: the file holds the settle and idle output
        busy = None
        if busy_s > 0:
            stop = threading.Event()

            def writer() -> None:
                with (
                    open(run_dir / "train.log", "a") as log,
                    open(run_dir / "metrics.jsonl", "a") as metrics,
                ):
                    i = 50
                    while not stop.is_set():
                        append_step(log, metrics, i)
                        i += 1
                        stop.wait(1.0 / lines_per_s)

            thread = threading.Thread(target=writer, daemon=True)
            c0, t0 = cpu_seconds(pid), time.monotonic()
            thread.start()
            time.sleep(busy_s)
            busy = (cpu_seconds(pid) - c0) / (time.monotonic() - t0) * 100
            stop.set()
            thread.join(5)
        return TuiCpu(idle, idle_bytes, busy, lines_per_s, idle_s, busy_s)
    finally:
        subprocess.run(["tmux", "kill-session", "-t", session], capture_output=True)

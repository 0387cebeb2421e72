"""Monitor benchmarks: line latency over loopback SSH, agent CPU, opening a 1 GB log, the
TUI's own CPU idle and busy.

    .venv/bin/python bench/monitor_bench.py [--lines 500] [--out bench/results-monitor.json]
    .venv/bin/python bench/monitor_bench.py --only tui   # the TUI rows alone (needs tmux)

Needs /usr/sbin/sshd (Debian openssh-server). Starts its own sshd on 127.0.0.1 with fresh
keys (the test fixture's SshServer), a fake run dir, and `dflash-tui --headless` against it.
Prints a table last; compare the rows of one run as ratios, these machines are noisy.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from infra.fixtures import FakeGpu  # noqa: E402
from infra.sshd import SshServer  # noqa: E402
from infra.tui_cpu import measure as tui_cpu  # noqa: E402

TUI_RATE = 10.0  # step lines (and metrics rows) a second while busy: a fast small run

STEP = (
    "[0m] step={i} loss=1.0000 acc=0.100 streak=1.0 lr=1.00e-04 noise=0.0000 | tgt=1.00b/s "
    "dft=1.00b/s (1.0Ktok/s) | q_pre=[1] q_hs=[1] | epoch~0.00 ETA=1s"
)


def pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


def fake_run(root: Path) -> Path:
    d = root / "runs" / "20260101-000000-bench-0000"
    d.mkdir(parents=True)
    (d / "config.json").write_text(json.dumps({"name": "bench", "run": {"created": time.time()}}))
    (d / "train.log").write_text("")
    return d


def headless_latency(server: SshServer, remote: Path, run_dir: Path, n: int) -> list[float]:
    """ms from appending a step line to reading it on `dflash-tui --headless` stdout."""
    env = {**os.environ, "HOME": str(remote.parent / "home"), "NO_COLOR": "1"}
    home_ssh = remote.parent / "home" / ".ssh"
    home_ssh.mkdir(parents=True, exist_ok=True)
    (home_ssh / "config").write_text(server.ssh_config.read_text())
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "dflash_tui",
            "gpu-box",
            "--remote-dir",
            str(remote),
            "--python",
            sys.executable,
            "--headless",
            "--interval",
            "3600",
        ],
        stdout=subprocess.PIPE,
        text=True,
        cwd=ROOT,
        env=env,
        bufsize=1,
    )
    sent: dict[int, float] = {}
    got: dict[int, float] = {}
    done = threading.Event()

    def reader() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            t = time.perf_counter()
            if " step=" in line:
                i = int(line.split(" step=")[1].split()[0])
                got[i] = t
                if len(got) >= n:
                    done.set()
                    return

    threading.Thread(target=reader, daemon=True).start()
    time.sleep(3.0)  # connected and following
    with open(run_dir / "train.log", "a", buffering=1) as f:
        for i in range(n):
            sent[i] = time.perf_counter()
            f.write(STEP.format(i=i) + "\n")
            f.flush()
            time.sleep(0.02)
    done.wait(30)
    proc.terminate()
    proc.wait(10)
    return [(got[i] - sent[i]) * 1e3 for i in range(n) if i in got]


def ssh_per_check(server: SshServer, run_dir: Path, n: int = 10) -> list[float]:
    """ms for one fresh `ssh host tail -n1 train.log`, the way operators poll today."""
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        subprocess.run(
            server.ssh_argv("tail", "-n1", str(run_dir / "train.log")),
            capture_output=True,
            check=True,
        )
        out.append((time.perf_counter() - t0) * 1e3)
    return out


def agent_cpu(server: SshServer, remote: Path, seconds: float = 30.0) -> float:
    """% of one core the agent uses following an idle run at the default 1 Hz."""
    sys.path.insert(0, str(ROOT / "tests" / "monitor"))
    from monitor_helpers import Remote

    from dflash_tui.targets import Target

    t = Target(
        name="gpu-box",
        kind="ssh",
        host="127.0.0.1",
        port=server.port,
        user=server.user,
        identity=str(server.client_key),
        known_hosts=str(server.known_hosts),
        remote_dir=str(remote),
        python=sys.executable,
    )
    r = Remote(t)
    r.wait(lambda s: s.hello is not None and s.follow_received, 30, "agent up")
    r.wait(lambda s: s.gpu and len(s.gpu.get("devices") or []) == 8, 30, "NVML samples")
    pid = r.store.hello["pid"]
    ticks = os.sysconf("SC_CLK_TCK")

    def cpu() -> float:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / ticks

    time.sleep(2.0)
    c0, t0 = cpu(), time.monotonic()
    time.sleep(seconds)
    used = (cpu() - c0) / (time.monotonic() - t0) * 100
    r.close()
    return used


def open_big_log(remote: Path) -> float:
    """s from asking to follow a run with a 1 GB train.log to its last line arriving."""
    sys.path.insert(0, str(ROOT / "tests" / "monitor"))
    from monitor_helpers import Remote

    from dflash_tui.targets import Target

    d = remote / "runs" / "20260102-000000-big-0000"
    d.mkdir(parents=True)
    (d / "config.json").write_text(json.dumps({"name": "big", "run": {"created": time.time()}}))
    line = (STEP.format(i=1) + "\n").encode()
    with open(d / "train.log", "wb") as f:
        while f.tell() < (1 << 30):
            f.write(line * 8192)
    size = (d / "train.log").stat().st_size
    r = Remote(
        Target(name="local", kind="local", remote_dir=str(remote), python=sys.executable),
        follow=None,
    )
    r.wait(lambda s: s.hello is not None, 30, "agent up")
    t0 = time.perf_counter()
    r.request({"cmd": "follow", "run_id": d.name})
    r.wait(lambda s: any(e.get("end") == size for e in r.lines()), 30, "the last line")
    elapsed = time.perf_counter() - t0
    r.close()
    (d / "train.log").unlink()
    return elapsed


def tui_rows(tmp: Path) -> dict[str, float]:
    """The TUI in tmux (160x48) following a local run dir: 20 s with nothing arriving, then
    20 s with TUI_RATE step lines and metrics rows a second."""
    cpu = tui_cpu(tmp / "tui", idle_s=20.0, busy_s=20.0, lines_per_s=TUI_RATE)
    return {
        "tui_idle_cpu_pct": round(cpu.idle_pct, 2),
        "tui_idle_bytes_per_s": round(cpu.idle_bytes_per_s),
        "tui_busy_cpu_pct": round(cpu.busy_pct or 0.0, 2),
        "tui_busy_lines_per_s": TUI_RATE,
    }


def print_tui(results: dict) -> None:
    print(
        f"| TUI idle (nothing arriving), 160x48 in tmux | {results['tui_idle_cpu_pct']} % of "
        f"a core, {results['tui_idle_bytes_per_s']} B/s to the terminal | <= 2 % |"
    )
    print(
        f"| TUI busy ({results['tui_busy_lines_per_s']:.0f} step lines + metrics rows/s) | "
        f"{results['tui_busy_cpu_pct']} % of a core | — |"
    )


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--lines", type=int, default=500)
    p.add_argument("--out", type=Path, default=ROOT / "bench" / "results-monitor.json")
    p.add_argument("--only", choices=("all", "tui"), default="all")
    args = p.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="dflash-bench-"))
    stamp = {
        "date": time.strftime("%Y-%m-%d"),
        "machine": f"{os.cpu_count()} cores, {os.uname().machine}, Python {sys.version.split()[0]}",
    }
    if args.only == "tui":  # the other rows stay as the last full run wrote them
        results = json.loads(args.out.read_text()) if args.out.exists() else {}
        results.update(tui_rows(tmp))
        results["tui_date"] = stamp["date"]
        args.out.write_text(json.dumps(results, indent=1) + "\n")
        print("| what | figure | target |")
        print("|---|---|---|")
        print_tui(results)
        return 0
    remote = tmp / "remote"
    run_dir = fake_run(remote)
    # 8 fake H200s behind NVML's interface: the agent samples them at 1 Hz as on the box.
    gpu = FakeGpu(tmp / "fake-nvml.json", devices=8)
    with SshServer(gpu.env) as server:
        lat = headless_latency(server, remote, run_dir, args.lines)
        fresh = ssh_per_check(server, run_dir)
        cpu = agent_cpu(server, remote)
    big = open_big_log(remote)
    results = {
        "line_latency_ms_p50": round(statistics.median(lat), 2),
        "line_latency_ms_p99": round(pct(lat, 0.99), 2),
        "line_latency_lines": len(lat),
        "fresh_ssh_per_check_ms_p50": round(statistics.median(fresh), 1),
        "agent_cpu_pct_at_1hz": round(cpu, 2),
        "open_1gb_log_s": round(big, 3),
        **tui_rows(tmp),
        **stamp,
    }
    args.out.write_text(json.dumps(results, indent=1) + "\n")
    print("| what | figure | target |")
    print("|---|---|---|")
    print(
        f"| line appended -> headless output, loopback SSH, p50 | "
        f"{results['line_latency_ms_p50']} ms | <= 20 ms |"
    )
    print(f"| same, p99 ({len(lat)} lines) | {results['line_latency_ms_p99']} ms | <= 100 ms |")
    print(
        f"| a fresh `ssh host tail -n1` per check, p50 | "
        f"{results['fresh_ssh_per_check_ms_p50']} ms | (what operators do today) |"
    )
    print(
        f"| agent CPU following a run, 8 GPUs sampled at 1 Hz (fake NVML) | "
        f"{results['agent_cpu_pct_at_1hz']} % of a core | <= 1 % |"
    )
    print(
        f"| opening a 1 GB train.log (follow -> last line) | {results['open_1gb_log_s']} s | "
        "< 1 s |"
    )
    print_tui(results)
    return 0


if __name__ == "__main__":
    sys.exit(main())

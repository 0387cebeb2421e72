"""The agent alone: ms from a step line appended to train.log to its `line` event on the
agent's stdout, while a tiny-cpu run trains on the same host and the agent samples 8 fake
GPUs (fake NVML), the host and the run's processes. Its samplers in a process of their own
(agent/sampler_process.py, the default) against the same samplers as threads of the agent
(`--sampler-threads`, as before issue 32's fix), interleaved, each first in turn, so both
meet the same load. No sshd, no headless: what the agent adds to issue 32's line latency
(bench/monitor_bench.py --only cost measures the whole chain). The measured agent's
--remote-dir is not the deployed one: a release's vendored pynvml would come first on its
path and find no NVML library, and then it samples no GPU (as monitor_bench's host does).

    .venv/bin/python bench/agent_latency.py [--runs 3] [--lines 100] [--out FILE]
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
sys.path[:0] = [str(ROOT), str(ROOT / "tests"), str(ROOT / "bench")]

from infra.fixtures import FakeGpu  # noqa: E402
from monitor_bench import STEP, launch_tiny, load_average, pct  # noqa: E402

MODES = {"process": [], "threads": ["--sampler-threads"]}
SETTLE_S = 3.0  # after the follow: the first samples and the log's tail are out


def one_run(agent: Path, env: dict[str, str], remote: Path, run_dir: Path, mode: str,
            first: int, n: int, every_s: float) -> dict:  # fmt: skip
    proc = subprocess.Popen(
        [
            sys.executable,
            "-u",
            str(agent),
            "--remote-dir",
            str(remote.parent / "agent-home"),  # not the deployed one: see the docstring
            "--run-root",
            str(remote / "runs"),
            *MODES[mode],
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        env=env,
    )
    assert proc.stdin is not None and proc.stdout is not None
    got: dict[int, float] = {}
    kinds: dict[str, int] = {}
    done = threading.Event()

    def reader() -> None:
        assert proc.stdout is not None
        for raw in proc.stdout:
            t = time.perf_counter()
            event = json.loads(raw)
            kind = event.get("type", "?")
            kinds[kind] = kinds.get(kind, 0) + 1
            text = event.get("text", "") if kind == "line" else ""
            if " step=" in text:
                i = int(text.split(" step=")[1].split()[0])
                if i >= first:
                    got[i] = t
                    if len(got) >= n:
                        done.set()

    threading.Thread(target=reader, daemon=True).start()
    proc.stdin.write(b'{"cmd":"follow","id":1,"run_id":"%s"}\n' % run_dir.name.encode())
    proc.stdin.flush()
    time.sleep(SETTLE_S)
    sent: dict[int, float] = {}
    load = load_average()
    with open(run_dir / "train.log", "a", buffering=1) as f:
        for i in range(first, first + n):
            sent[i] = time.perf_counter()
            f.write(STEP.format(i=i) + "\n")
            f.flush()
            time.sleep(every_s)
    done.wait(10)
    proc.stdin.close()
    proc.wait(10)
    lat = [(got[i] - sent[i]) * 1e3 for i in sent if i in got]
    return {
        "mode": mode,
        "p50_ms": round(statistics.median(lat), 2),
        "p99_ms": round(pct(lat, 0.99), 2),
        "max_ms": round(max(lat), 2),
        "over_5ms": sum(1 for x in lat if x > 5.0),
        "lines": len(lat),
        "of": n,
        "events": kinds,
        "load_average": load,
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--lines", type=int, default=100)
    p.add_argument("--out", type=Path, default=ROOT / "bench" / "results-agent-latency.json")
    args = p.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="agent-latency-"))
    os.environ["DFLASH_CACHE_DIR"] = str(tmp / "cache")
    gpu = FakeGpu(tmp / "fake-nvml.json", devices=8)
    env = {**os.environ, **gpu.env}
    from dflash_tui.link.transport import agent_source
    from dflash_tui.targets import Target

    agent = tmp / "agent.py"
    agent.write_bytes(agent_source())
    remote = tmp / "remote"
    target = Target(name="local", kind="local", remote_dir=str(remote), python=sys.executable)
    run_dir = launch_tiny(target, max_steps=1_000_000)
    out: dict = {"runs": [], "date": time.strftime("%Y-%m-%d"), "cpus": os.cpu_count()}
    try:
        time.sleep(10)  # past the run's first steps (each bucket compiles)
        step = 10_000_000
        for k in range(args.runs):
            order = list(MODES)[:: 1 if k % 2 == 0 else -1]
            for mode in order:
                r = one_run(agent, env, remote, run_dir, mode, step, args.lines, 0.05)
                out["runs"].append(r)
                print(json.dumps(r), flush=True)
                step += 10_000
    finally:
        launch = json.loads((run_dir / "launch.json").read_text())
        os.killpg(launch["pgid"], 9)
    for mode in MODES:
        rows = [r for r in out["runs"] if r["mode"] == mode]
        out[mode] = {k: [r[k] for r in rows] for k in ("p50_ms", "p99_ms", "over_5ms")}
    args.out.write_text(json.dumps(out, indent=1) + "\n")
    print("| samplers | p50 ms | p99 ms | lines over 5 ms (of 100) |")
    print("|---|---|---|---|")
    for mode in MODES:
        m = out[mode]
        print(f"| {mode} | {m['p50_ms']} | {m['p99_ms']} | {m['over_5ms']} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())

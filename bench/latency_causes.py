"""Where the line latency's tail comes from (issue 32: p99 <= 5 ms).

monitor_bench's latency path: a real tiny-cpu run launched through the agent behind a
loopback sshd and the `pct` stand-in, `dflash-tui --headless` following it, step lines
appended to its train.log and timed to the headless output. One host, one trainer; for each
run the trainer is, while the lines are sent:

  alone     left as it is (nice 0: how an operator's CPU run trains)
  nice:N    every thread of its process group at nice N (the chain keeps nice 0)
  stopped   SIGSTOPped (continued after): the same processes, no training beside the chain

With --gc-probe, every garbage-collector pass over 0.5 ms of each of this venv's Python
processes (headless, agent, trainer) is logged (a sitecustomize.py put in the venv's
site-packages for the bench's life, removed after), and each line over 5 ms is checked for a
pass inside its own window.

    .venv/bin/python bench/latency_causes.py --modes alone,nice:19,stopped --lines 1000
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import site
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "bench"), str(ROOT / "tests")]

from monitor_bench import TrainingHost, pct, timed_lines  # noqa: E402

SLOW_MS = 5.0
PROBE = """# bench/latency_causes.py --gc-probe: removed when the bench ends
import gc, os, time
_out, _t = os.environ.get("DFLASH_GC_PROBE"), [0.0]
def _pass(phase, info):
    if phase == "start":
        _t[0] = time.perf_counter()
        return
    now = time.perf_counter()
    if (now - _t[0]) * 1e3 > 0.5:
        with open(f"{_out}/{os.getpid()}.txt", "a") as f:
            f.write(f"{info['generation']} {(now - _t[0]) * 1e3:.3f} {now:.6f}\\n")
if _out:
    gc.callbacks.append(_pass)
"""


def group_pids(pgid: int) -> list[int]:
    pids = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            with contextlib.suppress(OSError, ValueError):
                if os.getpgid(int(d.name)) == pgid:
                    pids.append(int(d.name))
    return pids


def renice_group(pgid: int, nice: int) -> None:
    for pid in group_pids(pgid):
        for task in Path(f"/proc/{pid}/task").iterdir():
            with contextlib.suppress(OSError):
                os.setpriority(os.PRIO_PROCESS, int(task.name), nice)


def gc_passes(probe: Path) -> list[tuple[float, float, int, int]]:
    """(end, ms, generation, pid) of every logged pass."""
    out = []
    for f in probe.glob("*.txt"):
        for line in f.read_text().splitlines():
            gen, ms, end = line.split()
            out.append((float(end), float(ms), int(gen), int(f.stem)))
    return out


def one_run(host: TrainingHost, mode: str, first: int, n: int, every_s: float, probe: Path | None):
    pgid = json.loads((host.run_dir / "launch.json").read_text())["pgid"]  # type: ignore[operator]
    extra_env = {"DFLASH_GC_PROBE": str(probe)} if probe else {}
    if mode.startswith("nice:"):
        renice_group(pgid, int(mode.split(":")[1]))
    elif mode == "stopped":
        os.killpg(pgid, signal.SIGSTOP)
    try:
        lines, load = timed_lines(host, ROOT, first, n, every_s, extra_env)
    finally:
        if mode == "stopped":
            os.killpg(pgid, signal.SIGCONT)
        elif mode.startswith("nice:"):
            renice_group(pgid, 0)
    came = [(sent, ms) for sent, ms in lines.values() if ms is not None]
    lat = sorted(ms for _, ms in came)
    slow = sorted((sent, ms) for sent, ms in came if ms > SLOW_MS)
    row = {
        "mode": mode,
        "lines": len(lat),
        "of": n,
        "p50_ms": round(lat[len(lat) // 2], 2),
        "p99_ms": round(pct(lat, 0.99), 2),
        "max_ms": round(lat[-1], 2),
        f"over_{SLOW_MS:g}ms": len(slow),
        "load_average": load,
    }
    if probe is not None:
        passes = gc_passes(probe)
        window = [
            any(sent - 0.001 <= end <= sent + ms / 1e3 + 0.001 for end, _, _, _ in passes)
            for sent, ms in slow
        ]
        row["gc_passes_over_0.5ms"] = len(passes)
        row["gc_passes_over_2ms"] = sum(1 for p in passes if p[1] > 2)
        row["slow_lines_with_a_gc_pass_in_their_window"] = sum(window)
        for f in probe.glob("*.txt"):
            f.unlink()
    return row


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--modes", default="alone,nice:19,stopped")
    p.add_argument("--lines", type=int, default=1000)
    p.add_argument("--every-s", type=float, default=0.05)
    p.add_argument("--gc-probe", action="store_true")
    p.add_argument("--out", type=Path, help="the rows as JSON")
    args = p.parse_args()
    modes = args.modes.split(",")
    for m in modes:
        if m not in ("alone", "stopped") and not (m.startswith("nice:") and m[5:].isdigit()):
            print(f"--modes: {m!r} is not alone, stopped or nice:N", file=sys.stderr)
            return 2
    tmp = Path(tempfile.mkdtemp(prefix="dflash-latency-causes-"))
    probe_file = Path(site.getsitepackages()[0]) / "sitecustomize.py"
    probe = tmp / "gc" if args.gc_probe else None
    if probe is not None:
        if probe_file.exists():
            print(f"{probe_file}: exists already; not replaced", file=sys.stderr)
            return 2
        probe.mkdir()
        probe_file.write_text(PROBE)
    rows = []
    try:
        with TrainingHost(tmp / "host") as host:
            for k, mode in enumerate(modes):
                rows.append(one_run(host, mode, 10**9 * (k + 1), args.lines, args.every_s, probe))
                print(json.dumps(rows[-1]), flush=True)
    finally:
        if probe is not None:
            probe_file.unlink(missing_ok=True)
    result = {
        "rows": rows,
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "machine": f"{os.cpu_count()} CPUs, Python {sys.version.split()[0]}",
    }
    if args.out:
        args.out.write_text(json.dumps(result, indent=1) + "\n")
    print("| trainer while the lines are sent | p50 | p99 | max | lines over 5 ms | load |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['mode']} | {r['p50_ms']} | {r['p99_ms']} | {r['max_ms']} | "
            f"{r['over_5ms']} of {r['lines']} | {r['load_average'][0]} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())

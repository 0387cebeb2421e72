"""Figures of `bench/gpu_modes.sh`: threads mode against processes mode on one config, read
from the run dirs `dflash-tui launch` left, through the contract's own readers.

    python3 bench/modes_report.py RUN_DIR [RUN_DIR ...] [--settle S]   -> one row per run, JSON

tok/s: real tokens per second between the first metrics row past `settle` seconds of training
and the last (tokens counted by the trainer, padding excluded). GIL p99: the median and the
worst of the heartbeat's GIL probe over that window, from telemetry.jsonl; a processes-mode
job has one probe per process: the writer rank's is the job's, each other rank's is in
ranks/rank-R/heartbeat.json (its last value only).
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from trainer.contract.heartbeat import Heartbeat, read_heartbeat
from trainer.contract.records import MetricsRow, parse_metrics_line
from trainer.contract.telemetry import read_telemetry


def _rows(run_dir: Path) -> list[MetricsRow]:
    rows = []
    path = run_dir / "metrics.jsonl"
    for line in path.read_text(encoding="utf-8").splitlines() if path.exists() else []:
        row = parse_metrics_line(line)
        if isinstance(row, MetricsRow):
            rows.append(row)
    return rows


def figures(run_dir: Path, settle_s: float) -> dict[str, Any]:
    out: dict[str, Any] = {"run_id": run_dir.name}
    hb = read_heartbeat(str(run_dir / "heartbeat.json"))
    if not isinstance(hb, Heartbeat):
        return {**out, "error": f"no heartbeat ({hb})"}
    out["mode"] = "processes" if list(run_dir.glob("heartbeat-rank*.json")) else "threads"
    out["final_phase"], out["step"] = hb.phase, hb.step
    rows = [r for r in _rows(run_dir) if r.tokens > 0]
    if len(rows) < 2:
        return {**out, "error": f"{len(rows)} metrics rows with tokens"}
    start = next((r for r in rows if r.elapsed_s >= rows[0].elapsed_s + settle_s), rows[-2])
    end = rows[-1]
    if end.time > start.time:
        out["tok_s"] = round((end.tokens - start.tokens) / (end.time - start.time), 1)
        out["window_s"] = round(end.time - start.time, 1)
        out["window_steps"] = f"{start.step}..{end.step}"
    out["padding"] = end.padding
    beats, _skipped = read_telemetry(run_dir / "telemetry.jsonl")
    p99 = [b.gil.p99_ms for b in beats if start.time <= b.now <= end.time and b.gil.samples]
    if p99:
        out["gil_p99_ms_median"] = round(statistics.median(p99), 2)
        out["gil_p99_ms_max"] = round(max(p99), 2)
    ranks = {}
    for own in sorted((run_dir / "ranks").glob("rank-*/heartbeat.json")):
        rhb = read_heartbeat(str(own))
        if isinstance(rhb, Heartbeat):
            ranks[own.parent.name] = {"phase": rhb.phase, "gil_p99_ms": rhb.gil.p99_ms}
    if ranks:
        out["other_ranks"] = ranks
    return out


def main(argv: list[str]) -> int:
    settle = 20.0
    if "--settle" in argv:
        i = argv.index("--settle")
        settle = float(argv[i + 1])
        argv = argv[:i] + argv[i + 2 :]
    for d in argv:
        print(json.dumps(figures(Path(d), settle), sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

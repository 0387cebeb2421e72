"""Figures of `bench/gpu_e2e.sh`: read from what the dflash-tui commands printed (events.jsonl,
marked by the script) and from the run dirs they left, through the contract's own readers.

    python3 bench/e2e_report.py phase-step STATUS.json      -> "PHASE STEP" of the last snapshot
    python3 bench/e2e_report.py report EVENTS RUNS SETTLE_S HARNESS_TXT  -> e2e.json
    python3 bench/e2e_report.py table E2E.json              -> the README rows
"""

from __future__ import annotations

import json
import re
import statistics
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from trainer.contract.heartbeat import Heartbeat, read_heartbeat
from trainer.contract.phases import phase_durations
from trainer.contract.records import LaunchRecord, read_launch


def phase_step(path: str) -> str:
    phase, step = "?", "None"
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except OSError:
        return f"{phase} {step}"
    for line in lines:
        try:
            obj = json.loads(line)
        except ValueError:
            continue
        if isinstance(obj, dict) and obj.get("kind") == "snapshot":
            state = obj.get("state") or {}
            phase, step = str(state.get("phase") or "?"), str(state.get("step"))
    return f"{phase} {step}"


def _run(run_dir: Path, settle_s: float) -> dict[str, Any]:
    """One run: launch -> first step, its phases, compile figures, tok/s after `settle_s`."""
    hb = read_heartbeat(str(run_dir / "heartbeat.json"))
    launch = read_launch(str(run_dir))
    out: dict[str, Any] = {"run_id": run_dir.name}
    if not isinstance(hb, Heartbeat):
        out["error"] = f"no heartbeat ({hb})"
        return out
    launched = launch.launched_at if isinstance(launch, LaunchRecord) else hb.started_at
    first_step = next((v.started_at for v in hb.phase_history if v.phase == "training"), None)
    out["phases_s"] = {
        k: round(v, 1) for k, v in phase_durations(hb.phase_history, hb.now, hb.final).items()
    }
    out["final_phase"], out["step"], out["total_steps"] = hb.phase, hb.step, hb.total_steps
    if first_step is not None:
        out["launch_to_first_step_s"] = round(first_step - launched, 1)
    c = hb.compile
    out["compile"] = {
        "warmup_s": c.warmup_s,
        "graphs": c.graphs,
        "compiles_done": c.done,
        "expected": c.expected,
        "last_s": c.last_s,
        "last_cache": c.last_cache,
        "recompiles": c.recompiles,
        "cache_hits": c.cache_hits,
        "cache_misses": c.cache_misses,
        "breakdown": c.breakdown,
    }
    log = run_dir / "train.log"
    text = log.read_text(errors="replace") if log.exists() else ""
    out["checkpoints"] = [ln for ln in text.splitlines() if ln.startswith("checkpoint ")]
    out["resume_lines"] = [ln for ln in text.splitlines() if ln.startswith(("resume", "resumed"))]
    if hb.target_load is not None and hb.target_load.ended_at is not None:
        out["target_load_s"] = round(hb.target_load.ended_at - hb.target_load.started_at, 1)
    try:
        cfg = json.loads((run_dir / "config.json").read_text())
        out["resumed_from"] = (cfg.get("run") or {}).get("checkpoint")
        out["parent"] = (cfg.get("run") or {}).get("parent")
    except (OSError, ValueError):
        pass
    if hb.eval is not None:  # held-out τ during training (trainer/evaluation/online.py)
        ev = hb.eval
        out["eval"] = {
            "history": [[p.step, p.tau] for p in ev.history],
            "seconds_per_eval": round(ev.seconds / len(ev.history), 2) if ev.history else None,
            "snapshot_ms": round(ev.snapshot_s * 1e3, 2),
            "skipped": ev.skipped,
            "error": ev.error,
        }
    rows = []
    metrics = run_dir / "metrics.jsonl"
    if metrics.exists():
        for line in metrics.read_text().splitlines():
            try:
                rows.append(json.loads(line))
            except ValueError:
                continue
    if rows:
        out["first_logged"] = {"step": rows[0]["step"], "loss": rows[0]["loss"]}
    if first_step is not None:
        late = [r for r in rows if r.get("time", 0) >= first_step + settle_s]
        if late:
            out["tok_s"] = round(statistics.median(r["tok_s"] for r in late))
            out["tok_s_rows"] = len(late)
            out["stages_ms"] = late[-1].get("stages_ms", {})
    return out


def _kill_line(line: str) -> dict[str, Any]:
    """'... resumable with restart; 9.8s; GPU memory released: 0.2s; ...' -> the figures."""
    out: dict[str, Any] = {"line": line}
    if m := re.search(r"; ([\d.]+)s; GPU", line):
        out["stop_s"] = float(m.group(1))
    if m := re.search(r"released: ([\d.]+)s", line):
        out["drain_s"] = float(m.group(1))
    return out


def report(events_path: str, runs_root: str, settle_s: float, harness: str) -> dict[str, Any]:
    events = [json.loads(x) for x in Path(events_path).read_text().splitlines() if x.strip()]
    at = {e["what"]: e for e in events}
    res: dict[str, Any] = {}
    if "deploy-end" in at:
        res["deploy_s"] = round(at["deploy-end"]["t"] - at["deploy-start"]["t"], 1)
    dumps = [e for e in events if e["what"] == "dump"]
    named = [e for e in dumps if e.get("line", "").startswith("# named dump")]
    lat = [float(m.group(1)) for e in dumps if (m := re.search(r"([\d.]+)s after", e["line"]))]
    res["stack_dumps"] = {
        "tries": len(dumps),
        "named": len(named),
        "fallback": sum(e.get("line", "").startswith("# faulthandler") for e in dumps),
        "latency_s": lat,
        "latency_max_s": max(lat) if lat else None,
    }
    if "restart-first-step" in at:
        res["restart_to_first_step_s"] = round(
            at["restart-first-step"]["t"] - at["restart-start"]["t"], 1
        )
    if "kill-end" in at:
        res["kill_command_s"] = round(at["kill-end"]["t"] - at["kill-start"]["t"], 1)
        res["kill"] = _kill_line(at["kill-end"].get("line", ""))
    if "restart-end" in at:
        res["restart_line"] = at["restart-end"].get("line", "")
    if "shipped-first-step" in at:
        res["shipped_launch_to_first_step_s"] = round(
            at["shipped-first-step"]["t"] - at["shipped-launch-start"]["t"], 1
        )
    runs = sorted(p for p in Path(runs_root).iterdir() if p.is_dir())
    res["runs"] = [_run(p, settle_s) for p in runs]
    try:
        text = Path(harness).read_text()
    except OSError:
        text = ""
    if m := re.search(r"HARNESS tok_s=(\d+) .*step_ms=([\d.]+)", text):
        res["harness_tok_s"], res["harness_step_ms"] = int(m.group(1)), float(m.group(2))
        if res["runs"] and res["runs"][0].get("tok_s"):
            res["launch_vs_harness"] = round(res["runs"][0]["tok_s"] / res["harness_tok_s"], 3)
    return res


def table(path: str) -> str:
    r = json.loads(Path(path).read_text())
    runs = r.get("runs", [])
    lines = []
    if runs:
        cold = runs[0]
        lines.append(f"cold launch -> first step: {cold.get('launch_to_first_step_s')} s")
        lines.append(f"  phases: {cold.get('phases_s')}")
        lines.append(f"  compile: {cold.get('compile')}")
        lines.append(f"tok/s after settling (run 1): {cold.get('tok_s')}")
        lines.append(f"held-out eval (run 1): {cold.get('eval')}")
    if len(runs) > 1:
        warm = runs[1]
        lines.append(
            f"restart -> first step: {r.get('restart_to_first_step_s')} s "
            f"(its launch -> first step {warm.get('launch_to_first_step_s')} s; "
            f"resumed from {warm.get('resumed_from')}; first logged {warm.get('first_logged')})"
        )
        lines.append(f"  phases: {warm.get('phases_s')}")
    sd = r.get("stack_dumps", {})
    lines.append(
        f"stack dumps: {sd.get('named')} of {sd.get('tries')} named "
        f"({sd.get('fallback')} fallback), max {sd.get('latency_max_s')} s, {sd.get('latency_s')}"
    )
    lines.append(f"kill command: {r.get('kill_command_s')} s ({r.get('kill', {}).get('line')})")
    lines.append(f"restart said: {r.get('restart_line')}")
    lines.append(
        f"fresh host, compile cache shipped by deploy: launch -> first step "
        f"{r.get('shipped_launch_to_first_step_s')} s (polled)"
    )
    lines.append(
        f"harness (bare pipeline, same config and data): {r.get('harness_tok_s')} tok/s; "
        f"launch / harness = {r.get('launch_vs_harness')}"
    )
    for run in runs:
        lines.append(f"{run['run_id']}: {run.get('checkpoints')} {run.get('resume_lines')}")
        for thread, st in sorted(run.get("stages_ms", {}).items()):
            lines.append(f"  {thread}: {st}")
    lines.append(f"deploy {r.get('deploy_s')} s")
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    if argv[:1] == ["phase-step"]:
        print(phase_step(argv[1]))
    elif argv[:1] == ["report"]:
        print(json.dumps(report(argv[1], argv[2], float(argv[3]), argv[4]), indent=1))
    elif argv[:1] == ["table"]:
        print(table(argv[1]))
    else:
        print(__doc__, file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

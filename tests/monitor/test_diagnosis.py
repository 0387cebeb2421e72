"""Diagnosis on recorded scenarios: agent event streams applied to a real Store.

Scenario files (tests/fixtures/scenarios/*.jsonl) are agent events, one per line, with '#'
comment lines; the store gets them through the contract's decoder, as the link hands them.
Two shorthands keep them readable, also inside metrics.jsonl line texts: "now-30" is a time
30 s before the test's now, and "95535 MiB" / "79 GiB" are byte counts.
The helpers here load and edit them; per-rule thresholds are in test_diagnosis_rules.py.
"""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from monitor_helpers import typed_event

from dflash_tui import diagnosis
from dflash_tui.diagnosis import (
    DEFAULT_CONFIG,
    SEVERITY_ORDER,
    DiagnosisConfig,
    Finding,
    diagnose,
    phase_expectation,
    wandb_info,
)
from dflash_tui.state import Store
from trainer.contract.heartbeat import WandbInfo

NOW = 1_800_000_000.0
FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
SCENARIOS = FIXTURES / "scenarios"
SEEDS = FIXTURES / "seed-scenarios"
BASELINE = DiagnosisConfig(baseline_tok_s=21_500.0)
UNITS = {"MiB": 1 << 20, "GiB": 1 << 30}
Events = list[dict[str, Any]]
Edit = Callable[[Events], None]


# -- loading -----------------------------------------------------------------------------
def resolve(x: Any, now: float) -> Any:
    if isinstance(x, dict):
        return {k: resolve(v, now) for k, v in x.items()}
    if isinstance(x, list):
        return [resolve(v, now) for v in x]
    if isinstance(x, str):
        if m := re.fullmatch(r"now([+-]\d+(?:\.\d+)?)?", x):
            return now + float(m.group(1) or 0)
        if m := re.fullmatch(r"(\d+(?:\.\d+)?) (MiB|GiB)", x):
            return int(float(m.group(1)) * UNITS[m.group(2)])
    return x


def events(name: str, now: float = NOW) -> Events:
    out = []
    for ln in (SCENARIOS / name).read_text().splitlines():
        if not ln.strip() or ln.startswith("#"):
            continue
        e = resolve(json.loads(ln), now)
        if e.get("type") == "line" and e.get("file") == "metrics.jsonl":
            # a metrics.jsonl line is JSON itself: the shorthands apply inside it too
            e["text"] = json.dumps(resolve(json.loads(e["text"]), now))
        out.append(e)
    return out


class Clock:
    """The store's clock: frozen, moved on by hand."""

    def __init__(self, t: float) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def store(evs: Events, now: float = NOW) -> Store:
    s = Store("gpu-box", clock=Clock(now))
    for e in evs:
        s.apply(typed_event(e))
    return s


def run(
    name: str, *edits: Edit, config: DiagnosisConfig = DEFAULT_CONFIG, now: float = NOW
) -> list[Finding]:
    """Findings for scenario `name` after applying `edits` to its events."""
    evs = events(name, now)
    for edit in edits:
        edit(evs)
    return diagnose(store(evs, now), now, config)


def codes(findings: list[Finding]) -> list[str]:
    return [f.code for f in findings]


def only(findings: list[Finding], code: str) -> Finding:
    hits = [f for f in findings if f.code == code]
    assert len(hits) == 1, [(f.code, f.title) for f in findings]
    return hits[0]


# -- edits -------------------------------------------------------------------------------
def of_type(evs: Events, kind: str) -> Events:
    return [e for e in evs if e.get("type") == kind]


def hb(evs: Events) -> dict[str, Any]:
    """The last heartbeat's data, to edit in place."""
    return of_type(evs, "heartbeat")[-1]["data"]


def metrics_records(evs: Events) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    return [
        (e, json.loads(e["text"])) for e in of_type(evs, "line") if e.get("file") == "metrics.jsonl"
    ]


def edit_metrics(evs: Events, change: Callable[[dict[str, Any]], None]) -> None:
    for e, m in metrics_records(evs):
        change(m)
        e["text"] = json.dumps(m)


def queues(q_pre: list[int] | None = None, q_hs: list[int] | None = None) -> Edit:
    """The same depths in the heartbeat and in every metrics record."""

    def edit(evs: Events) -> None:
        for key, depths in (("q_pre", q_pre), ("q_hs", q_hs)):
            if depths is None:
                continue
            for q, d in zip(hb(evs)["queues"][key], depths, strict=True):
                q["depth"] = d
            edit_metrics(evs, lambda m, key=key, depths=depths: m.__setitem__(key, depths))

    return edit


def util(**by_gpu: int) -> Edit:
    """GPU utilisation in every gpu sample: util(gpu5=3)."""

    def edit(evs: Events) -> None:
        for g in of_type(evs, "gpu"):
            for d in g["devices"]:
                if f"gpu{d['index']}" in by_gpu:
                    d["util"] = by_gpu[f"gpu{d['index']}"]

    return edit


def thread(name: str, state: str, since_s: float, now: float = NOW) -> Edit:
    """Thread `name` in `state` since `since_s` seconds before the heartbeat."""

    def edit(evs: Events) -> None:
        data = hb(evs)
        t = next(t for t in data["threads"] if t["name"] == name)
        t["state"], t["since"] = state, data["now"] - since_s

    return edit


def heartbeat(**fields: Any) -> Edit:
    def edit(evs: Events) -> None:
        hb(evs).update(fields)

    return edit


# -- the fixtures are the seeds ----------------------------------------------------------
def test_the_gpu_fixture_is_the_seed_csv() -> None:
    gpu = of_type(events("gpu_imbalance.jsonl"), "gpu")[-1]
    rows = [
        [int(p.strip().split()[0]) for p in ln.split(",")]
        for ln in (SEEDS / "gpu_imbalance.csv").read_text().splitlines()
    ]
    got = [[d["index"], d["mem_used"] >> 20, d["util"]] for d in gpu["devices"]]
    assert got == rows
    s = store(events("gpu_imbalance.jsonl"))
    assert s.gpu_roles() == {
        0: "target",
        1: "target",
        2: "target",
        3: "target",
        4: "prefetch+target",
        5: "drafter",
        6: "drafter",
        7: "drafter",
    }


def test_the_log_fixtures_are_the_seed_lines() -> None:
    step = (SEEDS / "step_lines.log").read_text().splitlines()
    wandb = (SEEDS / "wandb_only.log").read_text().splitlines()
    assert [e["text"] for e in of_type(events("step_lines.jsonl"), "line")] == step
    assert [e["text"] for e in of_type(events("wandb_only.jsonl"), "line")] == wandb


# -- what each seed scenario now says ----------------------------------------------------
def test_healthy_runs_have_no_findings() -> None:
    assert run("healthy_gpu.jsonl") == []
    assert run("healthy_gpu.jsonl", config=BASELINE) == []  # 21.4K vs 21.5K: within 10%
    assert run("recorded/healthy.jsonl") == []  # the CPU demo, as measured on 2 cores


def test_seed_step_lines_slow_against_the_baseline() -> None:
    assert run("step_lines.jsonl") == []  # no baseline configured: nothing to compare
    top = run("step_lines.jsonl", config=BASELINE)[0]
    assert (top.severity, top.title) == ("warning", "tok/s 34% below the 21.5K baseline")
    assert "14.2K tok/s" in top.evidence and "21.5K" in top.evidence


def test_seed_wandb_only_says_phase_time_steps_and_the_wandb_run() -> None:
    found = run("wandb_only.jsonl")
    assert codes(found) == ["output_buffered", "no_step_line"]
    assert found[0].title == "output buffered: steps advance, no step line"
    assert "step 40" in found[0].evidence
    info = found[1]
    assert info.title == "training for 3m05s, step 40, no step line yet"
    assert "steps advance (step 40, last 1s ago)" in info.evidence
    assert "5 wandb lines" in info.evidence and "wandb run nloj6lfc (online)" in info.evidence


def test_seed_wandb_only_while_still_compiling() -> None:
    found = run(
        "wandb_only.jsonl",
        heartbeat(phase="compiling", phase_started_at=NOW - 372, step=0, last_step_at=None),
    )
    assert codes(found) == ["no_step_line"]  # 6m12s < 2 × 4m12s: not slow yet
    assert found[0].title == "compiling for 6m12s, no step yet"
    assert "(compile took 4m12s last time), step 0" in found[0].evidence
    assert "nloj6lfc" in found[0].evidence


def test_seed_gpu_imbalance() -> None:
    found = run("gpu_imbalance.jsonl")
    assert codes(found) == ["target_stuck", "targets_bottleneck", "memory_short"]
    stuck, starved, memory = found
    assert stuck.title == "targets 1, 2 idle with a full q_pre"
    assert "target-1 on GPU 1 at 2%, 'forward' for 3m09s" in stuck.evidence
    assert "q_pre 8/8 8/8" in stuck.evidence and "target-1" in stuck.action
    assert starved.title == "targets are the bottleneck"
    assert "drafter GPUs 5 0%, 6 1%, 7 0%" in starved.evidence
    assert "q_hs 2/20 1/20 0/20" in starved.evidence
    assert memory.title == "drafters hold less memory than usual"
    assert "GPU 5 44.7 GB, GPU 6 64.0 GB, GPU 7 63.0 GB" in memory.evidence
    assert "peaked at 79.0 GB" in memory.evidence


def test_slow_compile_and_the_heartbeat_pane_expectation() -> None:
    evs = events("slow_compile.jsonl")
    s = store(evs)
    assert phase_expectation(s) == "compile took 4m12s last time"
    (f,) = diagnose(s, NOW)
    assert (f.code, f.title) == ("slow_phase", "compiling slower than usual")
    assert f.evidence.startswith(
        "12m00s so far; 4m12s last time (run 20260520-081200-qwen36-27b-0005)"
    )
    # the run that crashed while compiling and the other config are left out
    assert "median 4m12s over 3 runs" in f.evidence


# -- ordering and robustness -------------------------------------------------------------
def test_critical_before_warning_before_info() -> None:
    found = run("killed_held.jsonl")
    assert codes(found) == ["killed", "stale_heartbeat", "memory_held"]
    assert found[0].title == "run killed by SIGKILL"  # not a crash: no exception
    assert found[0].evidence == "no error recorded; last heartbeat: phase training, step 876"
    for name in sorted(p.name for p in SCENARIOS.glob("*.jsonl")):
        ranks = [SEVERITY_ORDER[f.severity] for f in run(name, config=BASELINE)]
        assert ranks == sorted(ranks), name


def test_the_old_call_signature_still_works() -> None:
    s = store(events("gpu_imbalance.jsonl"))
    assert diagnose(s, NOW) == diagnose(s) == diagnose(s, NOW, DEFAULT_CONFIG)
    assert diagnose(s, NOW, config=replace(DEFAULT_CONFIG, idle_util_pct=1.0)) != diagnose(s)


def test_a_rule_tripping_on_odd_input_does_not_blank_the_others(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Odd input no longer reaches a rule ("threads": "not a list" is an unreadable heartbeat,
    # test_malformed.py); a rule with a bug still must not blank the others.
    def trips(s: Store, now: float, cfg: DiagnosisConfig = DEFAULT_CONFIG) -> list[Finding]:
        return [Finding("info", "x", s.gpu.devices[99].name, "", "")] if s.gpu else []

    assert all(f.code != "rule_error" for f in run("killed_held.jsonl"))
    rules = list(diagnosis.RULES)
    at = rules.index(diagnosis.memory_held_after_kill)
    monkeypatch.setattr(diagnosis, "RULES", [*rules[:at], trips, *rules[at:]])
    found = diagnose(store(events("killed_held.jsonl")), NOW)
    assert codes(found)[:2] == ["killed", "stale_heartbeat"]
    error = only(found, "rule_error")
    assert error.severity == "info" and "trips" in error.title
    assert "IndexError" in error.evidence
    assert "memory_held" in codes(found)  # the rules after it ran


# -- wandb_info --------------------------------------------------------------------------
def test_wandb_info_from_the_heartbeat_or_the_log() -> None:
    url = "https://wandb.ai/aurorainfra/dflash-qwen36-27b/runs/nloj6lfc"
    from_hb = store(events("healthy_gpu.jsonl"))
    assert wandb_info(from_hb) == WandbInfo(id="nloj6lfc", url=url, mode="online")
    from_log = store(events("wandb_only.jsonl"))  # that heartbeat has no wandb field
    assert from_log.heartbeat is not None and from_log.heartbeat.wandb is None
    assert wandb_info(from_log) == WandbInfo(id="nloj6lfc", url=url, mode="online")
    assert wandb_info(store(events("recorded/died_before_start.jsonl"))) is None
    disabled = store(events("recorded/healthy.jsonl"))
    assert wandb_info(disabled) == WandbInfo(id=None, url=None, mode="disabled")


def test_wandb_info_offline_from_the_log() -> None:
    evs = events("wandb_only.jsonl")
    offline = [
        "wandb: Tracking run with wandb version 0.19.1",
        "wandb: W&B syncing is set to `offline` in this directory.",
        "wandb: Run data is saved locally in /root/wandb/offline-run-20260520_094738-nloj6lfc",
    ]
    lines = [e for e in of_type(evs, "line") if e["file"] == "train.log"]
    for e, text in zip(lines, offline, strict=False):
        e["text"] = text
    for e in lines[len(offline) :]:
        evs.remove(e)
    assert wandb_info(store(evs)) == WandbInfo(id="nloj6lfc", url=None, mode="offline")


def test_scenarios_do_not_leak_between_stores() -> None:
    evs = events("healthy_gpu.jsonl")
    first = copy.deepcopy(evs)
    assert diagnose(store(evs), NOW) == diagnose(store(first), NOW) == []

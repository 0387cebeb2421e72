"""The environment fingerprint and the fast-kernel preflight, monitor side: the runs list,
the `slow_kernels` and `environment_changed` rules, `dflash-tui runs --env`.

Fixtures: recorded/fingerprinted.jsonl (scripts/record-scenarios: two real CPU runs of the
demo config, whose config.json and heartbeat carry what the real trainer wrote), and the
old run dirs of tests/fixtures/rundirs (no fingerprint at all). What each test edits is
said where it does; a GPU run cannot be recorded here, so the slow-path record is made by
the real preflight function with the device "cuda:0" given at its boundary
(trainer/targets/preflight.py), and put into the recorded heartbeat.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from test_diagnosis import NOW, SCENARIOS, codes, events, hb, of_type, only, run, store

from dflash_tui.agent.runs import RunRoot
from dflash_tui.commands.runs import format_runs
from trainer.contract.environment import (
    Environment,
    KernelPackage,
    Preflight,
    parse_environment,
    parse_preflight,
    read_environment,
)
from trainer.contract.typed import encode

FINGERPRINTED = "recorded/fingerprinted.jsonl"
RUNDIRS = Path(__file__).resolve().parents[1] / "fixtures" / "rundirs"


@pytest.fixture(scope="module")
def hybrid_on_gpu(tmp_path_factory) -> Preflight:
    """The real preflight of a Qwen3.5 config (8 layers: 6 Gated DeltaNet, 2 full
    attention) for device "cuda:0": transformers here has no fla nor causal-conv1d, so its
    own modeling module resolved the torch fallbacks. Only the device string is simulated."""
    from transformers import Qwen3_5TextConfig

    from trainer.targets.preflight import run_preflight

    d = tmp_path_factory.mktemp("qwen3_5")
    (d / "config.json").write_text(
        Qwen3_5TextConfig(num_hidden_layers=8, hidden_size=64).to_json_string()
    )
    pf = run_preflight(d, "cuda:0")
    assert pf.error == "" and pf.slow()
    return pf


# -- reading ----------------------------------------------------------------------------------
@pytest.mark.parametrize("fixture", ["main-c119aa7", "h200-schema2"])
def test_old_run_dirs_have_no_fingerprint_and_still_list(tmp_path, fixture):
    shutil.copytree(RUNDIRS / fixture, tmp_path / "runs")
    root = RunRoot(str(tmp_path / "runs"))
    infos = [root.info(r, None) for r in root.run_ids()]
    assert infos and all(i.environment is None and i.preflight is None for i in infos)
    assert all(i.unreadable == [] for i in infos)
    assert "env: —" in format_runs(infos, env=True)


def test_odd_values_are_reset_not_fatal():
    env = parse_environment(
        {"torch": 2, "transformers": "5.24.0", "gpus": "H200", "gpu_count": "8",
         "fast_kernels": {"fla": 1}, "extra": [1]}
    )  # fmt: skip
    assert env == Environment(transformers="5.24.0")
    assert parse_environment([1]) is None and read_environment({"run": "x"}) is None
    pf = parse_preflight(
        {"device": "cuda:0", "layers": [
            {"layer_type": "linear_attention", "count": 3, "path": "slow",
             "packages": [{"name": "fla", "version": 4}, {"version": "1"}]},
            {"count": 1}, "junk"]}
    )  # fmt: skip
    assert pf is not None and len(pf.layers) == 1  # the layer without a type is dropped
    assert pf.layers[0].packages == [KernelPackage(name="fla")]  # bad version reset
    assert parse_preflight("x") is None


# -- the recorded runs --------------------------------------------------------------------------
def test_the_recorded_runs_carry_the_real_fingerprint():
    """As recorded: both runs carry the real fingerprint; the same environment and a CPU
    run's torch path are no finding, although the followed run really did train 15% slower
    than the earlier one (the recording machine's 2 cores were shared: its GIL probe woke
    late, but no pipeline thread was busy, so no gil_pressure: test_diagnosis_host.py)."""
    assert codes(run(FINGERPRINTED)) == []
    s = store(events(FINGERPRINTED))
    assert len(s.runs) == 2
    for info in s.runs:
        assert info.environment is not None and info.preflight is not None
        assert info.environment.torch and info.environment.transformers
        assert info.environment.fast_kernels == {"fla": "missing", "causal_conv1d": "missing"}
        assert [(lp.layer_type, lp.path, lp.why) for lp in info.preflight.layers] == [
            ("full_attention", "torch", "cpu: torch path")
        ]
    assert s.heartbeat is not None and s.heartbeat.preflight == s.runs[-1].preflight
    text = format_runs(s.runs, env=True)
    assert "[slow kernels]" not in text
    assert "kernels (cpu): 6 full_attention: torch" in text
    assert f"env: {s.runs[0].environment.describe()}" in text


def _earlier(evs, **environment):
    """Edit: the earlier run's environment (its recorded fingerprint with `environment`
    changed) and its best tok/s, 1.8× this run's."""
    runs_event = of_type(evs, "runs")[-1]
    earlier = runs_event["runs"][0]
    earlier["environment"].update(environment)
    current = runs_event["runs"][-1]
    earlier["best_tok_s"] = 1.8 * max(current.get("last_tok_s") or 0.0, hb(evs)["tok_s"], 1.0)


def test_a_slower_run_on_another_environment_names_what_differs():
    evs = events(FINGERPRINTED)
    env = of_type(evs, "runs")[-1]["runs"][0]["environment"]
    old_fla = {**env["fast_kernels"], "fla": "0.4.1", "causal_conv1d": "1.5.2"}
    _earlier(evs, transformers="5.17.0", fast_kernels=old_fla)
    s = store(evs)
    f = only(
        __import__("dflash_tui.diagnosis", fromlist=["diagnose"]).diagnose(s, NOW),
        "environment_changed",
    )
    now_tf = s.runs[-1].environment.transformers
    assert f.severity == "warning"
    assert f.title == (
        f"environment differs from a faster run: transformers 5.17.0 → {now_tf}, "
        "causal_conv1d missing, fla missing"
    )
    assert f"run {s.runs[0].run_id} (same config) trained at" in f.evidence
    assert "transformers 5.17.0" in f.evidence and "fla 0.4.1" in f.evidence
    assert f.action.startswith("put back what differs (transformers 5.17.0 →")


def test_no_environment_finding_when_only_the_speed_differs():
    evs = events(FINGERPRINTED)
    _earlier(evs)  # faster, same environment
    assert "environment_changed" not in codes(run_events(evs))


def test_no_environment_finding_when_the_earlier_run_was_not_faster():
    evs = events(FINGERPRINTED)
    earlier, current = of_type(evs, "runs")[-1]["runs"]
    earlier["environment"]["transformers"] = "5.17.0"
    earlier["best_tok_s"] = current["last_tok_s"]  # edit: recorded, it was 15% faster
    assert "environment_changed" not in codes(run_events(evs))


def test_no_environment_finding_for_an_earlier_run_without_a_fingerprint():
    evs = events(FINGERPRINTED)
    _earlier(evs)
    of_type(evs, "runs")[-1]["runs"][0].pop("environment")
    assert "environment_changed" not in codes(run_events(evs))


def run_events(evs):
    from dflash_tui.diagnosis import diagnose

    return diagnose(store(evs), NOW)


# -- the slow kernel path ---------------------------------------------------------------------
def test_a_gpu_target_on_the_torch_fallback_is_a_warning_with_the_fix(hybrid_on_gpu):
    evs = events(FINGERPRINTED)
    hb(evs)["preflight"] = encode(hybrid_on_gpu)  # edit: the GPU preflight, made for real
    f = only(run_events(evs), "slow_kernels")
    assert f.severity == "warning"
    assert f.title == "target on the slow torch fallback: linear_attention"
    assert f.evidence.startswith(
        "linear_attention (6 layers, path slow): fla not installed; causal_conv1d not installed"
    )
    assert "transformers' resolved kernel functions" in f.evidence
    assert f.action == (
        "pip install flash-linear-attention && pip install --no-build-isolation causal-conv1d"
        " in the trainer's Python, then restart (r); transformers picks them at import"
    )


def test_the_runs_list_marks_a_gpu_run_on_the_slow_path(hybrid_on_gpu):
    evs = events(FINGERPRINTED)
    of_type(evs, "runs")[-1]["runs"][-1]["preflight"] = encode(hybrid_on_gpu)  # edit
    s = store(evs)
    rows = format_runs(s.runs).splitlines()
    assert rows[-1].endswith("[slow kernels]") and not rows[1].endswith("[slow kernels]")


def test_a_fast_kernel_that_fails_on_the_gpu_is_named(hybrid_on_gpu):
    pf = Preflight(**{**hybrid_on_gpu.__dict__})
    pf.layers = [
        type(lp)(**{**lp.__dict__, "packages": [
            KernelPackage(p.name, p.distribution, "0.4.1", True, False, True,
                          "OutOfResources: shared memory") for p in lp.packages
        ], "path": "fast"}) if lp.packages else lp
        for lp in hybrid_on_gpu.layers
    ]  # fmt: skip
    evs = events(FINGERPRINTED)
    hb(evs)["preflight"] = encode(pf)  # edit: what a failing kernel's record says
    f = only(run_events(evs), "slow_kernels")
    assert f.title == "a fast kernel fails on this GPU"
    assert "fla 0.4.1 fails on cuda:0: OutOfResources: shared memory" in f.evidence


def test_a_cpu_run_is_never_a_kernel_finding():
    evs = events(FINGERPRINTED)
    assert hb(evs)["preflight"]["device"] == "cpu"
    assert "slow_kernels" not in codes(run_events(evs))


def test_scenarios_dir_is_the_recorded_one():
    assert (SCENARIOS / FINGERPRINTED).is_file()

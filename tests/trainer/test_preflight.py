"""The fast-kernel preflight and the environment fingerprint (trainer/targets/preflight.py).

What is real here: transformers 5.x as installed, its Qwen3.5 modeling module and the kernel
functions it resolved at import (fla and causal-conv1d are not installed on this machine, so
it resolved its torch fallbacks), the trainer process of a real CPU run. What is simulated:
the device string `run_preflight` is given ("cuda:0" on a machine without a GPU), at the
function's boundary; everything it decides below that is the real code.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import ROOT
from trainer.contract.environment import FAST, MISSING, SLOW, TORCH, read_environment
from trainer.contract.heartbeat import Heartbeat, parse_heartbeat
from trainer.contract.records import read_config
from trainer.targets.preflight import (
    environment,
    layer_counts,
    modeling_module,
    nvidia_driver,
    resolved_kernels,
    run_preflight,
    try_kernel,
)

FAKE_NVML = ROOT / "tests" / "infra" / "fake_nvml"
TINY = ROOT / "trainer" / "configs" / "tiny-cpu.toml"


@pytest.fixture(scope="module")
def hybrid_target(tmp_path_factory) -> Path:
    """A Qwen3.5 text config as transformers writes it (layer_types included): the
    preflight reads the config alone, so no weights are needed."""
    from transformers import Qwen3_5TextConfig

    d = tmp_path_factory.mktemp("qwen3_5")
    cfg = Qwen3_5TextConfig(num_hidden_layers=8, hidden_size=64)
    (d / "config.json").write_text(cfg.to_json_string())
    return d


def test_layer_types_come_from_the_text_config_of_a_multimodal_wrapper():
    text = {"model_type": "qwen3_5_text", "num_hidden_layers": 4,
            "layer_types": ["linear_attention"] * 3 + ["full_attention"]}  # fmt: skip
    wrapper = {"model_type": "qwen3_5", "text_config": text}
    assert layer_counts(wrapper) == {"linear_attention": 3, "full_attention": 1}
    assert layer_counts(wrapper, keep=2) == {"linear_attention": 2}
    # Qwen3 has no layer_types: every layer is full attention.
    assert layer_counts({"model_type": "qwen3", "num_hidden_layers": 5}) == {"full_attention": 5}


def test_on_cpu_the_preflight_says_torch_path_in_under_a_second(hybrid_target):
    t0 = time.perf_counter()
    pf = run_preflight(hybrid_target, "cpu", keep_layers=6)
    assert time.perf_counter() - t0 < 1.0
    assert pf.error == "" and pf.model_type == "qwen3_5_text"
    by_type = {lp.layer_type: lp for lp in pf.layers}
    assert by_type["linear_attention"].count == 5 and by_type["full_attention"].count == 1
    assert all(lp.path == TORCH and lp.why == "cpu: torch path" for lp in pf.layers)
    assert pf.slow() == []  # not a problem on a CPU
    names = [p.name for p in by_type["linear_attention"].packages]
    assert names == ["fla", "causal_conv1d"]


def test_on_a_gpu_a_missing_kernel_package_is_transformers_slow_fallback(hybrid_target):
    """Simulated device "cuda:0"; the decision is read from transformers' own modeling
    module, which really resolved its torch fallbacks (fla/causal-conv1d not installed)."""
    pf = run_preflight(hybrid_target, "cuda:0", keep_layers=8)
    assert pf.error == ""
    assert pf.decided_by == "transformers' resolved kernel functions"
    lin = next(lp for lp in pf.layers if lp.layer_type == "linear_attention")
    full = next(lp for lp in pf.layers if lp.layer_type == "full_attention")
    assert lin.path == SLOW and full.path == FAST
    assert [(p.name, p.used, p.version, p.state()) for p in lin.packages] == [
        ("fla", False, None, MISSING),
        ("causal_conv1d", False, None, MISSING),
    ]
    assert "fla not installed" in lin.why and "causal_conv1d not installed" in lin.why
    assert pf.slow() == [lin]
    assert pf.summary() == (
        "6 linear_attention: slow (fla missing, causal_conv1d missing); 2 full_attention: fast"
    )


def test_the_kernel_trials_call_what_transformers_resolved():
    """The tiny calls the preflight makes on a GPU, made here on the CPU against the
    functions transformers resolved (its torch fallbacks, same signatures): the arguments
    are the ones its Gated DeltaNet forward passes."""
    found, _how = resolved_kernels(modeling_module("qwen3_5_text"))
    tried = {r.func: try_kernel(r, "cpu") for r in found}
    assert tried["chunk_gated_delta_rule"] == "" and tried["causal_conv1d_fn"] == ""


def test_a_broken_config_is_the_records_error_not_a_crash(tmp_path):
    (tmp_path / "config.json").write_text("[1, 2")
    pf = run_preflight(tmp_path, "cuda:0")
    assert pf.error.startswith("JSONDecodeError") and pf.layers == []


def test_the_driver_comes_from_nvml(monkeypatch, tmp_path):
    state = tmp_path / "nvml.json"
    state.write_text(json.dumps({"driver": "550.127.05", "devices": []}))
    monkeypatch.setenv("FAKE_NVML_STATE", str(state))
    monkeypatch.syspath_prepend(str(FAKE_NVML))
    monkeypatch.delitem(sys.modules, "pynvml", raising=False)
    assert nvidia_driver() == "550.127.05"
    monkeypatch.delenv("FAKE_NVML_STATE")
    assert nvidia_driver() is None  # no driver loaded: none, not an error
    env = environment()
    assert env.torch and env.transformers and env.python and env.host
    assert env.fast_kernels == {"fla": MISSING, "causal_conv1d": MISSING}


def test_a_real_cpu_run_writes_the_preflight_and_environment(tmp_path):
    r = subprocess.run(
        [sys.executable, "-m", "trainer", "--config", str(TINY), "--run-root", str(tmp_path),
         "--max-steps", "2", "--set", "runtime.wandb_mode=disabled"],
        capture_output=True, text=True, timeout=240, cwd=ROOT,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    (run_dir,) = [p for p in tmp_path.iterdir() if p.is_dir()]
    config = read_config(run_dir)
    assert isinstance(config, dict)
    env = read_environment(config)
    assert env is not None and env.torch.startswith("2.") and env.cuda is None
    assert env.gpu_count == 0 and env.fast_kernels["fla"] == MISSING
    pre = config["run"]["preflight"]
    assert pre["device"] == "cpu" and pre["model_type"] == "qwen3"
    assert [(lp["layer_type"], lp["path"]) for lp in pre["layers"]] == [("full_attention", "torch")]
    assert pre["seconds"] < 1.0
    hb = parse_heartbeat(json.loads((run_dir / "heartbeat.json").read_text()))
    assert isinstance(hb, Heartbeat) and hb.preflight is not None
    assert hb.preflight.layers[0].why == "cpu: torch path"
    # The resumed run's config reader ignores the new keys under "run".
    from trainer.config import config_from_dict

    config_from_dict(config)

"""GPU health: the agent's NVML sampler on the stand-in NVML (tests/infra/fake_nvml, the real
sampler code), the boundary that drops a bad reading and keeps the sample, the rules
`gpu_throttled` and `gpu_ecc_errors`, and the GPU pane's clock cell.

The rule tests edit the recorded 8-GPU scenario tests/fixtures/scenarios/healthy_gpu.jsonl in
its `gpu` events only (its three samples, now-21, now-11, now-1): each edit below adds the
health readings an NVML agent sends (SM clock, max clock, clock event reasons, volatile
uncorrected ECC count, power limit) to chosen GPUs and samples. Nothing else is changed. The
file itself was recorded before the agent sent these readings; the numbers are an H200's
(1980 MHz max SM clock, 700 W limit) and the drafter capped at 1.70 GHz of the issue."""

from __future__ import annotations

import io
import json
import math
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from infra.fixtures import FakeGpu
from monitor_helpers import Remote
from rich.console import Console
from test_diagnosis import NOW, Events, codes, events, of_type, only, run, store
from test_infra import load_fake_pynvml

from dflash_tui.agent.gpus import Gpus
from dflash_tui.diagnosis import DiagnosisConfig, diagnose
from dflash_tui.targets import Target
from dflash_tui.widgets.gpus import GpuPane
from trainer.contract.protocol import (
    CLOCK_APP_SETTING,
    CLOCK_HW_SLOWDOWN,
    CLOCK_HW_THERMAL,
    CLOCK_IDLE,
    CLOCK_POWER_CAP,
    GpuSample,
    decode_event,
)
from trainer.contract.typed import Unreadable, encode

H200_MAX = 1980
HEALTHY = {
    "sm_clock_mhz": H200_MAX,
    "sm_clock_max_mhz": H200_MAX,
    "clock_reasons": 0,
    "ecc_uncorrected": 0,
    "power_limit_w": 700.0,
}


# -- the sampler on the stand-in NVML -------------------------------------------------------
@pytest.fixture
def nvml(fake_nvml_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    """The stand-in as the `pynvml` the sampler imports (the real one needs a driver)."""
    module = load_fake_pynvml(fake_nvml_path)
    monkeypatch.setitem(sys.modules, "pynvml", module)
    return module


def sampler(gpu: FakeGpu, monkeypatch: pytest.MonkeyPatch) -> Gpus:
    monkeypatch.setenv("FAKE_NVML_STATE", str(gpu.state_path))
    g = Gpus()
    assert g.backend == "nvml", g.reason
    return g


def test_the_sampler_reads_clocks_reasons_ecc_and_the_power_limit(
    nvml: Any, fake_gpu: Callable[..., tuple[Path, FakeGpu]], monkeypatch: pytest.MonkeyPatch
) -> None:
    _, gpu = fake_gpu(devices=2)
    capped = nvml.nvmlClocksEventReasonSwPowerCap | nvml.nvmlClocksEventReasonSyncBoost
    gpu.set_device(0, sm_clock_mhz=1700, clocks_event_reasons=capped, power_limit_w=650.0)
    gpu.set_device(1, ecc_uncorrected=3, ecc_corrected=40, temp_c=88)
    devs = sampler(gpu, monkeypatch).sample()
    got = [
        (d.sm_clock_mhz, d.sm_clock_max_mhz, d.clock_reasons, d.ecc_uncorrected, d.power_limit_w)
        for d in devs
    ]
    assert got == [(1700, 1980, CLOCK_POWER_CAP | 0x10, 0, 650.0), (1980, 1980, 0, 3, 700.0)]
    assert devs[1].temp_c == 88 and devs[0].power_w == 75.0  # the readings it had before


def test_an_unsupported_reading_is_none_and_the_rest_of_the_sample_stays(
    nvml: Any, fake_gpu: Callable[..., tuple[Path, FakeGpu]], monkeypatch: pytest.MonkeyPatch
) -> None:
    _, gpu = fake_gpu(devices=2)
    # GPU 0: ECC off and no power limit reading; GPU 1: every health call NOT_SUPPORTED.
    gpu.set_device(
        0, unsupported=["nvmlDeviceGetTotalEccErrors", "nvmlDeviceGetEnforcedPowerLimit"]
    )
    every = [
        "nvmlDeviceGetClockInfo",
        "nvmlDeviceGetMaxClockInfo",
        "nvmlDeviceGetCurrentClocksEventReasons",
        "nvmlDeviceGetCurrentClocksThrottleReasons",
        "nvmlDeviceGetTotalEccErrors",
        "nvmlDeviceGetEnforcedPowerLimit",
    ]
    gpu.set_device(1, unsupported=every, util=97)
    g = sampler(gpu, monkeypatch)
    d0, d1 = g.sample()
    assert (d0.ecc_uncorrected, d0.power_limit_w, d0.sm_clock_mhz) == (None, None, 1980)
    health = (d1.sm_clock_mhz, d1.sm_clock_max_mhz, d1.clock_reasons, d1.ecc_uncorrected)
    assert health == (None, None, None, None) and d1.power_limit_w is None
    assert (d1.util, d1.name, d1.mem_total) == (97, "NVIDIA H200", d0.mem_total)
    # the sample still crosses the boundary whole
    sample = decode_event(
        json.loads(json.dumps(GpuSample(backend="nvml", devices=[d0, d1]).to_json()))
    )
    assert isinstance(sample, GpuSample) and [d.util for d in sample.devices] == [0, 97]


def test_an_older_driver_without_the_event_reasons_name_is_read_by_the_throttle_name(
    nvml: Any, fake_gpu: Callable[..., tuple[Path, FakeGpu]], monkeypatch: pytest.MonkeyPatch
) -> None:
    _, gpu = fake_gpu(devices=1)
    gpu.set_device(
        0,
        missing=["nvmlDeviceGetCurrentClocksEventReasons"],  # drivers before 535
        clocks_event_reasons=nvml.nvmlClocksThrottleReasonHwSlowdown,
    )
    (d,) = sampler(gpu, monkeypatch).sample()
    assert d.clock_reasons == CLOCK_HW_SLOWDOWN
    # and a pynvml too old to have either function: None, not an error
    monkeypatch.delattr(nvml, "nvmlDeviceGetCurrentClocksThrottleReasons")
    (d,) = sampler(gpu, monkeypatch).sample()
    assert d.clock_reasons is None and d.sm_clock_mhz == 1980


def test_the_added_cost_per_sample(
    nvml: Any, fake_gpu: Callable[..., tuple[Path, FakeGpu]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Five NVML calls per device more. On the stand-in each call re-reads its JSON state
    file, so its time is the file's, not NVML's (~0.02 ms a call on an H200): the number
    printed is an upper bound of the stand-in, the test only keeps it from growing wild."""
    _, gpu = fake_gpu(devices=8)
    g = sampler(gpu, monkeypatch)
    calls = 0
    real = nvml._device

    def counted(handle: Any) -> Any:
        nonlocal calls
        calls += 1
        return real(handle)

    monkeypatch.setattr(nvml, "_device", counted)
    g.sample()
    with_health = calls
    health = g._health
    monkeypatch.setattr(g, "_health", lambda h, dev: None)
    calls = 0
    g.sample()
    assert with_health - calls == 5 * 8  # five readings a device
    monkeypatch.setattr(nvml, "_device", real)

    def per_sample(n: int = 50) -> float:
        t0 = time.perf_counter()
        for _ in range(n):
            g.sample()
        return (time.perf_counter() - t0) / n

    without = per_sample()
    monkeypatch.setattr(g, "_health", health)
    added = per_sample() - without
    print(f"stand-in, 8 GPUs: {without * 1e3:.2f} ms a sample, +{added * 1e3:.2f} ms health")
    assert added < 0.5  # s: 40 reads of a small JSON file take a few ms


def test_health_readings_reach_the_store_through_the_local_agent(
    remote_factory: Callable[..., Remote],
    local_target: Target,
    fake_gpu: Callable[..., tuple[Path, FakeGpu]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The whole path: the agent process samples the stand-in, the link decodes the event."""
    _, gpu = fake_gpu(devices=2)
    gpu.set_device(1, sm_clock_mhz=1410, clocks_event_reasons=0x40, ecc_uncorrected=2, temp_c=91)
    for k, v in gpu.env.items():
        monkeypatch.setenv(k, v)
    r = remote_factory(local_target, follow=None)
    r.wait(lambda s: s.gpu is not None and len(s.gpu.devices) == 2, 30, "GPU samples")
    assert r.store.hello is not None and r.store.hello.gpu_backend == "nvml"
    d = r.store.gpu.devices[1]
    assert (d.sm_clock_mhz, d.sm_clock_max_mhz, d.clock_reasons) == (1410, 1980, CLOCK_HW_THERMAL)
    assert (d.ecc_uncorrected, d.power_limit_w, d.temp_c) == (2, 700.0, 91)
    assert r.store.to_json()["gpus"][1]["clock_reasons"] == ["hw thermal"]


# -- the boundary ----------------------------------------------------------------------------
def gpu_event(**health: Any) -> dict[str, Any]:
    dev = {"index": 0, "uuid": "GPU-0", "name": "NVIDIA H200", "mem_used": 1, "mem_total": 2}
    return {"type": "gpu", "t": NOW, "backend": "nvml", "devices": [{**dev, "util": 90, **health}]}


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("sm_clock_mhz", "1980"),
        ("sm_clock_mhz", True),
        ("sm_clock_mhz", -5),
        ("sm_clock_mhz", 1980.5),
        ("sm_clock_max_mhz", 10**9),
        ("clock_reasons", 1 << 64),
        ("clock_reasons", -1),
        ("clock_reasons", [4]),
        ("ecc_uncorrected", -3),
        ("ecc_uncorrected", 10**400),
        ("power_limit_w", 10**400),
        ("ecc_uncorrected", {"n": 1}),
        ("power_limit_w", math.nan),
        ("power_limit_w", math.inf),
        ("power_limit_w", -700.0),
        ("power_limit_w", 1e9),
        ("power_limit_w", "700 W"),
    ],
)
def test_a_bad_health_reading_is_dropped_not_the_sample(field: str, value: Any) -> None:
    good = {**HEALTHY, field: value}
    line = json.dumps(gpu_event(**good))  # NaN and Infinity as Python's json writes them
    e = decode_event(json.loads(line))
    assert isinstance(e, GpuSample), e
    (d,) = e.devices
    assert getattr(d, field) is None
    kept = {k: v for k, v in HEALTHY.items() if k != field}
    assert {k: getattr(d, k) for k in kept} == kept and d.util == 90


def test_the_boundary_keeps_good_readings_and_still_refuses_a_broken_sample() -> None:
    e = decode_event(gpu_event(**{**HEALTHY, "power_limit_w": 700}))
    assert isinstance(e, GpuSample) and encode(e.devices[0])["power_limit_w"] == 700.0
    assert isinstance(decode_event({**gpu_event(), "devices": ["x"]}), Unreadable)
    assert isinstance(decode_event({**gpu_event(), "devices": 3}), Unreadable)
    s = store([gpu_event(clock_reasons="lots")])
    assert s.malformed == 0 and s.gpu is not None and s.gpu.devices[0].clock_reasons is None


# -- the rules -------------------------------------------------------------------------------
def health(*, samples: tuple[int, ...] = (0, 1, 2), **by_gpu: dict[str, Any]) -> Any:
    """Every GPU healthy in every sample, then `gpu6={"sm_clock_mhz": 1700}` in `samples`
    (0, 1, 2: the scenario's gpu events now-21, now-11, now-1)."""

    def edit(evs: Events) -> None:
        for n, g in enumerate(of_type(evs, "gpu")):
            for d in g["devices"]:
                d.update(HEALTHY)
                if n in samples:
                    d.update(by_gpu.get(f"gpu{d['index']}", {}))

    return edit


def every_gpu(**fields: Any) -> dict[str, dict[str, Any]]:
    return {f"gpu{i}": fields for i in range(8)}


CAP = {"clock_reasons": CLOCK_POWER_CAP}


def test_healthy_gpus_say_nothing() -> None:
    assert run("healthy_gpu.jsonl", health()) == []
    # idle and power-capped in one sample of three, an old ECC count that does not rise
    once = health(samples=(1,), **every_gpu(clock_reasons=CLOCK_IDLE | CLOCK_POWER_CAP))
    assert run("healthy_gpu.jsonl", once) == []
    assert run("healthy_gpu.jsonl", health(**every_gpu(ecc_uncorrected=4))) == []


def test_every_gpu_power_capped_at_its_peers_clock_is_context() -> None:
    f = only(
        run("healthy_gpu.jsonl", health(**every_gpu(sm_clock_mhz=1890, **CAP))), "gpu_throttled"
    )
    assert f.severity == "info"
    assert f.title == "GPU 0, 1, 2, 3, 4, 5, 6, 7 power-capped"
    assert "power cap in 100%+" in f.evidence and "5 1.89 of 1.98 GHz" in f.evidence
    assert "normal under sustained load" in f.evidence


def test_a_drafter_power_capped_below_its_peer_is_a_warning() -> None:
    slow = {"sm_clock_mhz": 1700, "clock_reasons": CLOCK_POWER_CAP, "power_limit_w": 600.0}
    f = only(run("healthy_gpu.jsonl", health(gpu6=slow)), "gpu_throttled")
    assert f.severity == "warning"
    assert f.title == "GPU 6 power-capped below its peers: 1.70 of 1.98 GHz"
    assert f.evidence == (
        "GPU 6 (drafter) 1.70 of 1.98 GHz, power cap in 100% of 3 samples over 20s, "
        "limit 600 W (peers' 700 W); its drafter peers (GPU 5, 7) run at 1.98 GHz"
    )
    assert "nvidia-smi -i 6 -pl" in f.action
    # within 10% of its peers (1.80 of 1.98 is 9% below): only the cap, which is context
    near = {**slow, "sm_clock_mhz": 1800}
    assert codes(run("healthy_gpu.jsonl", health(gpu6=near))) == ["gpu_throttled"]
    assert only(run("healthy_gpu.jsonl", health(gpu6=near)), "gpu_throttled").severity == "info"
    # clocks set lower by hand (application clocks, locked clocks) below its peers
    locked = {"sm_clock_mhz": 1700, "clock_reasons": CLOCK_APP_SETTING}
    f = only(run("healthy_gpu.jsonl", health(gpu6=locked)), "gpu_throttled")
    assert f.severity == "warning" and f.title == "GPU 6 clocked below its peers: 1.70 of 1.98 GHz"
    assert f.evidence.startswith("GPU 6 (drafter) 1.70 of 1.98 GHz, app clocks in 100% of 3")
    assert "-rgc" in f.action
    # slower but not throttled by any reason NVML names: nothing to say about clocks
    assert run("healthy_gpu.jsonl", health(gpu6={"sm_clock_mhz": 1700})) == []

    # a peer idling at a low clock in most samples: idle samples do not say how fast it runs
    def gpu5_idles(evs: Events) -> None:
        for g in of_type(evs, "gpu")[:2]:
            g["devices"][5].update(sm_clock_mhz=345, clock_reasons=CLOCK_IDLE)

    f = only(run("healthy_gpu.jsonl", health(gpu6=slow), gpu5_idles), "gpu_throttled")
    assert f.severity == "warning" and "peers (GPU 5, 7) run at 1.98 GHz" in f.evidence


def test_thermal_slowdown_for_most_samples_is_a_warning() -> None:
    hot = {"sm_clock_mhz": 1410, "clock_reasons": CLOCK_HW_THERMAL, "temp_c": 91}
    f = only(run("healthy_gpu.jsonl", health(samples=(1, 2), gpu2=hot)), "gpu_throttled")
    assert f.severity == "warning" and f.title == "GPU 2 throttled: hw thermal"
    assert f.evidence.startswith("GPU 2 (target) 1.41 of 1.98 GHz, hw thermal in 67% of 3 samples")
    # GPU 4 (prefetch+target) holds a target too: a peer
    assert ", 91C; its target peers (GPU 0, 1, 3, 4) run at 1.98 GHz" in f.evidence
    assert "cooling" in f.action
    # one sample of three is a spike, not sustained
    assert run("healthy_gpu.jsonl", health(samples=(2,), gpu2=hot)) == []
    # a HW slowdown (no thermal reason) points at the board and its power
    hw = {"clock_reasons": CLOCK_HW_SLOWDOWN}
    f = only(run("healthy_gpu.jsonl", health(gpu5=hw)), "gpu_throttled")
    assert f.title == "GPU 5 throttled: hw slowdown" and "power supply" in f.action


def test_throttling_outside_training_says_nothing() -> None:
    hot = every_gpu(clock_reasons=CLOCK_HW_THERMAL)
    evs = events("healthy_gpu.jsonl")
    health(**hot)(evs)
    of_type(evs, "heartbeat")[-1]["data"]["phase"] = "checkpointing"
    assert "gpu_throttled" not in codes(diagnose(store(evs), NOW))
    # and the window: samples older than throttle_window_s are not looked at
    narrow = DiagnosisConfig(throttle_window_s=15.0)  # two samples: fewer than 3
    assert run("healthy_gpu.jsonl", health(**hot), config=narrow) == []


def test_uncorrected_ecc_errors_rising_during_the_run_are_critical() -> None:
    f = only(
        run("healthy_gpu.jsonl", health(samples=(2,), gpu5={"ecc_uncorrected": 2})),
        "gpu_ecc_errors",
    )
    assert f.severity == "critical" and f.title == "GPU 5: uncorrected memory errors"
    assert f.evidence == (
        "GPU 5 (drafter): +2 uncorrected ECC errors during the run (0 -> 2 over 20s of "
        "samples, NVML's volatile count)"
    )
    assert "without GPU 5" in f.action
    # a count reset by a driver reload (5, then 0) is no new error
    reset = health(samples=(0,), gpu5={"ecc_uncorrected": 5})
    assert run("healthy_gpu.jsonl", reset) == []
    # errors before the run started are not the run's
    evs = events("healthy_gpu.jsonl")
    health(samples=(2,), gpu5={"ecc_uncorrected": 2})(evs)
    of_type(evs, "heartbeat")[-1]["data"]["started_at"] = NOW - 5  # after the rise
    assert "gpu_ecc_errors" not in codes(diagnose(store(evs), NOW))


# -- the pane --------------------------------------------------------------------------------
def pane_text(evs: Events) -> str:
    pane = GpuPane()
    pane.update_from(store(evs))
    console = Console(width=158, record=True, file=io.StringIO(), color_system=None)
    console.print(pane.content)
    return console.export_text()


def test_the_gpu_pane_shows_the_clock_and_its_most_serious_reason() -> None:
    plain = pane_text(events("healthy_gpu.jsonl"))
    assert "1.98G" not in plain  # no readings (nvidia-smi, an older agent): no column
    evs = events("healthy_gpu.jsonl")
    slow = {"sm_clock_mhz": 1700, "clock_reasons": CLOCK_POWER_CAP | CLOCK_HW_THERMAL}
    health(gpu6=slow, gpu7={"ecc_uncorrected": 1}, gpu5=CAP)(evs)
    rows = {ln.split()[0]: ln for ln in pane_text(evs).splitlines() if ln[:1].isdigit()}
    assert " 1.70G thm " in rows["6"]
    assert " 1.98G pwr " in rows["5"]
    assert " 1.98G ECC1 " in rows["7"]
    assert " 1.98G " in rows["0"] and "pwr" not in rows["0"]

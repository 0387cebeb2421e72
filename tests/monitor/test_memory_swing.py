"""`memory_swing`: a GPU's used memory falling by GBs and coming back while the run trains,
the finding and the GPU pane's mark.

The rule tests edit the recorded 8-GPU scenario tests/fixtures/scenarios/healthy_gpu.jsonl in
its `gpu` events only (its three samples, now-21, now-11, now-1): GPU 5 (a drafter, 80,900
MiB in every sample) is given less memory in the middle sample, as a GPU whose allocator
gave memory back and took it again would show. Nothing else is changed."""

from __future__ import annotations

import io

from rich.console import Console
from test_diagnosis import NOW, Events, codes, events, of_type, only, run, store

from dflash_tui.diagnosis import DiagnosisConfig
from dflash_tui.memory_swing import memory_swing
from dflash_tui.widgets.gpus import GpuPane

MIB = 1 << 20
GIB = 1 << 30


def dip(gpu: int, sample: int, mib: int):
    """GPU `gpu` holds `mib` in gpu sample number `sample` (0: now-21, 1: now-11, 2: now-1)."""

    def edit(evs: Events) -> None:
        g = of_type(evs, "gpu")[sample]
        for d in g["devices"]:
            if d["index"] == gpu:
                d["mem_used"] = mib * MIB

    return edit


def test_the_largest_drawdown_not_a_rise():
    assert memory_swing([(0, 10), (1, 20), (2, 30)]).fall == 0  # warm-up: a rise
    sw = memory_swing([(0, 50), (1, 20), (2, 50), (3, 35), (4, 60), (5, 58)], min_fall=10)
    assert (sw.fall, sw.peak, sw.trough) == (30, 50, 20)
    assert sw.drops == 2 and sw.span_s == 5  # 50→20 and 50→35; 60→58 is under the bar
    assert memory_swing([(0, 1)]) is None


def test_healthy_recordings_stay_quiet():
    assert "memory_swing" not in codes(run("healthy_gpu.jsonl"))
    assert "memory_swing" not in codes(run("recorded/healthy_h200.jsonl"))


def test_a_drafter_gpu_that_gives_memory_back_and_takes_it_again():
    f = only(run("healthy_gpu.jsonl", dip(5, 1, 70_000)), "memory_swing")
    assert f.severity == "warning" and "GPU 5" in f.title
    assert "GPU 5 (drafter" in f.evidence and "−10.6 GB" in f.evidence, f.evidence
    assert "1 fall(s)" in f.evidence and "empty_cache" in f.action
    # under the threshold: quiet; a lower threshold names it
    small = dip(5, 1, 79_500)  # 1.4 GB down
    assert "memory_swing" not in codes(run("healthy_gpu.jsonl", small))
    low = DiagnosisConfig(swing_min_bytes=GIB)
    assert "memory_swing" in codes(run("healthy_gpu.jsonl", small, config=low))
    # a fall that has not come back yet is a fall all the same (the middle sample's peak)
    assert "memory_swing" in codes(run("healthy_gpu.jsonl", dip(5, 2, 70_000)))


def test_the_gpu_pane_marks_the_swinging_gpu():
    evs = events("healthy_gpu.jsonl")
    dip(5, 1, 70_000)(evs)
    pane = GpuPane()
    pane.update_from(store(evs, NOW))
    console = Console(width=158, record=True, file=io.StringIO(), color_system=None)
    console.print(pane.content)
    rows = {ln.split()[0]: ln for ln in console.export_text().splitlines() if ln[:1].isdigit()}
    assert "↕10.6G" in rows["5"], rows["5"]
    assert "↕" not in rows["4"] and "exp" not in rows["5"]

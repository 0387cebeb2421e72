"""runtime.routing (issue 33 A1) on the real trainer: "shared" trains past a hung target and
resumes at the lowest batch not yet trained, saying how many it trains again; the
replicas' gradients are averaged weighted by each batch's real tokens; bad values are
one line, exit 2, before any run dir."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / "trainer" / "configs" / "tiny-cpu.toml"
SHARED = ("--set", "runtime.routing=shared", "--set", "train.log_every=1")
D = 2  # the tiny config's drafter replicas


def _refused(tmp_path: Path, *sets: str) -> str:
    cmd = [sys.executable, "-m", "trainer", "--config", str(TINY), "--run-root", str(tmp_path)]
    for s in sets:
        cmd += ["--set", s]
    r = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=120, check=False)
    assert r.returncode == 2, r.stderr
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "Traceback" not in r.stderr, r.stderr
    assert list(tmp_path.iterdir()) == []  # refused before any run dir, so before any model
    return lines[0]


def test_a_routing_that_is_not_one_of_the_three_is_one_line_exit_2(tmp_path):
    line = _refused(tmp_path, "runtime.routing=round-robin")
    assert (
        line
        == 'error: config: runtime.routing = "round-robin": expected one of fixed, shared, node'
    )


def test_shared_routing_in_processes_mode_is_one_line_exit_2(tmp_path):
    line = _refused(tmp_path, "runtime.routing=shared", "runtime.mode=processes")
    assert line == (
        'error: config: runtime.routing = "shared": threads mode only (runtime.mode ='
        ' "processes" routes batches to fixed ranks); set runtime.routing = "fixed"'
    )


def _positions(run_dir: Path) -> dict[int, dict]:
    """Each checkpoint's position; `ahead` is stored only when not 0 (an older trainer
    reads a fixed run's checkpoint)."""
    out = {}
    for p in sorted((run_dir / "checkpoints").glob("step-*.pt")):
        pos = torch.load(p, weights_only=False)["position"]
        out[int(p.stem.split("-")[1])] = {"ahead": 0, **pos}
    return out


def test_shared_trains_past_a_hung_target_and_resumes_at_the_lowest_untrained_batch(
    start_trainer, tmp_path
):
    """target-1 hangs inside its forward of its 2nd batch (the batch it holds is never
    trained): under shared routing target-0 feeds both replicas on, so the run keeps
    stepping (fixed would wait for target-1 for ever). Every checkpoint's position is the
    lowest batch not yet trained (from the hang on, the held one), the batches trained
    beyond it counted (`ahead`), and batches + ahead is
    every batch trained (steps × D). The resume starts there, says how many it trains
    again, and finishes."""
    cut = start_trainer(
        *SHARED,
        "--max-steps",
        "400",
        "--set",
        "train.checkpoint_every=3",
        env={"DFLASH_FAULT": "hang:target-1:1"},
        root=tmp_path / "cut",
    )
    cut.wait_step(12, timeout=240)
    cut.signal(signal.SIGTERM)
    assert cut.wait(timeout=120) == 0, cut.read("train.log")[-3000:]
    hb = cut.heartbeat()
    assert hb["phase"] == "stopped"
    assert hb["queues"]["routing"] == "shared"
    assert len(hb["queues"]["q_pre"]) == 1 and len(hb["queues"]["q_hs"]) == 1
    positions = _positions(cut.run_dir)
    assert len(positions) >= 4, positions
    # The lowest batch never trained only moves on: on a loaded host target-1's first batch
    # may itself take a few steps before its second, the one it hangs in, is held for ever.
    held = [p["batches"] for _, p in sorted(positions.items())]
    assert held == sorted(held), positions
    assert held[-1] == held[-2], positions  # the hung target's batch, still not trained
    for step, p in positions.items():
        assert p["step"] == step
        assert p["batches"] + p["ahead"] == step * D, p  # every batch trained, counted once
        assert p["ahead"] > 0, p
    last_step = max(positions)
    last = positions[last_step]

    resumed = start_trainer(
        "--resume", str(cut.run_dir), "--max-steps", str(last_step + 4), root=tmp_path / "res"
    )
    assert resumed.wait(timeout=180) == 0, resumed.read("train.log")[-3000:]
    said = re.search(r"resumed from .* at step (\d+); (\d+) batch\(es\) trained out of order "
                     r"beyond batch (\d+) \(runtime.routing = \"shared\"\) are trained again",
                     resumed.read("train.log"))  # fmt: skip
    assert said is not None, resumed.read("train.log")[-3000:]
    assert [int(x) for x in said.groups()] == [last_step, last["ahead"], last["batches"]]
    end = _positions(resumed.run_dir)[last_step + 4]
    # No hang now: both targets feed the replicas again; the held batch is trained at last.
    assert end["batches"] > last["batches"]
    assert end["batches"] + end["ahead"] == last["batches"] + 4 * D
    steps = [m["step"] for m in resumed.metrics()]
    assert steps == list(range(last_step + 1, last_step + 5))


def test_replica_gradients_are_averaged_weighted_by_real_tokens(tiny_target_dir, tmp_path):
    """Two replicas on two batches of different real tokens against one replica computing
    each batch's gradient alone: replica 0's gradient after `average_grads` is
    Σ tokens_b ∇L_b / Σ tokens_b of the single-replica gradients, not their plain mean."""
    from trainer.config import load_config
    from trainer.model.checkpoint import TrainPosition
    from trainer.model.step import drafter_loss
    from trainer.reporting.runstate import RunState
    from trainer.reporting.steplog import RunLog
    from trainer.runtime.pipeline import Pipeline
    from trainer.runtime.setup import build_run

    cfg = load_config(TINY, ["runtime.wandb_mode=disabled"])
    state = RunState("weights")
    run = build_run(cfg, warn=lambda _m: None, phase=state.set_phase, progress=state.progress)
    run.finish_loading()
    pipe = Pipeline(run, state, RunLog(tmp_path, echo=False), TrainPosition(0, 0, 0), print)
    dev = run.drafter_devices[0]
    features_of = run.targets[run.target_devices[0]].features
    batches = []
    for g in range(40):  # two batches whose real tokens differ clearly
        blocks = pipe.make_batch(g)
        if not batches or abs(blocks.tokens - batches[0].tokens) > 0.2 * batches[0].tokens:
            batches.append(blocks)
        if len(batches) == 2:
            break
    assert len(batches) == 2
    tokens = [b.tokens for b in batches]
    feats = []
    with torch.no_grad():  # as the target thread calls it (trainer/runtime/pipeline.py)
        for blocks in batches:
            b = blocks.batch
            if b.position_ids is None:
                feats.append(features_of(b.input_ids))
            else:
                docs = features_of.packed_docs(b.position_ids, dev)
                feats.append(features_of(b.input_ids, b.position_ids, docs))

    replicas = run.replicas
    primary, other = replicas.models
    alone = []
    for blocks, f in zip(batches, feats, strict=True):
        replicas.zero_grads()
        drafter_loss(primary, blocks, f, run.settings).loss.backward()
        alone.append([p.grad.clone() for p in primary.parameters() if p.requires_grad])
    replicas.zero_grads()
    for model, blocks, f in zip((primary, other), batches, feats, strict=True):
        drafter_loss(model, blocks, f, run.settings).loss.backward()
    replicas.average_grads(tokens)
    got = [p.grad for p in primary.parameters() if p.requires_grad]
    total = sum(tokens)
    weighted = [(tokens[0] * a + tokens[1] * b) / total for a, b in zip(*alone, strict=True)]
    plain = [(a + b) / 2 for a, b in zip(*alone, strict=True)]
    for g_, w in zip(got, weighted, strict=True):
        torch.testing.assert_close(g_, w, rtol=1e-5, atol=1e-7)
    # The weighting matters on these batches: the plain mean is measurably elsewhere.
    apart = max(float((w - p).abs().max()) for w, p in zip(weighted, plain, strict=True))
    assert apart > 1e-4, apart
    assert dev.type == "cpu"

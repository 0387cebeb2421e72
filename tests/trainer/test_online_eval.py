"""Held-out τ during training, as an operator runs it: real CPU runs of the trainer with
`eval.every`, against the tiny target that has learned to chat (its answers follow the data's
patterns, so a drafter's τ against it moves), and the verifying target built around the
truncated one checked against the checkpoint loaded whole."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from test_trainer_cli import TINY, only_run_dir, run_trainer

from trainer.contract.heartbeat import Heartbeat, read_heartbeat
from trainer.contract.records import MetricsRow, parse_metrics_line

# The tiny target that has learned to chat, and the drafter's data: its own answers.
CHAT = (
    "--set",
    "target.path=builtin:tiny-qwen3-chat",
    "--set",
    "data.path=builtin:tiny-chat-answers",
)


@pytest.mark.parametrize("builtin", ["builtin:tiny-qwen3", "builtin:tiny-qwen3.5"])
def test_the_verifying_target_is_the_checkpoint_and_shares_the_training_tensors(
    builtin, dflash_cache_dir
):
    from transformers import AutoModelForCausalLM

    from trainer.builtins.resolve import resolve_target_path
    from trainer.targets.load import load_target
    from trainer.targets.whole import whole_target

    path = resolve_target_path(builtin)
    loaded = load_target(path, [1, 4], torch.float32, torch.device("cpu"))  # 5 of 8 layers
    whole = whole_target(loaded, torch.float32, torch.device("cpu"))
    reference = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    vocab = loaded.info.vocab_size
    ids = torch.randint(0, vocab - 8, (2, 48), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        got = whole(input_ids=ids, output_hidden_states=True, use_cache=False)
        want = reference(input_ids=ids, output_hidden_states=True, use_cache=False)
    torch.testing.assert_close(got.logits, want.logits, rtol=0, atol=1e-5)
    assert len(got.hidden_states) == len(want.hidden_states) == 9
    # The training target's modules are the verifying target's own: no second copy.
    trunc = loaded.model.model
    assert len(trunc.layers) == 5 and len(whole.model.layers) == 8
    assert all(whole.model.layers[i] is trunc.layers[i] for i in range(5))
    assert whole.model.embed_tokens is trunc.embed_tokens and whole.lm_head is loaded.model.lm_head


def test_building_the_verifying_target_never_sets_the_default_dtype(dflash_cache_dir, monkeypatch):
    """The eval thread builds it while the target thread runs: a compiled target layer is
    guarded on the process's default dtype, so the build must not switch it, even for a
    moment (it did through HF's from_config(dtype=...): 4 recompiles on the H200)."""
    from trainer.builtins.resolve import resolve_target_path
    from trainer.targets.load import load_target
    from trainer.targets.whole import whole_target

    path = resolve_target_path("builtin:tiny-qwen3")
    loaded = load_target(path, [1, 4], torch.bfloat16, torch.device("cpu"))
    seen: list[torch.dtype] = []
    real = torch.set_default_dtype
    monkeypatch.setattr(torch, "set_default_dtype", lambda d: (seen.append(d), real(d))[1])
    whole = whole_target(loaded, torch.bfloat16, torch.device("cpu"))
    assert seen == []
    assert {p.dtype for p in whole.parameters()} == {torch.bfloat16}


def test_the_verifying_target_reads_a_sharded_checkpoint(tmp_path, dflash_cache_dir):
    """Big targets are saved in shards with an index (the 27B one is 56 GB): the dropped
    layers are found in whichever shard holds them."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from trainer.builtins.resolve import resolve_target_path
    from trainer.targets.load import load_target
    from trainer.targets.whole import whole_target

    source = resolve_target_path("builtin:tiny-qwen3")
    model = AutoModelForCausalLM.from_pretrained(source, dtype=torch.float32)
    sharded = tmp_path / "sharded"
    model.save_pretrained(sharded, max_shard_size="300KB")
    AutoTokenizer.from_pretrained(source).save_pretrained(sharded)
    assert (sharded / "model.safetensors.index.json").is_file()
    assert len(list(sharded.glob("*.safetensors"))) > 3
    loaded = load_target(sharded, [2], torch.float32, torch.device("cpu"))  # 3 of 8 layers
    whole = whole_target(loaded, torch.float32, torch.device("cpu"))
    ids = torch.arange(5, 45)[None]
    with torch.no_grad():
        got = whole(input_ids=ids, use_cache=False).logits
        want = model.eval()(input_ids=ids, use_cache=False).logits
    torch.testing.assert_close(got, want, rtol=0, atol=1e-5)


def test_a_checkpoint_cut_to_the_trained_layers_is_refused_by_name(tmp_path, dflash_cache_dir):
    """A target saved with only the layers training reads (the first 8B bench target was)
    cannot verify: the eval names the missing layer instead of running on random weights."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from trainer.builtins.resolve import resolve_target_path
    from trainer.targets.load import load_target
    from trainer.targets.whole import whole_target

    source = resolve_target_path("builtin:tiny-qwen3")
    model = AutoModelForCausalLM.from_pretrained(source, dtype=torch.float32)
    model.model.layers = model.model.layers[:5]  # the config still says 8
    cut = tmp_path / "cut"
    model.save_pretrained(cut)
    AutoTokenizer.from_pretrained(source).save_pretrained(cut)
    loaded = load_target(cut, [1, 4], torch.float32, torch.device("cpu"))  # trains fine
    with pytest.raises(ValueError, match=r"layer 5 of 8 is not in its \.safetensors files"):
        whole_target(loaded, torch.float32, torch.device("cpu"))


# Serial: its fixture trains the chat target (~1.5 min alone on two cores; beside the other
# tests' trainers it took over 5).
@pytest.mark.serial
def test_online_eval_is_the_offline_eval_of_the_same_step_and_tau_rises(tmp_path, tiny_chat_ready):
    root = tmp_path / "runs"
    r = run_trainer(
        "--config", str(TINY), "--run-root", str(root), "--max-steps", "60",
        *CHAT, "--set", "data.held_out=16", "--set", "eval.every=30",
        "--set", "eval.prompts=3", "--set", "eval.new_tokens=24", "--set", "eval.tree_nodes=16",
        "--set", "train.checkpoint_every=30", timeout=400,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    run = only_run_dir(root)
    log = (run / "train.log").read_text()
    online = {s: json.loads((run / "eval" / f"step-{s:08d}.json").read_text()) for s in (30, 60)}
    assert f"eval: step 30: held-out τ {online[30]['tau']:.2f} of 16 over 3 prompts" in log
    assert all(e["during_training"] and e["prompts"] == 3 for e in online.values())
    # DDTree beside the chain, on the same prompts: in the log, the heartbeat, the metrics.
    tree = {s: online[s]["tree"] for s in (30, 60)}
    assert all(
        t["nodes"] == 16 and t["tokens"] == 3 * 24 and t["tau"] >= 1.0 for t in tree.values()
    )
    assert f"; DDTree τ {tree[30]['tau']:.2f} at 16 nodes (" in log

    hb = read_heartbeat(run / "heartbeat.json")
    assert isinstance(hb, Heartbeat) and hb.eval is not None
    assert [(p.step, p.tau) for p in hb.eval.history] == [(s, online[s]["tau"]) for s in (30, 60)]
    assert hb.eval.skipped == 0 and hb.eval.error is None and hb.eval.running_step is None
    assert hb.eval.held_out == 16 and hb.eval.every == 30
    assert hb.eval.tree_nodes == 16 and hb.eval.last is not None
    assert [p.tree_tau for p in hb.eval.history] == [tree[s]["tau"] for s in (30, 60)]
    assert hb.eval.last.tree_seconds == tree[60]["seconds"] and not hb.eval.last.tree_not_measured
    assert all(p.train_acc is not None and 0 < p.train_acc < 1 for p in hb.eval.history)
    # The row after an eval finished carries it; the last step's comes after the last row.
    lines = (run / "metrics.jsonl").read_text().splitlines()
    rows = [row for line in lines if isinstance(row := parse_metrics_line(line), MetricsRow)]
    assert len(rows) == len(lines)
    carried = [row.eval for row in rows if row.eval is not None]
    got = [(e.step, e.tau, e.tree_nodes, e.tree_tau) for e in carried]
    owed = (30, online[30]["tau"], 16, tree[30]["tau"])
    # An eval still running at the last row (chain and tree, on a busy machine) is taken at
    # the end, for wandb: one that finished well before the last row is owed to a row, one
    # that finished about then may be carried or not, but never with other figures.
    assert got in ([], [owed]), got
    if online[30]["at"] < rows[-1].time - 1.0:
        assert got == [owed]

    # The same drafter and prompts through `python -m trainer eval`: the whole target
    # loaded apart from training's, the checkpoint's weights: the same acceptance, token
    # for token.
    for step in (30, 60):
        e = subprocess.run(
            [sys.executable, "-m", "trainer", "eval", str(run), "--step", str(step),
             "--prompts", "3", "--new-tokens", "24"],
            capture_output=True, text=True, timeout=240,
        )  # fmt: skip
        assert e.returncode == 0, e.stderr
        offline = json.loads((run / "eval" / f"step-{step:08d}.json").read_text())
        for key in ("tau", "per_position", "verify_steps", "tokens"):
            assert offline[key] == online[step][key], (step, key)
            assert offline["tree"][key] == tree[step][key], (step, "tree", key)
    # Against a target that writes the data's kind of text, training shows in held-out τ.
    assert online[60]["tau"] > online[30]["tau"] > 1.0, online


@pytest.mark.serial  # the fixture's build, alone; this test reads what it saw
def test_the_chat_targets_first_build_shows_its_progress_in_the_heartbeat(tiny_chat_ready):
    """Built by a real trainer run of the demo config on an empty cache: `starting` counts
    the target's training steps, then the answers, in the heartbeat's phase_progress (what
    the TUI and the headless line show during the ~1.5 minutes)."""
    from trainer.builtins.tiny_chat import STEPS, UNIT_ANSWERS, UNIT_TRAIN

    seen = tiny_chat_ready.progress
    if not seen:
        pytest.skip("the builtins were built before this session's fixture ran")
    trained = [done for unit, done, total in seen if unit == UNIT_TRAIN and total == STEPS]
    # Polled every 0.2 s: the last steps may pass between two looks.
    assert len(trained) >= 3 and trained == sorted(trained) and trained[-1] > STEPS - 10, seen
    # Then the answers (their 1 of 1 lasts a moment: the data's own count follows at once).
    last_step = seen.index((UNIT_TRAIN, trained[-1], STEPS))
    assert (UNIT_ANSWERS, 0, 1) in seen[last_step:], seen


def test_an_eval_outlasting_its_interval_is_skipped_and_training_never_waits(tmp_path):
    root = tmp_path / "runs"
    r = run_trainer(
        "--config", str(TINY), "--run-root", str(root), "--max-steps", "40",
        "--set", "data.held_out=8", "--set", "eval.every=2",
        "--set", "eval.prompts=8", "--set", "eval.new_tokens=64", "--set", "eval.final=false",
        timeout=400,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    run = only_run_dir(root)
    hb = read_heartbeat(run / "heartbeat.json")
    assert isinstance(hb, Heartbeat) and hb.eval is not None and hb.step == 40
    done = [p.step for p in hb.eval.history]
    assert hb.eval.skipped >= 5 and len(done) + hb.eval.skipped <= 20, (done, hb.eval.skipped)
    log = (run / "train.log").read_text()
    assert "skipped (the eval of step" in log
    # The copy of the weights is all an eval costs the training thread.
    assert hb.eval.snapshot_s < 1.0
    # The tiny Qwen3 decodes as one batch; on a CPU its step is not captured, which the
    # heartbeat says (trainer/contract/graphs.py).
    graphs = hb.graphs["eval"]
    assert not graphs.enabled and graphs.off_reason == "the eval runs on cpu, not a CUDA device"
    assert graphs.captured == graphs.replays == graphs.failed == graphs.eager_runs == 0


def test_sigterm_leaves_an_eval_under_way_and_the_run_stops_promptly(start_trainer):
    p = start_trainer(
        "--max-steps", "5000", "--set", "data.held_out=8",
        "--set", "eval.every=10", "--set", "eval.prompts=8", "--set", "eval.new_tokens=2000",
    )  # fmt: skip
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        hb = read_heartbeat(p.run_dir / "heartbeat.json")
        if isinstance(hb, Heartbeat) and hb.eval is not None and hb.eval.running_step:
            break
        time.sleep(0.2)
    else:
        pytest.fail("no eval started")
    t0 = time.monotonic()
    p.proc.send_signal(signal.SIGTERM)
    assert p.wait(timeout=60) == 0
    assert time.monotonic() - t0 < 30
    hb = read_heartbeat(p.run_dir / "heartbeat.json")
    assert isinstance(hb, Heartbeat) and hb.phase == "stopped"
    assert "left unfinished: the run is stopping" in (p.run_dir / "train.log").read_text()


def test_eval_needs_held_out_samples(tmp_path):
    r = run_trainer("--config", str(TINY), "--run-root", str(tmp_path), "--set", "eval.every=10")
    assert r.returncode == 2
    assert r.stderr.strip().splitlines() == [
        "error: config: eval.every = 10: needs data.held_out > 0: held-out τ is measured on samples"
        " never trained on"
    ]
    assert not list(Path(tmp_path).iterdir())

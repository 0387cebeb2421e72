"""Held-out evaluation as an operator runs it: a real run that holds samples out, then
`python -m trainer eval` decoding for real from its checkpoint, and `export` quoting τ."""

from __future__ import annotations

import json
import random
import subprocess
import sys
from pathlib import Path

from trainer.data.held_out import sample_id, split_held_out
from trainer.data.samples import Sample

ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / "trainer" / "configs" / "tiny-cpu.toml"


def trainer(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "trainer", *args], capture_output=True,
                          text=True, timeout=240, cwd=ROOT)  # fmt: skip


def test_the_split_is_by_id_whatever_the_order_and_holds_out_every_copy():
    rng = random.Random(0)
    samples = [Sample([rng.randrange(500) for _ in range(8)], [0] * 4 + [1] * 4) for _ in range(50)]
    samples += [Sample(list(samples[7].input_ids), list(samples[7].loss_mask))]  # a duplicate
    train, held = split_held_out(samples, 10)
    shuffled = samples[:]
    rng.shuffle(shuffled)
    train2, held2 = split_held_out(shuffled, 10)
    assert [sample_id(s) for s in held] == [sample_id(s) for s in held2]
    assert len(held) == 10 and len({sample_id(s) for s in held}) == 10
    held_ids = {sample_id(s) for s in held}
    assert not [s for s in train + train2 if sample_id(s) in held_ids]
    assert len(train) == len(samples) - 10 - (sample_id(samples[7]) in held_ids)
    assert split_held_out(samples, 0) == (samples, [])
    assert len(split_held_out(samples[:3], 10)[0]) == 1  # something is always left to train on


def test_eval_decodes_a_held_out_split_and_export_quotes_it(tmp_path):
    root = tmp_path / "runs"
    r = trainer("--config", str(TINY), "--run-root", str(root), "--max-steps", "10",
                "--set", "runtime.wandb_mode=disabled", "--set", "data.held_out=16")  # fmt: skip
    assert r.returncode == 0, r.stderr
    (run,) = [p for p in root.iterdir() if p.is_dir()]  # not the launch lock
    assert (
        "held out 16 samples (by id) for evaluation: never trained on"
        in (run / "train.log").read_text()
    )

    e = trainer("eval", str(run), "--prompts", "3", "--new-tokens", "20")
    assert e.returncode == 0, e.stderr
    assert e.stdout.startswith("step 10: held-out τ "), e.stdout
    record = json.loads((run / "eval" / "step-00000010.json").read_text())
    assert record["held_out"] is True and record["prompts"] == 3 and record["new_tokens"] == 20
    assert record["tokens"] == 60 and 1.0 <= record["tau"] <= record["block_size"]
    assert len(record["per_position"]) == record["block_size"] - 1
    # tokens per verify step: every step produces the accepted drafts and the bonus token
    assert record["verify_steps"] <= 57

    # DDTree beside the chain: the same prompts, a tree of 8 nodes per verify step.
    e = trainer("eval", str(run), "--prompts", "3", "--new-tokens", "20", "--tree-nodes", "8")
    assert e.returncode == 0, e.stderr
    assert "; DDTree τ " in e.stdout and " at 8 nodes (" in e.stdout, e.stdout
    tree = json.loads((run / "eval" / "step-00000010.json").read_text())["tree"]
    assert tree["nodes"] == 8 and tree["tokens"] == 60 and 1.0 <= tree["tau"] <= 16
    assert len(tree["per_position"]) == 15 and tree["seconds"] > 0
    refused = trainer("eval", str(run), "--tree-nodes", "5000")
    assert refused.returncode == 2 and len(refused.stderr.strip().splitlines()) == 1
    assert "eval.tree_nodes = 5000: must be 0 (off) or a node budget" in refused.stderr

    # An override for one eval (as FP8 against bf16 is compared) gets its own record.
    e = trainer("eval", str(run), "--prompts", "3", "--new-tokens", "20", "--tree-nodes", "0",
                "--set", "target.dtype=float32")  # fmt: skip
    assert e.returncode == 0, e.stderr
    assert e.stdout.rstrip().endswith("[with target.dtype=float32]"), e.stdout
    own = json.loads((run / "eval" / "step-00000010.set-target.dtype=float32.json").read_text())
    assert own["overrides"] == ["target.dtype=float32"] and own["tokens"] == 60
    assert "tree" not in own
    assert json.loads((run / "eval" / "step-00000010.json").read_text())["tree"] == tree
    refused = trainer("eval", str(run), "--set", "target.dtype=fp9")
    assert refused.returncode == 2 and len(refused.stderr.strip().splitlines()) == 1
    assert "target.dtype" in refused.stderr, refused.stderr

    out = tmp_path / "drafter"
    assert trainer("export", str(run), "--out", str(out)).returncode == 0
    assert f"**{record['tau']:.2f}** of 16 on held-out samples" in (out / "README.md").read_text()
    prov = json.loads((out / "dflash_export.json").read_text())
    assert prov["held_out_eval"]["tau"] == record["tau"]


def test_bad_input_is_one_line(tmp_path):
    for args, needle in [
        (["eval", str(tmp_path / "nope")], "no such run dir"),
        (["eval", str(tmp_path), "--prompts", "0"], "--prompts"),
        (["eval", str(tmp_path)], "not a run dir"),
    ]:
        r = trainer(*args)
        assert r.returncode == 2, (args, r.stderr)
        assert needle in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr

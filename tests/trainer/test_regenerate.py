"""`python -m trainer regenerate`: the target's own greedy answers to the data's prompts, as
training data in the `tokens` format, equal to brute-force greedy decoding, never written
over an existing file; the data loader reads it back as it was written."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM

from trainer.data.samples import load_samples
from trainer.evaluation.speculative import target_pass
from trainer.targets.load import default_target_layer_ids, read_target_info

ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / "trainer" / "configs" / "tiny-cpu.toml"


def trainer(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "trainer", *args], capture_output=True,
                          text=True, timeout=240, cwd=ROOT)  # fmt: skip


def test_regenerated_answers_are_the_targets_greedy_ones(tmp_path, tiny_target_dir, tiny_tokenizer):
    out = tmp_path / "regen.jsonl"
    r = trainer("regenerate", "--config", str(TINY), "--out", str(out),
                "--max-new-tokens", "12", "--limit", "24", "--batch", "5")  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[-1].startswith("wrote 24 prompts with ")
    rows = [json.loads(x) for x in out.read_text().splitlines()]
    assert len(rows) == 24
    model = AutoModelForCausalLM.from_pretrained(tiny_target_dir, dtype=torch.float32).eval()
    layers = default_target_layer_ids(read_target_info(tiny_target_dir).num_layers, 2)
    for row in rows[:6]:
        mask, ids = row["loss_mask"], row["input_ids"]
        n = mask.index(1)
        assert mask == [0] * n + [1] * (len(ids) - n) and 1 <= len(ids) - n <= 12
        seq = ids[:n]
        for _ in range(len(ids) - n):  # brute force: one token at a time, unbatched
            seq.append(target_pass(model, seq, layers)[0][-1])
        assert seq == ids

    again = trainer("regenerate", "--config", str(TINY), "--out", str(out), "--limit", "2")
    assert again.returncode == 2 and "already exists" in again.stderr
    assert len(again.stderr.strip().splitlines()) == 1
    assert len(out.read_text().splitlines()) == 24  # untouched

    samples, report = load_samples(out, tiny_tokenizer, vocab_size=model.config.vocab_size)
    assert report.skipped == 0 and [x.input_ids for x in samples] == [x["input_ids"] for x in rows]

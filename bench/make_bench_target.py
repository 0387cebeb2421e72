"""Build a random Qwen3-8B-shaped target folder for GPU benchmarks (no download).

    python3 bench/make_bench_target.py /tmp/qwen3-8b-random

All 36 layers are written: training reads layers 0..33 (a 5-layer drafter's deepest is 33),
and the held-out eval's verifying target reads the 2 it drops (trainer/targets/whole.py).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import torch
from transformers import Qwen3Config, Qwen3ForCausalLM

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from trainer.targets.tiny import build_tokenizer


def qwen3_8b_config() -> Qwen3Config:
    """The 8B bench target's shape (bench/scaling.py reads it too)."""
    return Qwen3Config(
        vocab_size=151936,
        hidden_size=4096,
        intermediate_size=12288,
        num_hidden_layers=36,
        num_attention_heads=32,
        num_key_value_heads=8,
        head_dim=128,
        max_position_embeddings=40960,
        tie_word_embeddings=False,
    )


def main(out: Path) -> None:
    t0 = time.time()
    cfg = qwen3_8b_config()
    torch.set_default_dtype(torch.bfloat16)
    with torch.device("cuda" if torch.cuda.is_available() else "cpu"):
        model = Qwen3ForCausalLM(cfg)
    model.save_pretrained(out)
    build_tokenizer().save_pretrained(out)
    print(f"wrote {out} in {time.time() - t0:.1f}s", flush=True)


if __name__ == "__main__":
    main(Path(sys.argv[1]))

"""Build a random Qwen3.6-27B-shaped target folder for GPU benchmarks (no download).

    python3 bench/make_bench_target_qwen36.py /tmp/qwen3.6-27b-random [--tiny]

Saved as the real one is: the multimodal wrapper `Qwen3_5ForConditionalGeneration`
(model_type qwen3_5, the text model under `text_config`, a vision tower beside it), with
random bf16 weights. Only the text layers a 5-layer drafter reads are written (0..61 of 64,
DFlash's default spread reads 1, 16, 31, 46, 61) under a config that says 64: the trainer's
truncated load reads exactly what it needs, and skips the vision tower. Full size: ~56 GB on
disk (26.1B text parameters and the 0.4B vision tower), built on the GPU when there is one.
`--tiny` writes the same structure at a tiny size (the tests build it).

The shape is Qwen3.5-27B's / Qwen3.6-27B's published config.json, as quoted by third-party
copies found through the search tool (not read from the Qwen repository itself): hidden
5120, 64 layers (linear_attention x3 then full_attention, 16 times), 24 query / 4 KV heads
of 256 with partial_rotary_factor 0.25 and rope_theta 1e7, MLP 17408, Gated DeltaNet with
16 key / 48 value heads of 128 and a 4-tap conv, vocab 248320, untied lm_head.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from trainer.targets.load import default_target_layer_ids
from trainer.targets.tiny import build_tokenizer, tiny_vision_config

NUM_LAYERS = 64
TEXT: dict[str, Any] = dict(
    vocab_size=248320,
    hidden_size=5120,
    intermediate_size=17408,
    num_attention_heads=24,
    num_key_value_heads=4,
    head_dim=256,
    linear_num_key_heads=16,
    linear_num_value_heads=48,
    linear_key_head_dim=128,
    linear_value_head_dim=128,
    linear_conv_kernel_dim=4,
    max_position_embeddings=262144,
    rms_norm_eps=1e-6,
    tie_word_embeddings=False,
    rope_parameters={
        "rope_type": "default",
        "rope_theta": 10_000_000.0,
        "partial_rotary_factor": 0.25,
        "mrope_section": [11, 11, 10],
        "mrope_interleaved": True,
    },
)


def hybrid_layer_types(n: int) -> list[str]:
    """Every 4th layer full attention, the others Gated DeltaNet (Qwen3.5/3.6)."""
    return ["full_attention" if (i + 1) % 4 == 0 else "linear_attention" for i in range(n)]


def write_target(
    out: Path, text: dict[str, Any], num_layers: int, vision: dict[str, Any], draft_layers: int = 5
) -> int:
    """Write the wrapper with layers 0..max(read) only; returns how many layers were kept."""
    from transformers import Qwen3_5Config, Qwen3_5ForConditionalGeneration, Qwen3_5TextConfig

    kept = max(default_target_layer_ids(num_layers, draft_layers)) + 1
    text_config = Qwen3_5TextConfig(
        **text, num_hidden_layers=kept, layer_types=hybrid_layer_types(kept)
    )
    config = Qwen3_5Config(
        text_config=text_config.to_dict(),
        vision_config={**vision, "out_hidden_size": text["hidden_size"]},
        tie_word_embeddings=text["tie_word_embeddings"],
    )
    model = Qwen3_5ForConditionalGeneration(config)
    # The full model's depth; the layers above `kept` are not stored.
    saved: Any = model.config.text_config
    saved.num_hidden_layers = num_layers
    saved.layer_types = hybrid_layer_types(num_layers)
    model.save_pretrained(out)
    build_tokenizer().save_pretrained(out)
    return kept


def main(out: Path, tiny: bool) -> None:
    t0 = time.time()
    if tiny:
        tokenizer_rows = 256  # the tiny tokenizer's ids fit
        text = {**TEXT, "vocab_size": tokenizer_rows, "hidden_size": 128, "intermediate_size": 256}
        text.update(num_attention_heads=4, num_key_value_heads=2, head_dim=32)
        text.update(linear_num_key_heads=2, linear_num_value_heads=4)
        text.update(linear_key_head_dim=32, linear_value_head_dim=32)
        kept = write_target(out, text, 8, tiny_vision_config())
    else:
        torch.set_default_dtype(torch.bfloat16)
        with torch.device("cuda" if torch.cuda.is_available() else "cpu"):
            kept = write_target(out, TEXT, NUM_LAYERS, {"depth": 27, "hidden_size": 1152})
    print(f"wrote {out} ({kept} layers stored) in {time.time() - t0:.1f}s", flush=True)


if __name__ == "__main__":
    args = [a for a in sys.argv[1:] if a != "--tiny"]
    main(Path(args[0]), tiny="--tiny" in sys.argv[1:])

"""The target: DFlash's layer choice, truncation, and the features the drafter reads."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from trainer.target import default_target_layer_ids, load_target, load_tokenizer


@pytest.mark.parametrize(
    ("L", "n", "expected"),
    [
        (36, 5, [1, 9, 17, 25, 33]),  # Qwen3-8B, 5 drafter layers
        (64, 5, [1, 16, 31, 46, 61]),  # Qwen3-32B-sized
        (8, 2, [1, 5]),
        (8, 3, [1, 3, 5]),
        (36, 1, [18]),  # one layer: L // 2
    ],
)
def test_default_layer_ids(L, n, expected):
    assert default_target_layer_ids(L, n) == expected


def test_truncated_target_gives_the_full_models_hidden_states(tiny_target_dir):
    ids = torch.randint(4, 300, (2, 37), generator=torch.Generator().manual_seed(0))
    full = AutoModelForCausalLM.from_pretrained(tiny_target_dir, dtype=torch.float32).eval()
    with torch.no_grad():
        hs = full(input_ids=ids, output_hidden_states=True).hidden_states
    L = full.config.num_hidden_layers
    for layer_ids in ([1, 5], [0, 2, 3], [2, L - 1]):
        t = load_target(tiny_target_dir, layer_ids, torch.float32, torch.device("cpu"))
        # No compute and no weights above the highest layer read.
        assert len(t.features.base.layers) == max(layer_ids) + 1
        feats = t.features(ids)
        expected = torch.cat([hs[i + 1] for i in layer_ids], dim=-1)
        torch.testing.assert_close(feats, expected, rtol=1e-5, atol=1e-5)
        assert t.info.num_layers == L


def test_bad_layer_ids_are_refused(tiny_target_dir):
    with pytest.raises(ValueError, match=r"drafter\.target_layer_ids"):
        load_target(tiny_target_dir, [1, 99], torch.float32, torch.device("cpu"))


def test_mask_token_is_added_when_missing(tiny_target_dir):
    plain = AutoTokenizer.from_pretrained(tiny_target_dir)
    assert plain.mask_token_id is None
    tok, mask_id = load_tokenizer(tiny_target_dir, "<|MASK|>")
    assert mask_id == len(plain)
    assert tok.convert_ids_to_tokens(mask_id) == "<|MASK|>"
    # It stays a single special token and fits inside the target's embedding.
    assert tok("a <|MASK|> b")["input_ids"].count(mask_id) == 1
    cfg = AutoModelForCausalLM.from_pretrained(tiny_target_dir).config
    assert mask_id < cfg.vocab_size

"""The target: DFlash's layer choice, truncation, and the features the drafter reads."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from trainer.targets.load import (
    default_target_layer_ids,
    load_embeddings,
    load_target,
    load_tokenizer,
    read_target_info,
)


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


# The Qwen3.5/3.6 hybrid (Gated DeltaNet + full attention), in both saved forms.
HYBRID_FORMS = ["tiny_hybrid_target_dir", "tiny_hybrid_text_dir"]


def _hf_hidden_states(folder, ids):
    """HF's own forward of the model class the folder was saved as."""
    from transformers import AutoConfig, Qwen3_5ForConditionalGeneration

    if AutoConfig.from_pretrained(folder).model_type == "qwen3_5":
        model = Qwen3_5ForConditionalGeneration.from_pretrained(folder, dtype=torch.float32)
    else:
        model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    with torch.no_grad():
        return model.eval()(input_ids=ids, output_hidden_states=True).hidden_states


@pytest.mark.parametrize("form", HYBRID_FORMS)
def test_hybrid_target_gives_the_full_models_hidden_states(form, request):
    folder = request.getfixturevalue(form)
    # 150 tokens: more than two of the Gated DeltaNet's 64-token chunks.
    ids = torch.randint(4, 300, (1, 150), generator=torch.Generator().manual_seed(0))
    hs = _hf_hidden_states(folder, ids)
    L = len(hs) - 1
    assert L == 8
    # Layers 3 and 7 are full attention, the others Gated DeltaNet.
    for layer_ids in ([1, 5], [0, 2, 3], [2, L - 1]):
        t = load_target(folder, layer_ids, torch.float32, torch.device("cpu"))
        assert len(t.features.base.layers) == max(layer_ids) + 1
        assert type(t.features.base).__name__ == "Qwen3_5TextModel"  # no vision tower
        feats = t.features(ids)
        expected = torch.cat([hs[i + 1] for i in layer_ids], dim=-1)
        torch.testing.assert_close(feats, expected, rtol=1e-5, atol=1e-5)
        assert torch.equal(t.lm_head_weight, t.embed_weight)  # tied, as saved


@pytest.mark.parametrize("form", HYBRID_FORMS)
def test_hybrid_target_info_comes_from_the_text_config(form, request):
    info = read_target_info(request.getfixturevalue(form))
    assert (info.num_layers, info.hidden_size, info.num_heads, info.num_kv_heads) == (8, 128, 4, 2)
    assert (info.head_dim, info.intermediate_size, info.rope_theta) == (32, 384, 1e7)
    assert info.model_type == "qwen3_5_text" and info.tied_embeddings
    assert info.layer_types == ("linear_attention",) * 3 + ("full_attention",) + (
        "linear_attention",
    ) * 3 + ("full_attention",)


def test_qwen3_target_info_is_unchanged(tiny_target_dir):
    info = read_target_info(tiny_target_dir)
    assert info.model_type == "qwen3" and info.layer_types == ()
    assert (info.num_layers, info.hidden_size, info.head_dim) == (8, 128, 32)


def test_unsupported_architecture_is_one_line(tmp_path):
    from transformers import LlamaConfig

    LlamaConfig(
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        architectures=["LlamaForCausalLM"],
    ).save_pretrained(tmp_path)
    for call in (
        lambda: read_target_info(tmp_path),
        lambda: load_target(tmp_path, [0], torch.float32, torch.device("cpu")),
    ):
        with pytest.raises(ValueError) as e:
            call()
        msg = str(e.value)
        assert "\n" not in msg
        assert "LlamaForCausalLM" in msg and "'llama'" in msg
        for arch in ("Qwen3ForCausalLM", "Qwen3_5ForCausalLM", "Qwen3_5ForConditionalGeneration"):
            assert arch in msg


def test_non_default_rope_is_refused(tmp_path):
    from trainer.targets.tiny import tiny_qwen35_text_config

    rope = {"rope_type": "linear", "factor": 2.0, "rope_theta": 1e6}
    tiny_qwen35_text_config(256, rope_parameters=rope).save_pretrained(tmp_path)
    with pytest.raises(ValueError, match=r"rope type 'linear' is not supported"):
        read_target_info(tmp_path)


def test_qwen36_bench_builder_writes_only_the_layers_read(tmp_path):
    import importlib.util
    from pathlib import Path

    from safetensors import safe_open

    script = Path(__file__).resolve().parents[2] / "bench" / "make_bench_target_qwen36.py"
    spec = importlib.util.spec_from_file_location("make_bench_target_qwen36", script)
    assert spec is not None and spec.loader is not None
    builder = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(builder)
    builder.main(tmp_path, tiny=True)

    info = read_target_info(tmp_path)
    assert info.num_layers == 8 and len(info.layer_types) == 8
    assert info.layer_types[3] == info.layer_types[7] == "full_attention"
    assert not info.tied_embeddings and info.rope_theta == 1e7
    layer_ids = default_target_layer_ids(8, 5)
    with safe_open(tmp_path / "model.safetensors", "pt") as f:
        keys = list(f.keys())
    stored = {int(k.split(".")[3]) for k in keys if k.startswith("model.language_model.layers.")}
    assert stored == set(range(max(layer_ids) + 1))
    assert any(k.startswith("model.visual.") for k in keys)  # the wrapper form, as real
    t = load_target(tmp_path, layer_ids, torch.float32, torch.device("cpu"))
    feats = t.features(torch.randint(4, 200, (1, 20)))
    assert feats.shape == (1, 20, 5 * 128) and torch.isfinite(feats).all()


@pytest.mark.parametrize(
    "form", ["tiny_target_dir", "tiny_hybrid_target_dir", "tiny_hybrid_text_dir"]
)
def test_a_drafter_rank_loads_the_same_embedding_and_head_and_no_layers(form, request):
    """processes mode's drafter ranks read the embedding and head by name from the
    .safetensors (every saved form: Qwen3, the Qwen3.5 wrapper, its text-only form): the
    very tensors the whole target load gives, and no layer."""
    path = request.getfixturevalue(form)
    whole = load_target(path, [0, 1], torch.float32, torch.device("cpu"))
    only = load_embeddings(path, torch.float32, torch.device("cpu"))
    assert torch.equal(only.embed_weight, whole.embed_weight)
    assert torch.equal(only.lm_head_weight, whole.lm_head_weight)
    assert (only.lm_head_weight is only.embed_weight) == only.info.tied_embeddings
    assert only.model is None and only.layer_ids == []
    with pytest.raises(RuntimeError, match="embedding and head only"):
        only.features(torch.zeros(1, 4, dtype=torch.long))


def test_an_embedding_of_the_wrong_shape_is_one_line(tiny_target_dir, tmp_path):
    import shutil

    from safetensors.torch import load_file, save_file

    copy = tmp_path / "target"
    shutil.copytree(tiny_target_dir, copy)
    (weights,) = copy.glob("*.safetensors")
    tensors = load_file(weights)
    key = "model.embed_tokens.weight"
    tensors[key] = tensors[key][:-1].clone()
    save_file(tensors, weights)
    with pytest.raises(ValueError, match=r"embed weight is \(\d+, \d+\), its config says"):
        load_embeddings(copy, torch.float32, torch.device("cpu"))

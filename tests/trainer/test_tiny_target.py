"""The builtin tiny Qwen3 target: tokenizer, model folder, atomic build, path resolution."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedTokenizerFast

import trainer.targets.tiny as tt
from trainer import host_cache
from trainer.builtins import resolve
from trainer.data.synthetic import synthetic_vocabulary

CHAT = [
    {"role": "system", "content": "you are a helpful assistant ."},
    {"role": "user", "content": "count from 3 by 2"},
    {"role": "assistant", "content": "3 5 7 9"},
]
RENDERED = (
    "<|im_start|>system\nyou are a helpful assistant .<|im_end|>\n"
    "<|im_start|>user\ncount from 3 by 2<|im_end|>\n"
    "<|im_start|>assistant\n3 5 7 9<|im_end|>\n"
)


def test_tokenizer_round_trip(tiny_tokenizer: PreTrainedTokenizerFast) -> None:
    text = "repeat : apple river stone apple river 17 299"
    ids = tiny_tokenizer(text)["input_ids"]
    assert len(ids) == 9
    assert tiny_tokenizer.unk_token_id not in ids
    assert tiny_tokenizer.decode(ids) == text
    # The whole vocabulary is known, each word a single token.
    words = synthetic_vocabulary()
    assert tiny_tokenizer(" ".join(words))["input_ids"] == tiny_tokenizer.convert_tokens_to_ids(
        words
    )
    assert tiny_tokenizer("zebra")["input_ids"] == [tiny_tokenizer.unk_token_id]


def test_specials_split_and_offsets(tiny_tokenizer: PreTrainedTokenizerFast) -> None:
    text = "<|im_start|>user\nletters from a<|im_end|>\n"
    enc = tiny_tokenizer(text, return_offsets_mapping=True)
    tokens = tiny_tokenizer.convert_ids_to_tokens(enc["input_ids"])
    assert tokens == ["<|im_start|>", "user", "letters", "from", "a", "<|im_end|>"]
    assert [text[s:e] for s, e in enc["offset_mapping"]] == tokens


def test_special_token_ids(tiny_tokenizer: PreTrainedTokenizerFast) -> None:
    assert tiny_tokenizer.pad_token == "<|endoftext|>" and tiny_tokenizer.pad_token_id == 0
    assert tiny_tokenizer.eos_token == "<|im_end|>"
    assert tiny_tokenizer.unk_token == "<unk>"
    assert tiny_tokenizer.mask_token is None  # the trainer adds its own
    assert tiny_tokenizer.is_fast


def test_chat_template(tiny_tokenizer: PreTrainedTokenizerFast) -> None:
    assert tiny_tokenizer.apply_chat_template(CHAT, tokenize=False) == RENDERED
    prompt = tiny_tokenizer.apply_chat_template(
        CHAT[:2], tokenize=False, add_generation_prompt=True
    )
    assert prompt == RENDERED.split("3 5 7 9", maxsplit=1)[0]
    ids = tiny_tokenizer(RENDERED)["input_ids"]
    assert tiny_tokenizer.unk_token_id not in ids


def test_target_folder_loads_and_runs(
    tiny_target_dir: Path, tiny_tokenizer: PreTrainedTokenizerFast
) -> None:
    tok = AutoTokenizer.from_pretrained(tiny_target_dir)
    assert tok.get_vocab() == tiny_tokenizer.get_vocab()
    assert tok.apply_chat_template(CHAT, tokenize=False) == RENDERED
    model = AutoModelForCausalLM.from_pretrained(tiny_target_dir)
    cfg = model.config
    assert cfg.model_type == "qwen3" and model.dtype == torch.float32
    assert (cfg.hidden_size, cfg.num_hidden_layers, cfg.num_attention_heads) == (128, 8, 4)
    assert (cfg.num_key_value_heads, cfg.head_dim, cfg.intermediate_size) == (2, 32, 384)
    assert cfg.tie_word_embeddings and cfg.max_position_embeddings == 4096
    assert (cfg.eos_token_id, cfg.pad_token_id) == (tok.eos_token_id, tok.pad_token_id)
    # Spare embedding rows so the trainer's mask token gets a real one.
    assert cfg.vocab_size % 64 == 0 and cfg.vocab_size >= len(tok) + 8
    assert model.get_input_embeddings().weight.shape == (cfg.vocab_size, 128)
    tok.add_special_tokens({"mask_token": "<|MASK|>"})
    assert tok.mask_token_id < cfg.vocab_size

    ids = torch.tensor([tok(RENDERED)["input_ids"] + [tok.mask_token_id]])
    with torch.no_grad():
        out = model(input_ids=ids, output_hidden_states=True)
    assert out.logits.shape == (1, ids.shape[1], cfg.vocab_size)
    assert len(out.hidden_states) == 9
    assert torch.isfinite(out.logits).all()


def test_build_is_seeded(tiny_target_dir: Path, tmp_path: Path) -> None:
    from safetensors.torch import load_file

    again = tt.build_tiny_target(tmp_path / "again", seed=0)
    a = load_file(tiny_target_dir / "model.safetensors")
    b = load_file(again / "model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_interrupted_build_leaves_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def fail(*args: Any, **kwargs: Any) -> None:
        raise RuntimeError("disk full")

    # The model is already written when the tokenizer save fails: a genuinely partial folder.
    monkeypatch.setattr(type(tt.build_tokenizer()), "save_pretrained", fail)
    out = tmp_path / "cache" / "tiny"
    with pytest.raises(RuntimeError, match="disk full"):
        tt.build_tiny_target(out)
    assert not out.exists()
    assert list(out.parent.iterdir()) == []  # no temp folder left beside it either


def test_lost_race_keeps_the_winner(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    out = tmp_path / "tiny"

    def winner_appears(folder: Path, seed: int, family: str, train: Any) -> None:
        # Another process finishes first while this one is still building.
        (folder / "config.json").write_text("{}")
        out.mkdir()
        (out / "config.json").write_text(json.dumps({"winner": True}))

    monkeypatch.setattr(tt, "_write_target", winner_appears)
    assert tt.build_tiny_target(out) == out
    assert json.loads((out / "config.json").read_text()) == {"winner": True}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tiny"]


def test_resolve_builtin_uses_the_cache(
    tiny_target_dir: Path, dflash_cache_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert tiny_target_dir == dflash_cache_dir / "tiny-qwen3-v2"
    assert (tiny_target_dir / "config.json").is_file()

    def no_rebuild(out_dir: Path, seed: int = 0, family: str = "qwen3") -> Path:
        raise AssertionError("rebuilt a cached target")

    monkeypatch.setattr(resolve, "build_tiny_target", no_rebuild)
    assert resolve.resolve_target_path("builtin:tiny-qwen3") == tiny_target_dir


def test_resolve_builds_when_missing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    built: list[Path] = []

    def fake_build(out_dir: Path, seed: int = 0, family: str = "qwen3") -> Path:
        built.append(out_dir)
        assert family == "qwen3"
        return out_dir

    monkeypatch.setenv("DFLASH_CACHE_DIR", str(tmp_path / "c"))
    monkeypatch.setattr(resolve, "build_tiny_target", fake_build)
    assert resolve.resolve_target_path("builtin:tiny-qwen3") == tmp_path / "c" / "tiny-qwen3-v2"
    assert built == [tmp_path / "c" / "tiny-qwen3-v2"]
    # On stdout: stderr carries errors only (bad input is one line there).
    out = capsys.readouterr()
    assert "builtin:tiny-qwen3" in out.out and out.out.count("\n") == 1 and out.err == ""


def test_cache_dir_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("DFLASH_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert host_cache.cache_dir() == tmp_path / "xdg" / "dflash-tui"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert host_cache.cache_dir() == tmp_path / "home" / ".cache" / "dflash-tui"


def test_resolve_local_and_bad_paths(tiny_target_dir: Path, tmp_path: Path) -> None:
    assert resolve.resolve_target_path(str(tiny_target_dir)) == tiny_target_dir
    with pytest.raises(ValueError, match=r"^target\.path: .*nowhere.*config\.json$"):
        resolve.resolve_target_path(str(tmp_path / "nowhere"))
    with pytest.raises(ValueError, match=r"target\.path: unknown builtin .*builtin:tiny-qwen3"):
        resolve.resolve_target_path("builtin:huge-qwen3")

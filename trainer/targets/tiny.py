"""Tiny random targets and their word-level tokenizer, built locally (no download).

They exist so the whole trainer (target features, drafter, loss, data) runs end to end on a
CPU in seconds; their weights are random, so only the data's structure is learnable.
`resolve_target_path` (trainer/builtins/resolve.py) turns `target.path` into a local
folder, building a builtin target into the cache on first use:

- "builtin:tiny-qwen3": Qwen3 (full attention), `Qwen3ForCausalLM`;
- "builtin:tiny-qwen3-chat": that Qwen3 trained briefly on synthetic chats
  (trainer/builtins/tiny_chat.py): its answers follow the chats' patterns, so a drafter's
  held-out acceptance length against it means something;
- "builtin:tiny-qwen3.5": the Qwen3.5/3.6 hybrid (3 Gated DeltaNet layers : 1 full
  attention, partial rotary, gated attention output), saved as the operators' real target
  is: the multimodal wrapper `Qwen3_5ForConditionalGeneration` (a tiny vision tower too).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from trainer.data.synthetic import synthetic_vocabulary

PAD_TOKEN = "<|endoftext|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
UNK_TOKEN = "<unk>"
SPECIAL_TOKENS = [PAD_TOKEN, IM_START, IM_END, UNK_TOKEN]

# Qwen's layout: `<|im_start|>{role}\n{content}<|im_end|>\n` per message.
CHAT_TEMPLATE = (
    "{%- for message in messages -%}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<|im_start|>assistant\\n' }}{%- endif -%}"
)

# Bump the version when the tokenizer or the architecture changes: the cache is keyed on it.
# name -> (cache folder, family)
BUILTIN_TARGETS = {
    "tiny-qwen3": ("tiny-qwen3-v2", "qwen3"),
    "tiny-qwen3-chat": ("tiny-qwen3-chat-v1", "qwen3-chat"),
    "tiny-qwen3.5": ("tiny-qwen3.5-v1", "qwen3.5"),
}
FAMILIES = ("qwen3", "qwen3.5", "qwen3.5-text")
TRAINED = {"qwen3-chat": "qwen3"}  # a trained family -> the family it starts from
# Trains a built model in place: (model, tokenizer, say) -> its final loss.
Trainer = Callable[[Any, Any, Callable[[str], None]], float]


def build_tokenizer() -> PreTrainedTokenizerFast:
    # Specials first, so pad is id 0 (the collate default) and ids are stable.
    vocab = {token: i for i, token in enumerate(SPECIAL_TOKENS + synthetic_vocabulary())}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token=UNK_TOKEN))
    # Split on whitespace and punctuation; specials are matched before this step, so
    # "<|im_start|>user\nhi" becomes <|im_start|>, user, hi.
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.add_special_tokens(SPECIAL_TOKENS)
    # No mask token on purpose: the trainer adds `drafter.mask_token` itself, and the
    # target's embedding keeps spare rows for it (see build_tiny_target).
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        pad_token=PAD_TOKEN,
        eos_token=IM_END,
        unk_token=UNK_TOKEN,
        chat_template=CHAT_TEMPLATE,
        model_max_length=4096,
    )


EMBED_SCALE = 8.0


def _padded_vocab_size(n_tokens: int) -> int:
    # A multiple of 64 with >= 8 spare rows, so tokens added later (the mask) embed.
    return -(-(n_tokens + 8) // 64) * 64


def tiny_qwen35_text_config(vocab_size: int, num_layers: int = 8, **overrides: Any) -> Any:
    """A tiny Qwen3.5/3.6 text config: every 4th layer full attention, as the real ones."""
    from transformers import Qwen3_5TextConfig

    fields: dict[str, Any] = dict(
        vocab_size=vocab_size,
        hidden_size=128,
        intermediate_size=384,
        num_hidden_layers=num_layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        linear_num_key_heads=2,
        linear_num_value_heads=4,
        linear_key_head_dim=32,
        linear_value_head_dim=32,
        linear_conv_kernel_dim=4,
        max_position_embeddings=4096,
        # As Qwen3.5: RoPE on a quarter of each full-attention head, with the mrope
        # sections a text-only forward reduces to plain RoPE.
        rope_parameters={
            "rope_type": "default",
            "rope_theta": 10_000_000.0,
            "partial_rotary_factor": 0.25,
            "mrope_section": [2, 1, 1],
            "mrope_interleaved": True,
        },
    )
    fields.update(overrides)
    return Qwen3_5TextConfig(**fields)


def tiny_vision_config() -> dict[str, Any]:
    """The smallest vision tower the wrapper accepts: present only to be left unloaded."""
    return dict(
        depth=1,
        hidden_size=32,
        intermediate_size=64,
        num_heads=2,
        out_hidden_size=128,
        patch_size=4,
        num_position_embeddings=16,
    )


def build_tiny_model(family: str, vocab_size: int, seed: int, **text_overrides: Any) -> Any:
    """A tiny random HF model of `family` ("qwen3", "qwen3.5" (the multimodal wrapper),
    "qwen3.5-text" (`Qwen3_5ForCausalLM`)), fp32, tied embeddings scaled as trained ones."""
    import torch
    from transformers import (
        Qwen3_5Config,
        Qwen3_5ForCausalLM,
        Qwen3_5ForConditionalGeneration,
        Qwen3Config,
        Qwen3ForCausalLM,
    )

    torch.manual_seed(seed)
    model: Any
    if family == "qwen3":
        config = Qwen3Config(
            vocab_size=vocab_size,
            hidden_size=128,
            intermediate_size=384,
            num_hidden_layers=8,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=32,
            max_position_embeddings=4096,
            tie_word_embeddings=True,
            **text_overrides,
        )
        model = Qwen3ForCausalLM(config)
    elif family == "qwen3.5-text":
        text = tiny_qwen35_text_config(vocab_size, tie_word_embeddings=True, **text_overrides)
        model = Qwen3_5ForCausalLM(text)
    elif family == "qwen3.5":
        text = tiny_qwen35_text_config(vocab_size, tie_word_embeddings=True, **text_overrides)
        wrapper = Qwen3_5Config(
            text_config=text.to_dict(),
            vision_config=tiny_vision_config(),
            tie_word_embeddings=True,
        )
        model = Qwen3_5ForConditionalGeneration(wrapper)
    else:
        raise ValueError(f"unknown tiny target family {family!r} (known: {', '.join(FAMILIES)})")
    model = model.float()
    # Trained LLM embeddings have rows of norm ~1; the 0.02-std init gives ~0.2. At that scale
    # the tied head's logits are nearly flat and a drafter needs many steps just to grow its
    # final-norm gain before it can be confident, which hides learning in the demo.
    with torch.no_grad():
        model.get_input_embeddings().weight.mul_(EMBED_SCALE)
    return model


def _write_target(out_dir: Path, seed: int, family: str, train: Trainer | None) -> None:
    from transformers.utils import logging as tf_logging

    tf_logging.disable_progress_bar()  # a one-shot build; a bar would only clutter logs

    tokenizer = build_tokenizer()
    pad_id = tokenizer.pad_token_id
    # Like Qwen3: no BOS is ever prepended, <|endoftext|> stands in as bos and pad.
    ids = dict(bos_token_id=pad_id, eos_token_id=tokenizer.eos_token_id, pad_token_id=pad_id)
    model = build_tiny_model(
        TRAINED.get(family, family), _padded_vocab_size(len(tokenizer)), seed, **ids
    )
    if train is not None:
        train(model, tokenizer, lambda line: print(line, flush=True))
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)


def build_tiny_target(
    out_dir: Path, seed: int = 0, family: str = "qwen3", train: Trainer | None = None
) -> Path:
    """Build the tiny `family` target into `out_dir` atomically; returns `out_dir`. A trained
    family (`TRAINED`) is trained by `train` before it is saved (trainer/builtins/tiny_chat.py).

    Built in a temp folder beside `out_dir` and renamed into place, so a reader never sees a
    half-written folder; when another process finishes first, its folder is kept.
    """
    out_dir = Path(out_dir)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.tmp-", dir=out_dir.parent))
    try:
        _write_target(tmp, seed, family, train)
        tmp.chmod(0o755)  # mkdtemp makes it 0700; a shared cache must stay readable
        try:
            os.rename(tmp, out_dir)
        except OSError:
            # Lost the race: out_dir is now a complete folder from another process.
            if not (out_dir / "config.json").is_file():
                raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return out_dir

"""A tiny random Qwen3 target and its word-level tokenizer, built locally (no download).

It exists so the whole trainer (target features, drafter, loss, data) runs end to end on a
CPU in seconds; its weights are random, so only the data's structure is learnable.
`resolve_target_path` turns `target.path` into a local folder, building
"builtin:tiny-qwen3" into the cache on first use.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from trainer.synthetic import synthetic_vocabulary

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
BUILTIN_TARGETS = {"tiny-qwen3": "tiny-qwen3-v2"}


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


def _write_target(out_dir: Path, seed: int) -> None:
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM
    from transformers.utils import logging as tf_logging

    tf_logging.disable_progress_bar()  # a one-shot build; a bar would only clutter logs

    tokenizer = build_tokenizer()
    pad_id = tokenizer.pad_token_id
    config = Qwen3Config(
        vocab_size=_padded_vocab_size(len(tokenizer)),
        hidden_size=128,
        intermediate_size=384,
        num_hidden_layers=8,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        max_position_embeddings=4096,
        tie_word_embeddings=True,
        # Like Qwen3: no BOS is ever prepended, <|endoftext|> stands in as bos and pad.
        bos_token_id=pad_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=pad_id,
    )
    torch.manual_seed(seed)
    model = Qwen3ForCausalLM(config).float()
    # Trained LLM embeddings have rows of norm ~1; the 0.02-std init gives ~0.2. At that scale
    # the tied head's logits are nearly flat and a drafter needs many steps just to grow its
    # final-norm gain before it can be confident, which hides learning in the demo.
    with torch.no_grad():
        model.get_input_embeddings().weight.mul_(EMBED_SCALE)
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)


def build_tiny_target(out_dir: Path, seed: int = 0) -> Path:
    """Build the tiny target into `out_dir` atomically; returns `out_dir`.

    Built in a temp folder beside `out_dir` and renamed into place, so a reader never sees a
    half-written folder; when another process finishes first, its folder is kept.
    """
    out_dir = Path(out_dir)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.tmp-", dir=out_dir.parent))
    try:
        _write_target(tmp, seed)
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


def cache_dir() -> Path:
    if env := os.environ.get("DFLASH_CACHE_DIR"):
        return Path(env).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME") or "~/.cache"
    return Path(xdg).expanduser() / "dflash-tui"


def resolve_target_path(path: str) -> Path:
    """`target.path` → a local model folder, building a builtin target on first use."""
    if path.startswith("builtin:"):
        name = path.removeprefix("builtin:")
        if name not in BUILTIN_TARGETS:
            known = ", ".join(f"builtin:{k}" for k in BUILTIN_TARGETS)
            raise ValueError(f"target.path: unknown builtin {path!r} (known: {known})")
        out_dir = cache_dir() / BUILTIN_TARGETS[name]
        if not (out_dir / "config.json").is_file():
            # stdout: stderr is for errors (bad input is one line there)
            print(f"target: building {path} into {out_dir} (once)", flush=True)
            build_tiny_target(out_dir)
        return out_dir
    folder = Path(path).expanduser()
    if not (folder / "config.json").is_file():
        raise ValueError(f"target.path: {str(folder)!r} is not a model folder with config.json")
    return folder

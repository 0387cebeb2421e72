"""A tiny target that has learned to chat: the tiny Qwen3, trained briefly on synthetic chats.

A target with random weights answers every prompt with one token repeated, so held-out τ on
it says nothing: a drafter trained on data never matches it (τ 1.00), and one trained on its
own answers matches it at once (τ = the block size). Real targets write the kind of text
they were trained on, and a drafter learns that text. This target does too, in miniature:
it is trained (next token, every position) on synthetic chats drawn from the same
generator as `builtin:synthetic-chat` but another seed, so it never saw the data's
held-out samples, and its greedy answers follow the chats' patterns (counting, cycles,
alphabets) with mistakes of its own. A drafter's held-out τ against it rises as it learns.

Built once into the cache (`builtin:tiny-qwen3-chat`), seeded: ~1 minute on 2 CPU cores.
Its answers to the synthetic chats' prompts are `builtin:tiny-chat-answers` (below): a drafter
trained on them is trained as DFlash drafters are, on what the target itself says.
"""

from __future__ import annotations

import fcntl
import os
import random
import sys
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import torch

from trainer.builtins.progress import report
from trainer.data.synthetic import generate_conversations

UNIT_TRAIN = "steps training builtin:tiny-qwen3-chat (once)"
UNIT_ANSWERS = "generating builtin:tiny-chat-answers (once)"
SEED = 7  # builtin:synthetic-chat is seed 0: other conversations, the same patterns
CONVERSATIONS = 3000
STEPS = 200
BATCH = 16
LR = 3e-3


def _chats_as_ids(tokenizer: Any) -> list[list[int]]:
    out = []
    for messages in generate_conversations(CONVERSATIONS, SEED):
        text = tokenizer.apply_chat_template(messages, tokenize=False)
        out.append(list(tokenizer(text, add_special_tokens=False)["input_ids"]))
    return out


def train_chat(model: Any, tokenizer: Any, say: Callable[[str], None]) -> float:
    """Train `model` in place; returns the last steps' mean loss."""
    torch.manual_seed(SEED)
    torch.set_num_threads(os.cpu_count() or 1)
    rng = random.Random(SEED)
    chats = _chats_as_ids(tokenizer)
    pad = tokenizer.pad_token_id
    opt = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=0.0)
    model.train()
    t0 = time.monotonic()
    recent: list[float] = []
    for step in range(STEPS):
        rows = [chats[rng.randrange(len(chats))] for _ in range(BATCH)]
        length = max(len(r) for r in rows)
        ids = torch.full((BATCH, length), pad)
        labels = torch.full((BATCH, length), -100)
        for i, r in enumerate(rows):
            ids[i, : len(r)] = labels[i, : len(r)] = torch.tensor(r)
        for group in opt.param_groups:  # linear decay: the last steps settle
            group["lr"] = LR * (1 - step / STEPS)
        loss = model(input_ids=ids, labels=labels, use_cache=False).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
        recent = [*recent[-19:], loss.item()]
        report(UNIT_TRAIN, step + 1, STEPS)
        if (step + 1) % 50 == 0:
            say(
                f"target: training tiny-qwen3-chat: step {step + 1}/{STEPS}, loss "
                f"{sum(recent) / len(recent):.2f} ({time.monotonic() - t0:.0f}s)"
            )
    model.eval()
    return sum(recent) / len(recent)


CHAT_TARGET = "builtin:tiny-qwen3-chat"
ANSWERS = "tiny-chat-answers-v1"  # bump with STEPS, SEED or the prompts
ANSWER_TOKENS = 40


def ensure_answers(cache_root: Path, target_path: Path) -> Path:
    """`builtin:tiny-chat-answers`: the prompts of `builtin:synthetic-chat` answered greedily
    by `builtin:tiny-qwen3-chat` (built at `target_path`), as `python -m trainer regenerate`
    answers them for a real target: the data a drafter for that target learns from.
    Generated into the cache on first use (~20 s on 2 CPU cores, after the target's own
    build), once however many start at once."""
    from trainer.config import Config
    from trainer.data.samples import BUILTIN_DATASETS, DATASETS_DIR
    from trainer.targets.answers import load_decoding, write_answers

    out = cache_root / "datasets" / f"{ANSWERS}.jsonl"
    if out.is_file():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out.parent / f".{ANSWERS}.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not out.is_file():
            t0 = time.monotonic()
            cfg = Config()
            cfg.target.path = CHAT_TARGET
            cfg.data.path = "builtin:synthetic-chat"
            cfg.data.seq_buckets = [256]
            say = partial(print, file=sys.stderr, flush=True)
            say(f"data: generating builtin:tiny-chat-answers into {out} (once)")
            report(UNIT_ANSWERS, 0, 1)
            chats = DATASETS_DIR / BUILTIN_DATASETS["synthetic-chat"]
            dec = load_decoding(cfg, target_path, chats, "cpu")
            done = write_answers(dec, out, ANSWER_TOKENS, say=say, data_name=cfg.data.path)
            report(UNIT_ANSWERS, 1, 1)
            n, tokens = done["prompts"], done["answer_tokens"]
            say(f"data: {n} answers, {tokens} tokens, {round(time.monotonic() - t0, 1)}s")
    return out

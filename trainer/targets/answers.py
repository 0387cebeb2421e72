"""The whole target answering prompts greedily, the way a regenerated dataset is made: the
target and the data's samples loaded from local paths, each prompt cut from a sample, the
answers written as `tokens` JSONL (prompt + answer, the loss on the answer only).

`python -m trainer regenerate` (trainer/evaluation/regenerate.py) and the builtin
`tiny-chat-answers` (trainer/builtins/tiny_chat.py) both write through here, and the held-out
eval decodes from the same `Decoding`, so a prompt is the same prompt in all three.
"""

from __future__ import annotations

import json
import os
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from trainer.config import Config
from trainer.data.samples import Sample


class AnswerError(ValueError):
    """Nothing to answer, or the output is not ours to write: one line for the operator."""


def prompt_of(sample: Sample, prompt_len: int) -> list[int]:
    """The tokens before the first one trained on (a chat's prompt), else the first half."""
    first = next((i for i, m in enumerate(sample.loss_mask) if m), None)
    end = first if first else len(sample.input_ids) // 2
    return sample.input_ids[max(0, end - prompt_len) : end]


@dataclass
class Decoding:
    """What decoding with a run's whole target needs: the model, its tokenizer, and the data's
    samples loaded as training loaded them (the same samples, so the same held-out split)."""

    model: Any
    tokenizer: Any
    dtype: torch.dtype
    device: torch.device
    samples: list[Sample]


def load_decoding(cfg: Config, target_path: Path, data_path: Path, device: str) -> Decoding:
    """The whole target at `target_path` and the samples of `data_path`, as `cfg` trains on
    them. Raises ValueError, OSError or RuntimeError as loading does."""
    from trainer.data.tokenized import load_tokenized
    from trainer.targets.load import load_tokenizer, read_target_info, resolve_dtype

    dev = torch.device(device)
    tokenizer, _mask_id = load_tokenizer(target_path, cfg.drafter.mask_token)
    dtype = resolve_dtype(cfg.target.dtype, dev)
    model = load_whole_model(target_path, cfg.target.dtype, dtype, dev)
    data = load_tokenized(
        data_path, tokenizer, cfg.data.format, max(cfg.data.seq_buckets), lambda _m: None,
        cache_root=Path(cfg.data.cache_dir).expanduser() if cfg.data.cache_dir else None,
        use_cache=cfg.data.cache, vocab_size=read_target_info(target_path).vocab_size,
    )  # fmt: skip
    return Decoding(model, tokenizer, dtype, dev, data.samples)


def load_whole_model(path: Path, dtype_name: str, dtype: torch.dtype, dev: torch.device) -> Any:
    """HF's whole model of the target, on `dev`. A checkpoint in transformers' FP8 format is
    read by trainer/targets/fp8.py (HF's own FP8 loader wants accelerate and its own layers);
    `target.dtype = "fp8"` gives FP8 decoder linears where `dev` runs them, else (a CPU)
    the bf16 ones: an offline eval of an FP8 run still runs there."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from trainer.targets import fp8 as fp8_weights

    block_scaled = fp8_weights.quantization_config(path) is not None
    kwargs: dict[str, Any] = {}
    if block_scaled:
        config = AutoConfig.from_pretrained(path)
        del config.quantization_config
        kwargs["config"] = config
    model: Any = AutoModelForCausalLM.from_pretrained(path, dtype=dtype, **kwargs)
    model = model.to(dev).eval()
    use_fp8 = dtype_name == "fp8" and fp8_weights.fp8_unsupported(dev) is None
    if block_scaled or use_fp8:
        base = model.model
        layers = getattr(base, "language_model", base).layers  # the multimodal wrapper's
        if block_scaled:
            fp8_weights.load_block_scaled(layers, path, 0, use_fp8, dtype)
        else:
            fp8_weights.convert_linears(layers)
    return model


@torch.no_grad()
def greedy_answers(
    model: Any, prompts: list[list[int]], max_new: int, eos: int | None, batch: int
) -> list[list[int]]:
    """Each prompt's greedy answer (up to and including eos), prompts of one length batched."""
    device = next(model.parameters()).device
    by_len: dict[int, list[int]] = defaultdict(list)
    for i, p in enumerate(prompts):
        by_len[len(p)].append(i)
    answers: list[list[int]] = [[] for _ in prompts]
    for idx in by_len.values():
        for k in range(0, len(idx), batch):
            part = idx[k : k + batch]
            ids = torch.tensor([prompts[i] for i in part], device=device)
            out = model.generate(
                input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new,
                do_sample=False, eos_token_id=eos, pad_token_id=eos if eos is not None else 0,
            )  # fmt: skip
            for row, i in zip(out[:, ids.shape[1] :].tolist(), part, strict=True):
                # Up to and including eos: the end is a target too, the drafter learns to stop.
                end = row.index(eos) + 1 if eos is not None and eos in row else len(row)
                answers[i] = row[:end]
    return answers


def write_answers(
    dec: Decoding,
    out: Path,
    max_new: int,
    batch: int = 64,
    limit: int | None = None,
    prompt_len: int = 1024,
    say: Callable[[str], Any] = print,
    data_name: str = "data.path",
) -> dict[str, Any]:
    """Answer the prompts of `dec.samples[:limit]` (from `data_name`) into `out`, written
    beside it and renamed into place; an existing `out` is never replaced (AnswerError)."""
    t0 = time.monotonic()
    model, tokenizer = dec.model, dec.tokenizer
    limit_n = len(dec.samples) if limit is None else limit
    prompts = [p for s in dec.samples[:limit_n] if (p := prompt_of(s, prompt_len))]
    if not prompts:
        raise AnswerError(f"{data_name}: no sample has a prompt to answer")
    say(f"regenerate: {len(prompts)} prompts, up to {max_new} new tokens each, on {dec.device}")
    answers = greedy_answers(model, prompts, max_new, tokenizer.eos_token_id, batch)
    tmp = out.with_name(f".{out.name}.partial-{os.getpid()}")
    tokens = 0
    with open(tmp, "w") as f:
        for p, a in zip(prompts, answers, strict=True):
            if not a:
                continue
            f.write(json.dumps({"input_ids": p + a, "loss_mask": [0] * len(p) + [1] * len(a)}))
            f.write("\n")
            tokens += len(a)
        f.flush()
        os.fsync(f.fileno())
    if out.exists():
        tmp.unlink()
        raise AnswerError(f"{out}: already exists; regenerate never overwrites")
    os.rename(tmp, out)
    return {"prompts": len(prompts), "answer_tokens": tokens, "out": str(out),
            "seconds": round(time.monotonic() - t0, 1)}  # fmt: skip

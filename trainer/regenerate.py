"""The target's own answers as training data: a drafter is accepted only where it says what
the target would say, so it should learn from what the target says.

    python -m trainer regenerate --config CFG --out FILE.jsonl [--max-new-tokens 128]
                                 [--device cuda:0] [--batch 64] [--limit N] [--set k=v ...]

Each sample of the config's data is cut at its first loss token (the conversation before
the answer, trainer/evaluate.py's `prompt_of`), and the whole target answers it greedily
(with its KV cache). The output is one JSON line per prompt in the `tokens` format
(`input_ids` = prompt + answer, `loss_mask` 0 on the prompt and 1 on the answer), which
`data.path` takes as it is: no re-tokenization can change a token. Prompts of one length go
together, so no padding can change an answer. Written beside the output and renamed into
place; an existing file is never replaced.
"""

from __future__ import annotations

import json
import os
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import torch

from trainer.config import Config
from trainer.evaluate import load_for_decoding, prompt_of
from trainer.export import ExportError


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


def regenerate(
    cfg: Config,
    out: Path,
    max_new: int = 128,
    device: str = "cpu",
    batch: int = 64,
    limit: int | None = None,
    prompt_len: int = 1024,
    say: Any = print,
) -> dict[str, Any]:
    t0 = time.monotonic()
    if out.exists() or out.is_symlink():
        raise ExportError(
            f"{out}: already exists; regenerate never overwrites (choose a new --out)"
        )
    if not out.parent.is_dir():
        raise ExportError(f"{out.parent}: no such folder for --out")
    dec = load_for_decoding(cfg, device, "regenerate")
    model, tokenizer = dec.model, dec.tokenizer
    limit_n = len(dec.samples) if limit is None else limit
    prompts = [p for s in dec.samples[:limit_n] if (p := prompt_of(s, prompt_len))]
    if not prompts:
        raise ExportError(f"{cfg.data.path}: no sample has a prompt to answer")
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
        raise ExportError(f"{out}: already exists; regenerate never overwrites")
    os.rename(tmp, out)
    return {"prompts": len(prompts), "answer_tokens": tokens, "out": str(out),
            "seconds": round(time.monotonic() - t0, 1)}  # fmt: skip

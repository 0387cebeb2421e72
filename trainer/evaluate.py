"""Held-out acceptance length: a run's checkpoint decoding for real on samples it never
trained on (`data.held_out`, trainer/held_out.py), through trainer/speculative.py.

    python -m trainer eval RUN_DIR [--step N] [--prompts 8] [--new-tokens 64] [--device cpu]

Each prompt is a held-out sample up to its first loss token (the conversation before the
assistant's answer), at most `--prompt-len` tokens. The whole target verifies (its logits),
loaded from the run's `target.path`; the drafter is the checkpoint's. The result goes to
`RUN_DIR/eval/step-N.json` (and `export` quotes it in its README). A run that held nothing
out is evaluated on the samples the same rule would have held out, and says that it trained
on them.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from trainer.config import Config
from trainer.data import Sample
from trainer.export import ExportError, checkpoint_of, read_drafter, run_config
from trainer.fsutil import atomic_write_json
from trainer.held_out import split_held_out
from trainer.model import DFlashDrafter
from trainer.speculative import DecodeStats, drafter_proposer, speculative_decode

EVAL_DIR = "eval"


def prompt_of(sample: Sample, prompt_len: int) -> list[int]:
    """The tokens before the first one trained on (a chat's prompt), else the first half."""
    first = next((i for i, m in enumerate(sample.loss_mask) if m), None)
    end = first if first else len(sample.input_ids) // 2
    return sample.input_ids[max(0, end - prompt_len) : end]


def eval_path(run_dir: Path, step: int) -> Path:
    return run_dir / EVAL_DIR / f"step-{step:08d}.json"


@dataclass
class Decoding:
    """What decoding with a run's whole target needs: the model, its tokenizer, and the data's
    samples loaded as training loaded them (the same samples, so the same held-out split)."""

    model: Any
    tokenizer: Any
    dtype: torch.dtype
    device: torch.device
    samples: list[Sample]


def load_for_decoding(cfg: Config, device: str, what: str) -> Decoding:
    from transformers import AutoModelForCausalLM

    from trainer.data import resolve_data_path
    from trainer.target import load_tokenizer, read_target_info, resolve_dtype
    from trainer.tiny_target import resolve_target_path
    from trainer.tokenized import load_tokenized

    try:
        dev = torch.device(device)
        target_path = resolve_target_path(cfg.target.path)
        tokenizer, _mask_id = load_tokenizer(target_path, cfg.drafter.mask_token)
        dtype = resolve_dtype(cfg.target.dtype, dev)
        model = AutoModelForCausalLM.from_pretrained(target_path, dtype=dtype)
        model = model.to(dev).eval()  # type: ignore[arg-type]
        data = load_tokenized(
            resolve_data_path(cfg.data.path), tokenizer, cfg.data.format,
            max(cfg.data.seq_buckets), lambda _m: None,
            cache_root=Path(cfg.data.cache_dir).expanduser() if cfg.data.cache_dir else None,
            use_cache=cfg.data.cache, vocab_size=read_target_info(target_path).vocab_size,
        )  # fmt: skip
    except (ValueError, OSError, RuntimeError) as e:
        raise ExportError(f"{what}: {str(e).splitlines()[0][:200]}") from None
    return Decoding(model, tokenizer, dtype, dev, data.samples)


def evaluate(
    run_dir: Path,
    step: int | None = None,
    prompts: int = 8,
    new_tokens: int = 64,
    prompt_len: int = 512,
    device: str = "cpu",
) -> dict[str, Any]:
    from trainer.config import ConfigError, config_from_dict

    t0 = time.monotonic()
    saved = run_config(run_dir)
    try:
        cfg = config_from_dict(saved, str(run_dir / "config.json"))
    except ConfigError as e:
        raise ExportError(str(e)) from None
    ckpt, chosen = checkpoint_of(run_dir, step)
    arch, state = read_drafter(ckpt)  # before the target loads: a bad checkpoint costs nothing
    dec = load_for_decoding(cfg, device, f"evaluating {run_dir}")
    held_out = cfg.data.held_out
    _, held = split_held_out(dec.samples, held_out or prompts)
    chosen_prompts = [p for s in held if (p := prompt_of(s, prompt_len))][:prompts]
    if not chosen_prompts:
        raise ExportError(f"{run_dir}: no held-out sample has a prompt to decode from")

    model = dec.model
    embed = model.get_input_embeddings().weight
    drafter = DFlashDrafter(arch, embed, model.get_output_embeddings().weight)
    drafter.load_state_dict(state, strict=False)
    drafter = drafter.to(device=dec.device, dtype=dec.dtype).eval()
    propose = drafter_proposer(drafter)
    layer_ids = list(arch.target_layer_ids)
    stats = DecodeStats(arch.block_size)
    for prompt in chosen_prompts:
        _, one = speculative_decode(model, layer_ids, propose, prompt, new_tokens, arch.block_size)
        stats.add(one)
    run_id = saved.get("run", {}).get("run_id", run_dir.name)
    seconds = round(time.monotonic() - t0, 2)
    return write_eval(run_dir, run_id, chosen, held_out > 0, len(chosen_prompts), new_tokens,
                      str(dec.device), stats.summary(), seconds)  # fmt: skip


def write_eval(
    run_dir: Path,
    run_id: str,
    step: int,
    held_out: bool,
    prompts: int,
    new_tokens: int,
    device: str,
    summary: dict[str, Any],  # DecodeStats.summary()
    seconds: float,
    **extra: Any,
) -> dict[str, Any]:
    """eval/step-N.json, the one writer (`python -m trainer eval` and the eval thread,
    trainer/online_eval.py): the record, as written."""
    record = {
        "run_id": run_id, "step": step, "held_out": held_out, "prompts": prompts,
        "new_tokens": new_tokens, "device": device, **summary, "seconds": seconds,
        "at": time.time(), **extra,
    }  # fmt: skip
    out = eval_path(run_dir, step)
    out.parent.mkdir(exist_ok=True)
    atomic_write_json(out, record)
    return record


def describe(r: dict[str, Any]) -> str:
    where = "held-out" if r["held_out"] else "TRAINED-ON (the run held nothing out: data.held_out)"
    shares = " ".join(f"{x:.2f}" for x in r["per_position"][:6])
    return (
        f"step {r['step']}: {where} τ {r['tau']:.2f} of {r['block_size']} over {r['prompts']} "
        f"prompts × {r['new_tokens']} tokens; accepted by position {shares} …; "
        f"{r['tok_s']} tok/s on {r['device']} ({r['seconds']:.1f}s)"
    )

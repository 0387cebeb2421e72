"""Held-out acceptance length: a run's checkpoint decoding for real on samples it never
trained on (`data.held_out`, trainer/data/held_out.py), through trainer/evaluation/speculative.py.

    python -m trainer eval RUN_DIR [--step N] [--prompts 8] [--new-tokens 64] [--device cpu]
                                   [--tree-nodes N]

Each prompt is a held-out sample up to its first loss token (the conversation before the
assistant's answer), at most `--prompt-len` tokens. The whole target verifies (its logits),
loaded from the run's `target.path`; the drafter is the checkpoint's. The prompts decode as
the eval thread decodes them (trainer/evaluation/decoding.py). The result goes to
`RUN_DIR/eval/step-N.json` (and `export` quotes it in its README). A run that held nothing
out is evaluated on the samples the same rule would have held out, and says that it trained
on them.

With a node budget (`--tree-nodes`, else the run's `eval.tree_nodes`), the same prompts are
decoded again with a DDTree draft tree of that many nodes (trainer/evaluation/tree.py), and
the record's `tree` holds its τ beside the chain's.
"""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Any

from trainer.config import Config
from trainer.data.held_out import split_held_out
from trainer.evaluation.decoding import HeldOutDecode
from trainer.evaluation.export import ExportError, checkpoint_of, read_drafter, run_config
from trainer.evaluation.tree import describe_tree, held_out_tree
from trainer.fsutil import atomic_write_json
from trainer.model.drafter import DFlashDrafter
from trainer.targets.answers import Decoding, load_decoding, prompt_of

EVAL_DIR = "eval"


def eval_path(run_dir: Path, step: int, overrides: list[str] | None = None) -> Path:
    """The run's own record of a step; an eval with `--set` overrides gets its own file,
    named after them, so it never replaces the run's record."""
    if not overrides:
        return run_dir / EVAL_DIR / f"step-{step:08d}.json"
    tag = re.sub(r"[^A-Za-z0-9._=-]+", "_", ",".join(overrides))[:120]
    return run_dir / EVAL_DIR / f"step-{step:08d}.set-{tag}.json"


def load_for_decoding(cfg: Config, device: str, what: str) -> Decoding:
    """The run's whole target and data (builtins built on first use), or one line naming
    `what` could not load (ExportError)."""
    from trainer.builtins.resolve import resolve_data_path, resolve_target_path

    try:
        target_path = resolve_target_path(cfg.target.path)
        return load_decoding(cfg, target_path, resolve_data_path(cfg.data.path), device)
    except (ValueError, OSError, RuntimeError) as e:
        raise ExportError(f"{what}: {str(e).splitlines()[0][:200]}") from None


def evaluate(
    run_dir: Path,
    step: int | None = None,
    prompts: int = 8,
    new_tokens: int = 64,
    prompt_len: int = 512,
    device: str = "cpu",
    tree_nodes: int | None = None,  # None: the run's eval.tree_nodes; 0: no tree
    overrides: list[str] | None = None,  # `--set KEY=VALUE`, this eval only
) -> dict[str, Any]:
    from trainer.config import ConfigError, apply_overrides, config_from_dict

    t0 = time.monotonic()
    saved = run_config(run_dir)
    try:
        cfg = config_from_dict(saved, str(run_dir / "config.json"))
        cfg = apply_overrides(cfg, list(overrides or []))
        if tree_nodes is not None:  # checked by the config's own rule
            cfg = apply_overrides(cfg, [f"eval.tree_nodes={tree_nodes}"])
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
    # As the eval thread decodes (trainer/evaluation/decoding.py); graphs where the run's
    # eval.cuda_graphs allows them on this device (a GPU run's "on" is not refused on a CPU).
    decode = HeldOutDecode(model, drafter, chosen_prompts, new_tokens, cfg.eval.cuda_graphs)
    stats = decode.run().total()
    summary = stats.summary()
    if cfg.eval.tree_nodes:
        summary["tree"] = held_out_tree(
            model, decode.layer_ids, drafter, chosen_prompts, new_tokens, cfg.eval.tree_nodes
        )
    run_id = saved.get("run", {}).get("run_id", run_dir.name)
    seconds = round(time.monotonic() - t0, 2)
    extra = {"overrides": list(overrides)} if overrides else {}
    return write_eval(run_dir, run_id, chosen, held_out > 0, len(chosen_prompts), new_tokens,
                      str(dec.device), summary, seconds, **extra)  # fmt: skip


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
    trainer/evaluation/online.py): the record, as written."""
    record = {
        "run_id": run_id, "step": step, "held_out": held_out, "prompts": prompts,
        "new_tokens": new_tokens, "device": device, **summary, "seconds": seconds,
        "at": time.time(), **extra,
    }  # fmt: skip
    out = eval_path(run_dir, step, extra.get("overrides"))
    out.parent.mkdir(exist_ok=True)
    atomic_write_json(out, record)
    return record


def describe(r: dict[str, Any]) -> str:
    where = "held-out" if r["held_out"] else "TRAINED-ON (the run held nothing out: data.held_out)"
    shares = " ".join(f"{x:.2f}" for x in r["per_position"][:6])
    return (
        f"step {r['step']}: {where} τ {r['tau']:.2f} of {r['block_size']} over {r['prompts']} "
        f"prompts × {r['new_tokens']} tokens; accepted by position {shares} …; "
        f"{r['tok_s']} tok/s on {r['device']} ({r['seconds']:.1f}s){describe_tree(r.get('tree'))}"
        + (f" [with {', '.join(r['overrides'])}]" if r.get("overrides") else "")
    )

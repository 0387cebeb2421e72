"""The drafter for serving: a run's checkpoint as the Hugging Face-style folder that
SpecForge's and SGLang's `DFlashDraftModel` load, and such a folder as a warm start.

Both sides are the same network with the same parameter names (`fc`, `hidden_norm`,
`layers.N.self_attn.{q,k,v,o}_proj`, `{q,k}_norm`, `mlp.{gate,up,down}_proj`, `norm`); neither
holds the token embedding nor the lm_head, which are the target's. So the weights travel as
they are, cast to the serving dtype, and the folder's `config.json` says what the checkpoint's
`arch` says in their words (a `Qwen3Config` with `block_size`, `num_target_layers` and
`dflash_config: {target_layer_ids, mask_token_id}`), plus what only the target knows
(`num_target_layers`, `max_position_embeddings`).

An export is written into a temporary folder beside its destination and renamed into place:
a reader sees a whole export or none, and an existing destination is never replaced.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from trainer.contract.checkpoints import CHECKPOINTS, step_of
from trainer.model.checkpoint import checkpoint_path, choose_good_checkpoint, load_checkpoint
from trainer.model.drafter import DrafterArch

DTYPES = {"bfloat16": torch.bfloat16, "float32": torch.float32}
LAYER_KEYS = (
    "input_layernorm.weight",
    "self_attn.q_proj.weight",
    "self_attn.k_proj.weight",
    "self_attn.v_proj.weight",
    "self_attn.o_proj.weight",
    "self_attn.q_norm.weight",
    "self_attn.k_norm.weight",
    "post_attention_layernorm.weight",
    "mlp.gate_proj.weight",
    "mlp.up_proj.weight",
    "mlp.down_proj.weight",
)
PROVENANCE = "dflash_export.json"  # ours: where the weights came from


class ExportError(ValueError):
    """Bad input for export or import: one line naming the thing at fault."""


def expected_shapes(arch: DrafterArch) -> dict[str, tuple[int, ...]]:
    """Every drafter parameter, named as on both sides, with its shape."""
    h, d, i = arch.hidden_size, arch.head_dim, arch.intermediate_size
    q, kv = arch.num_heads * d, arch.num_kv_heads * d
    shapes: dict[str, tuple[int, ...]] = {
        "fc.weight": (h, len(arch.target_layer_ids) * h),
        "hidden_norm.weight": (h,),
        "norm.weight": (h,),
    }
    per_layer = dict(
        zip(LAYER_KEYS, [(h,), (q, h), (kv, h), (kv, h), (h, q), (d,), (d,), (h,), (i, h), (i, h),
                         (h, i)], strict=True)
    )  # fmt: skip
    for n in range(arch.num_layers):
        shapes.update({f"layers.{n}.{k}": s for k, s in per_layer.items()})
    return shapes


def check_weights(state: dict[str, torch.Tensor], arch: DrafterArch, what: str) -> None:
    """All of the drafter's weights, of the right shapes and finite; nothing else."""
    want = expected_shapes(arch)
    missing = sorted(set(want) - set(state))
    extra = sorted(set(state) - set(want))
    if missing or extra:
        parts = ([f"missing {', '.join(missing[:3])}"] if missing else []) + (
            [f"unexpected {', '.join(extra[:3])}"] if extra else []
        )
        raise ExportError(f"{what}: not this drafter's weights ({'; '.join(parts)})")
    for name, shape in want.items():
        t = state[name]
        if tuple(t.shape) != shape:
            raise ExportError(f"{what}: {name} has shape {tuple(t.shape)}, expected {shape}")
        if not bool(torch.isfinite(t).all()):
            raise ExportError(f"{what}: {name} is not finite")


def serving_config(
    arch: DrafterArch, num_target_layers: int, max_positions: int | None, dtype: str,
    mask_token: str | None,
) -> dict[str, Any]:  # fmt: skip
    """The `config.json` SpecForge's DFlashDraftModel (a Qwen3Config) and SGLang's loader read.
    `num_target_layers` matters: without it SGLang refuses layer ids past the draft's depth."""
    n = arch.num_layers
    dflash: dict[str, Any] = {
        "target_layer_ids": list(arch.target_layer_ids),
        "mask_token_id": arch.mask_token_id,
    }
    if mask_token:
        dflash["mask_token"] = mask_token
    return {
        "architectures": ["DFlashDraftModel"],
        "model_type": "qwen3",
        "hidden_size": arch.hidden_size,
        "num_hidden_layers": n,
        "num_attention_heads": arch.num_heads,
        "num_key_value_heads": arch.num_kv_heads,
        "head_dim": arch.head_dim,
        "intermediate_size": arch.intermediate_size,
        "hidden_act": "silu",
        "vocab_size": arch.vocab_size,
        "rms_norm_eps": arch.rms_norm_eps,
        # Both spellings: transformers 5 reads rope_parameters, older serving stacks rope_theta.
        "rope_theta": arch.rope_theta,
        "rope_parameters": {"rope_theta": arch.rope_theta, "rope_type": "default"},
        "rope_scaling": None,
        "max_position_embeddings": max_positions or 40960,
        "attention_bias": False,
        "attention_dropout": 0.0,
        "tie_word_embeddings": False,
        "block_size": arch.block_size,
        "num_target_layers": num_target_layers,
        "layer_types": ["full_attention"] * n,
        "use_sliding_window": False,
        "sliding_window": None,
        "max_window_layers": n,
        "dflash_config": dflash,
        "dtype": dtype,
    }


@dataclass(frozen=True)
class Exported:
    out: Path
    step: int
    checkpoint: Path
    dtype: str
    tensors: int
    bytes: int
    seconds: float

    def describe(self) -> str:
        return (
            f"exported step {self.step} ({self.tensors} tensors, {self.bytes / 1e6:.1f} MB "
            f"{self.dtype}) from {self.checkpoint} to {self.out} in {self.seconds:.1f}s"
        )


def run_config(run_dir: Path) -> dict[str, Any]:
    if not run_dir.is_dir():
        raise ExportError(f"{run_dir}: no such run dir")
    try:
        config: dict[str, Any] = json.loads((run_dir / "config.json").read_text())
    except (OSError, ValueError) as e:
        raise ExportError(f"{run_dir}: not a run dir (config.json: {e})") from None
    return config


def checkpoint_of(run_dir: Path, step: int | None) -> tuple[Path, int]:
    if step is not None:
        path = checkpoint_path(run_dir, step)
        if not path.is_file():
            folder = run_dir / CHECKPOINTS
            have = sorted(
                s for p in (folder.iterdir() if folder.is_dir() else []) if p.suffix == ".pt"
                if (s := step_of(p.name)) is not None
            )  # fmt: skip
            listed = ", ".join(map(str, have[-8:])) or "none"
            raise ExportError(f"{run_dir}: no checkpoint at step {step} (steps: {listed})")
        return path, step
    choice = choose_good_checkpoint(run_dir)
    if choice.name is None or choice.step is None:
        why = "; ".join(f"{n}: {w}" for n, w in choice.skipped) or "it has none"
        raise ExportError(f"{run_dir}: no good checkpoint to export ({why})")
    return run_dir / choice.name, choice.step


def read_drafter(ckpt: Path) -> tuple[DrafterArch, dict[str, torch.Tensor]]:
    """A checkpoint's drafter: its shape and its weights, all there, shaped right, finite."""
    try:
        data = load_checkpoint(ckpt)
        arch = DrafterArch.from_dict(data["arch"])
        state: dict[str, torch.Tensor] = data["model"]
    except (OSError, ValueError, RuntimeError, KeyError, TypeError) as e:
        raise ExportError(
            f"{ckpt}: unreadable checkpoint ({str(e).splitlines()[0][:160]})"
        ) from None
    check_weights(state, arch, str(ckpt))
    return arch, state


def _target_facts(config: dict[str, Any]) -> tuple[int, int | None, str, str]:
    """(num_layers, max_positions, target path, sha256 of its config.json) of the run's target."""
    from trainer.builtins.resolve import resolve_target_path
    from trainer.targets.load import read_target_info

    path_s = str(config.get("target", {}).get("path", ""))
    try:
        folder = resolve_target_path(path_s)
        info = read_target_info(folder)
        digest = hashlib.sha256((folder / "config.json").read_bytes()).hexdigest()
    except (ValueError, OSError) as e:
        msg = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise ExportError(f"the run's target {path_s!r} is needed for its shape: {msg}") from None
    return info.num_layers, info.max_positions, path_s, digest


def export_drafter(
    run_dir: Path, out: Path, step: int | None = None, dtype: str = "bfloat16"
) -> Exported:
    from safetensors.torch import save_file

    t0 = time.monotonic()
    if dtype not in DTYPES:
        raise ExportError(f"--dtype {dtype!r}: one of {', '.join(DTYPES)}")
    if out.exists() or out.is_symlink():
        raise ExportError(f"{out}: already exists; an export never overwrites (choose a new --out)")
    if not out.parent.is_dir():
        raise ExportError(f"{out.parent}: no such folder for --out")
    config = run_config(run_dir)
    ckpt, chosen = checkpoint_of(run_dir, step)
    arch, state = read_drafter(ckpt)
    num_target_layers, max_positions, target_path, target_sha = _target_facts(config)
    mask_token = config.get("drafter", {}).get("mask_token") or None
    held_eval = _held_out_eval(run_dir, chosen)
    tensors = {k: v.to(DTYPES[dtype]).contiguous() for k, v in state.items()}

    tmp = out.with_name(f".{out.name}.partial-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    try:
        save_file(tensors, str(tmp / "model.safetensors"), metadata={"format": "pt"})
        os.chmod(tmp / "model.safetensors", 0o644)  # safetensors makes it owner-only
        cfg = serving_config(arch, num_target_layers, max_positions, dtype, mask_token)
        (tmp / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
        run_id = config.get("run", {}).get("run_id", run_dir.name)
        provenance = {
            "run_id": run_id,
            "step": chosen,
            "checkpoint": str(ckpt.resolve()),
            "target": {"path": target_path, "config_sha256": target_sha},
            "dtype": dtype,
            "held_out_eval": held_eval,  # `python -m trainer eval` of this step, if run
            "exported_at": time.time(),
        }
        (tmp / PROVENANCE).write_text(json.dumps(provenance, indent=2) + "\n")
        (tmp / "README.md").write_text(
            _readme(run_id, chosen, arch, target_path, target_sha, dtype, held_eval)
        )
        for f in tmp.iterdir():
            with open(f, "rb") as fh:
                os.fsync(fh.fileno())
        if out.exists():  # appeared meanwhile: keep theirs
            raise ExportError(f"{out}: already exists; an export never overwrites")
        os.rename(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    size = (out / "model.safetensors").stat().st_size
    return Exported(out, chosen, ckpt, dtype, len(tensors), size, time.monotonic() - t0)


def _held_out_eval(run_dir: Path, step: int) -> dict[str, Any] | None:
    """`python -m trainer eval`'s record of this step (trainer/evaluation/acceptance.py),
    if it ran."""
    path = run_dir / "eval" / f"step-{step:08d}.json"
    try:
        data = json.loads(path.read_bytes()[: 1 << 20])
    except (OSError, ValueError):
        return None
    ok = isinstance(data, dict) and isinstance(data.get("tau"), int | float)
    return data if ok else None


def _tau_line(held_eval: dict[str, Any] | None) -> str:
    if held_eval is None:
        return (
            "not measured for this step (`python -m trainer eval RUN_DIR --step N` measures\n"
            "  it, and a later export quotes it)"
        )
    where = "held-out" if held_eval.get("held_out") else "trained-on (the run held nothing out)"
    return (
        f"**{held_eval['tau']:.2f}** of {held_eval.get('block_size')} on {where} samples\n"
        f"  ({held_eval.get('prompts')} prompts × {held_eval.get('new_tokens')} new tokens, "
        "greedy verification)"
    )


def _readme(
    run_id: str,
    step: int,
    arch: DrafterArch,
    target: str,
    target_sha: str,
    dtype: str,
    held_eval: dict[str, Any] | None,
) -> str:
    ids = ", ".join(map(str, arch.target_layer_ids))
    return f"""# DFlash drafter from run {run_id}, step {step}

A block-diffusion drafter: {arch.num_layers} layers, hidden size {arch.hidden_size}, block size
{arch.block_size}, mask token id {arch.mask_token_id}, reading target layers [{ids}].

- **Target it belongs to**: `{target}` (sha256 of its config.json: `{target_sha}`). It uses
  that target's token embedding and lm_head, which are not in this folder: serve it only
  with that target and its tokenizer.
- **Format**: `config.json` and `model.safetensors` ({dtype}) as SpecForge's and SGLang's
  `DFlashDraftModel` load them (`architectures: ["DFlashDraftModel"]`, `dflash_config`).
- **Acceptance length τ** (tokens per target verify step, bonus included): {_tau_line(held_eval)}.
- **Provenance**: `{PROVENANCE}` (run, step, checkpoint, target).
"""


# -- warm start: a SpecForge/SGLang DFlash folder seeds our drafter ---------------------------


def read_draft_folder(folder: Path) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """(its config.json, its weights with any `model.`/`draft_model.` prefix stripped)."""
    from safetensors.torch import load_file

    try:
        cfg: dict[str, Any] = json.loads((folder / "config.json").read_text())
    except (OSError, ValueError) as e:
        raise ExportError(f"drafter.init_from: {folder}: no readable config.json ({e})") from None
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise ExportError(f"drafter.init_from: {folder}: no .safetensors weights")
    state: dict[str, torch.Tensor] = {}
    for f in files:
        try:
            loaded = load_file(str(f))
        except Exception as e:  # a torn or foreign file
            raise ExportError(f"drafter.init_from: {f}: unreadable ({e})") from None
        for key, v in loaded.items():
            name = key
            for prefix in ("draft_model.", "model."):
                name = name.removeprefix(prefix)
            state[name] = v
    return cfg, state


def check_draft_config(cfg: dict[str, Any], arch: DrafterArch, where: str) -> None:
    """A folder's config agrees with the drafter this run builds, or it is refused: loading
    weights into a differently shaped or differently wired network would train nonsense."""
    if cfg.get("architectures", ["DFlashDraftModel"])[0] != "DFlashDraftModel":
        raise ExportError(
            f"{where}: architectures {cfg.get('architectures')} is not a DFlash drafter"
        )
    if cfg.get("attention_bias"):
        raise ExportError(f"{where}: attention_bias = true (this drafter has no biases)")
    kinds = set(cfg.get("layer_types") or ["full_attention"])
    if kinds != {"full_attention"} or cfg.get("use_sliding_window"):
        raise ExportError(f"{where}: sliding-window layers {sorted(kinds)} (this drafter has none)")
    dflash = cfg.get("dflash_config") or {}
    if dflash.get("projector_type"):
        raise ExportError(f"{where}: dflash_config.projector_type {dflash['projector_type']!r}")
    theta = cfg.get("rope_theta") or (cfg.get("rope_parameters") or {}).get("rope_theta")
    pairs = {
        "hidden_size": (cfg.get("hidden_size"), arch.hidden_size),
        "num_hidden_layers": (cfg.get("num_hidden_layers"), arch.num_layers),
        "num_attention_heads": (cfg.get("num_attention_heads"), arch.num_heads),
        "num_key_value_heads": (cfg.get("num_key_value_heads"), arch.num_kv_heads),
        "head_dim": (cfg.get("head_dim"), arch.head_dim),
        "intermediate_size": (cfg.get("intermediate_size"), arch.intermediate_size),
        "block_size": (cfg.get("block_size", dflash.get("block_size")), arch.block_size),
        "dflash_config.mask_token_id": (dflash.get("mask_token_id"), arch.mask_token_id),
        "dflash_config.target_layer_ids": (
            list(dflash.get("target_layer_ids") or []), list(arch.target_layer_ids)),
        "rope_theta": (float(theta) if theta is not None else None, float(arch.rope_theta)),
    }  # fmt: skip
    for key, (theirs, ours) in pairs.items():
        if theirs != ours:
            raise ExportError(f"{where}: {key} = {theirs!r}, this run's drafter has {ours!r}")


def warm_start(model: torch.nn.Module, arch: DrafterArch, folder: Path) -> int:
    """Load a SpecForge/SGLang-format DFlash folder's weights into `model` (before any
    replica copies it). Returns how many tensors it loaded."""
    where = f"drafter.init_from: {folder}"
    cfg, state = read_draft_folder(folder)
    check_draft_config(cfg, arch, where)
    check_weights(state, arch, where)
    result = model.load_state_dict(state, strict=False)
    frozen = {"embed_weight", "lm_head_weight"}
    if result.unexpected_keys or set(result.missing_keys) - frozen:
        raise ExportError(f"{where}: weights do not fit ({result})")
    return len(state)

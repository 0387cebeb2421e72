"""The whole target for verification, built around the truncated one training already holds.

Training loads the target's layers 0..max(layer_ids) only (trainer/targets/load.py); verifying a
drafter's proposals needs the target's own logits, so every layer, the final norm and the
lm_head. Loading a second copy would double the target's memory (a 27B target on one GPU:
54 GB more); instead the truncated model's modules are reused as they are (the same
tensors, shared with the training thread, read-only) and only the dropped layers are read
from the checkpoint: 2 of 64 layers for the 27B config, 2 of 36 for the 8B one.

The result is an ordinary HF `*ForCausalLM` of the full text config, so HF's own forward
builds the masks (causal; Gated DeltaNet's) exactly as for a model loaded whole: a test
compares its logits with `from_pretrained` of the whole checkpoint.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import torch
from torch import nn

from trainer.targets import fp8 as fp8_weights
from trainer.targets.files import checkpoint_files
from trainer.targets.load import LoadedTarget, text_config


def _layer_tensors(path: Path, layers: range) -> dict[int, dict[str, torch.Tensor]]:
    """{layer index: {name inside the layer: tensor}} for `layers`, from the checkpoint,
    whichever prefix it saves the text model under (`model.` or the multimodal wrapper's
    `model.language_model.`)."""
    from safetensors import safe_open

    wanted = set(layers)
    pattern = re.compile(r"^(?:model\.language_model\.|model\.)layers\.(\d+)\.(.+)$")
    out: dict[int, dict[str, torch.Tensor]] = {i: {} for i in layers}
    for file in checkpoint_files(path):
        with safe_open(str(file), framework="pt", device="cpu") as f:
            for key in f.keys():  # noqa: SIM118 (safe_open has no __iter__)
                m = pattern.match(key)
                if m and int(m.group(1)) in wanted:
                    out[int(m.group(1))][m.group(2)] = f.get_tensor(key)
    return out


def whole_target(loaded: LoadedTarget, dtype: torch.dtype, device: torch.device) -> Any:
    """The full `*ForCausalLM`, sharing every module the truncated `loaded.model` has."""
    from transformers import AutoModelForCausalLM

    trunc = loaded.model
    if trunc is None or loaded.path is None:
        raise ValueError("the loaded target keeps no model to verify with")
    config = text_config(loaded.path)
    keep = len(trunc.model.layers)
    full = config.num_hidden_layers
    if keep == full:
        return trunc  # nothing was dropped
    # A skeleton on "meta" whose every tensor is replaced below, built without a dtype: given
    # one, HF sets the process's default dtype while it builds, and a compiled target layer
    # (target.compile) running on its own thread meanwhile fails its guard on that global and
    # recompiles (seen on the H200: 4 graphs recompiled as the eval thread started).
    config.dtype = None
    if hasattr(config, "quantization_config"):  # an FP8 checkpoint: its scales folded below
        del config.quantization_config
    with torch.device("meta"):
        whole: Any = AutoModelForCausalLM.from_config(config)
    base = whole.model
    for name in ("embed_tokens", "norm", "rotary_emb"):
        setattr(base, name, getattr(trunc.model, name))
    whole.lm_head = trunc.lm_head
    layer_cls = type(trunc.model.layers[0])
    tensors = _layer_tensors(loaded.path, range(keep, full))
    absent = [i for i in range(keep, full) if not tensors[i]]
    if absent:  # a checkpoint cut to the layers training reads (or damaged): refuse first
        raise ValueError(
            f"target {loaded.path}: layer {absent[0]} of {full} is not in its .safetensors "
            f"files; verifying needs every layer (training reads only 0..{keep - 1})"
        )
    layers: list[nn.Module] = list(trunc.model.layers)
    for i in range(keep, full):
        with torch.device(device):
            layer = layer_cls(config, i).to(dtype)
        # An FP8 checkpoint's block-scaled weights, dequantised (its scales would not match).
        state = fp8_weights.fold_block_scales(tensors[i], dtype)
        missing, unexpected = layer.load_state_dict(state, strict=False)
        if missing or unexpected:  # a wrong mapping would leave random weights: refuse
            names = sorted(missing)[:3] or sorted(unexpected)[:3]
            raise ValueError(f"target {loaded.path}: layer {i}'s weights do not match: {names}")
        if loaded.fp8 is not None:  # FP8 like the layers it joins (`target.dtype = "fp8"`)
            fp8_weights.convert_linears(layer)
        layers.append(layer.eval().requires_grad_(False))
    base.layers = nn.ModuleList(layers)
    left = [n for n, t in [*whole.named_parameters(), *whole.named_buffers()] if t.is_meta]
    if left:
        raise ValueError(f"target {loaded.path}: not loaded for verification: {left[:3]}")
    return whole.eval()

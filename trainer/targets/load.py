"""The frozen target: loaded truncated to the highest layer the drafter reads.

The drafter reads `hidden_states[id + 1]` (the output of decoder layer `id`) for each chosen
layer. Layers above the highest id are never loaded and never run: for a 64-layer 27B target
read at layers up to 61, that is 2 layers of weights and compute saved; for the lm_head (the
largest single matmul) all of it: the target's own logits are never computed.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from trainer.targets import fp8 as fp8_weights
from trainer.targets.files import checkpoint_files
from trainer.targets.packing import (
    DocBounds,
    HybridLayerParts,
    PackedDocs,
    hybrid_layer_packed,
    install_packed_attention,
    varlen_supported,
)


def default_target_layer_ids(num_target_layers: int, num_draft_layers: int) -> list[int]:
    """DFlash's spread: round(1 + i*(L-4)/(n-1)) for i in 0..n-1, or L//2 for one layer."""
    if num_draft_layers == 1:
        return [num_target_layers // 2]
    span = num_target_layers - 4
    # Python's round (half to even), as the reference implementation uses.
    return [round(1 + i * span / (num_draft_layers - 1)) for i in range(num_draft_layers)]


def resolve_packed_attention(name: str, device: torch.device, dtype: torch.dtype) -> str:
    """`target.packed_attention` for a target on `device` in `dtype`: "varlen" or "mask".
    "varlen" named where it cannot run is bad input (a one-line ValueError)."""
    if name == "mask":
        return "mask"
    why = varlen_supported(device, dtype)
    if why is None:
        return "varlen"
    if name == "auto":
        return "mask"
    raise ValueError(f"target.packed_attention: 'varlen': {why}; use 'auto' or 'mask'")


def resolve_dtype(name: str, device: torch.device) -> torch.dtype:
    """The target's dtype: its activations', and every weight's but FP8 decoder linears'
    ("fp8": bf16 around them, trainer/targets/fp8.py)."""
    if name == "fp8":
        return torch.bfloat16
    if name == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    return {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}[name]


def _rope_theta(config: Any) -> float:
    """The RoPE base; default RoPE only. Qwen3.5/3.6 also carry `mrope_section` and
    `partial_rotary_factor`: on text positions (the same for T, H and W) their multimodal
    RoPE is exactly default RoPE, on that fraction of each full-attention head, which HF's
    own attention applies. The drafter's RoPE is its own."""
    theta = getattr(config, "rope_theta", None)
    params = getattr(config, "rope_parameters", None) or {}
    if theta is None:
        theta = params.get("rope_theta")
    rope_type = params.get("rope_type", params.get("type", "default"))
    if rope_type not in (None, "default"):
        raise ValueError(f"target rope type {rope_type!r} is not supported (only default RoPE)")
    if theta is None:
        raise ValueError("target config has no rope_theta")
    return float(theta)


@dataclass
class TargetInfo:
    num_layers: int  # of the full model, before truncation
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    rms_norm_eps: float
    rope_theta: float
    tied_embeddings: bool = False
    model_type: str = "qwen3"  # of the text model: "qwen3" or "qwen3_5_text"
    layer_types: tuple[str, ...] = ()  # "full_attention" / "linear_attention", when hybrid
    max_positions: int | None = None  # max_position_embeddings, where the config says


class TargetFeatures(nn.Module):
    """Runs the truncated target and returns the chosen layers' outputs, concatenated.

    The decoder layers are called directly (embedding, rotary, layers): no attention mask
    and no packed-sequence check are built, which in HF's forward cost a host sync per
    batch. Right padding needs no mask: attention is causal and padded positions are never
    read by a block (anchors lie inside the sequence). Qwen3 (full attention) and the
    Qwen3.5/3.6 hybrid (Gated DeltaNet and full attention) run through the same loop: HF's
    decoder layers take the same call. Tests check the result against HF's own
    `output_hidden_states`, and a packed row against its documents run alone.
    """

    def __init__(
        self,
        base: nn.Module,
        layer_ids: list[int],
        full_num_layers: int,
        packed_attention: str = "mask",
    ) -> None:
        super().__init__()
        self.base = base
        # How a packed row's full-attention layers keep documents apart: "varlen" (torch's
        # varlen flash kernel, given the documents' boundaries; CUDA) or "mask" (a boolean
        # block-diagonal mask through SDPA). `resolve_packed_attention` chose it.
        self.packed_attention = packed_attention
        self.packed_kernel = "varlen"  # which of targets/packing.PACKED_KERNELS (bench: flex)
        # `compile_layers`: compiled wrappers of the full-attention layers, for this forward
        # only (the eval's whole target calls the same layers, eagerly).
        self.compiled: list[Any] | None = None
        self.hybrid_parts: list[HybridLayerParts | None] | None = None
        if packed_attention != "mask":
            install_packed_attention()
        self.layer_ids = list(layer_ids)
        # HF's hidden_states[L] (the very last one) is the *normed* final output; a truncated
        # model would not norm it, so emulate that for an explicitly chosen last layer.
        self.norm_last = full_num_layers - 1 in self.layer_ids
        # Which layers are Gated DeltaNet (only those need the packed path's token mixer).
        layers: Any = base.layers
        self.linear = [getattr(layer, "linear_attn", None) is not None for layer in layers]
        # Multimodal RoPE (Qwen3.5/3.6): transformers 5.17's rotary indexes a (3, B, S)
        # position tensor and fails on (B, S); 5.24 expands either. A text-only row has the
        # same position on all three axes.
        self.mrope = getattr(getattr(base, "config", None), "model_type", "").startswith("qwen3_5")

    def compile_layers(self) -> None:
        """Compile each full-attention decoder layer (`target.compile`): one graph for the
        layers of one shape where dynamo can share it. A Gated DeltaNet layer on a packed
        row has its norms and MLP compiled around fla's eager kernels (`HybridLayerParts`);
        unpacked, it stays eager. The first forward of each shape compiles (the warm-up's,
        `warm_up_targets`)."""
        layers: Any = self.base.layers
        self.compiled = [
            layer if self.linear[i] else torch.compile(layer, dynamic=False)
            for i, layer in enumerate(layers)
        ]
        self.hybrid_parts = [
            HybridLayerParts(layer) if self.linear[i] else None for i, layer in enumerate(layers)
        ]

    def packed_docs(self, position_ids: Tensor | None, device: torch.device) -> PackedDocs | None:
        """What `forward` needs of a packed batch for varlen attention, built from its
        host-side `position_ids` before they are copied (so the forward never waits on the
        GPU for them); None when this target does not run varlen."""
        if position_ids is None or self.packed_attention != "varlen":
            return None
        return PackedDocs.from_positions(position_ids, device)

    @torch.no_grad()
    def forward(
        self,
        input_ids: Tensor,
        position_ids: Tensor | None = None,
        docs: PackedDocs | None = None,
    ) -> Tensor:
        """int64 [B, S] -> [B, S, n*H].

        `position_ids` (int64 [B, S]) packs several documents in a row: each starts where
        its position is 0 (and at column 0). Every document's features are then exactly
        those of the document alone: full attention keeps to each document (varlen
        attention on the documents' boundaries, `docs` when given, else a block-diagonal
        causal mask) and RoPE reads the restarting positions; Gated DeltaNet layers keep
        documents apart (`targets/packing.py`). None (no packing): one document per row, no
        mask built.
        """
        base: Any = self.base
        hidden = base.embed_tokens(input_ids)
        bounds: DocBounds | None = None
        mask: Tensor | None = None
        attn_kwargs: dict[str, Any] = {}
        if position_ids is None:
            positions = torch.arange(input_ids.shape[1], device=input_ids.device)[None]
        else:
            positions = position_ids
            if self.packed_attention == "varlen":
                if docs is None:
                    docs = PackedDocs.from_positions(position_ids, input_ids.device)
                attn_kwargs = {"dflash_docs": docs, "dflash_kernel": self.packed_kernel}
            else:
                mask = DocBounds.from_positions(position_ids).attention_mask()
            if any(self.linear):
                bounds = DocBounds.from_positions(position_ids)
        rope_positions = positions
        if self.mrope:  # Qwen3.5's rotary takes (3, B, S): text positions on all three axes
            rope_positions = positions[None].expand(3, *positions.shape)
        rope = base.rotary_emb(hidden, rope_positions)
        wanted = set(self.layer_ids)
        captured: dict[int, Tensor] = {}
        for i, layer in enumerate(base.layers):
            if bounds is not None and self.linear[i]:
                parts = None if self.hybrid_parts is None else self.hybrid_parts[i]
                hidden = hybrid_layer_packed(layer, hidden, bounds, parts)
            else:
                call = layer if self.compiled is None else self.compiled[i]
                out = call(
                    hidden,
                    attention_mask=mask,
                    position_ids=positions,
                    position_embeddings=rope,
                    **attn_kwargs,
                )
                hidden = out[0] if isinstance(out, tuple) else out
            if i in wanted:
                captured[i] = hidden
        feats = []
        for i in self.layer_ids:
            h = captured[i]
            if self.norm_last and i == max(self.layer_ids):
                h = base.norm(h)
            feats.append(h)
        return torch.cat(feats, dim=-1)


@dataclass
class LoadedTarget:
    features: TargetFeatures | NoFeatures
    embed_weight: Tensor
    lm_head_weight: Tensor
    info: TargetInfo
    layer_ids: list[int]
    # The truncated HF model itself (its norm and lm_head loaded): trainer/targets/whole.py
    # adds the dropped layers to it for the held-out eval's verification.
    model: Any = None
    path: Path | None = None
    # What went FP8 (`target.dtype = "fp8"`); None for a target in one dtype.
    fp8: fp8_weights.Fp8Report | None = None


# The architectures a target may be saved as (config.json's `architectures`), by the
# `model_type` of its config. The multimodal Qwen3.5/3.6 wrapper keeps its text model under
# `text_config`; only that text model is loaded.
SUPPORTED = {
    "qwen3": "Qwen3ForCausalLM",
    "qwen3_5_text": "Qwen3_5ForCausalLM",
    "qwen3_5": "Qwen3_5ForConditionalGeneration",
}


def text_config(path: Path) -> Any:
    """The config of the target's text model; a one-line ValueError for anything else."""
    from transformers import AutoConfig

    try:
        config = AutoConfig.from_pretrained(path)
    except Exception as e:  # transformers raises OSError, ValueError, KeyError, ...
        why = str(e).strip().splitlines()[0][:200] if str(e).strip() else type(e).__name__
        raise ValueError(f"target.path: {str(path)!r}: cannot read its config ({why})") from None
    model_type = getattr(config, "model_type", None)
    if model_type not in SUPPORTED:
        arch = ", ".join(getattr(config, "architectures", None) or []) or "?"
        known = ", ".join(SUPPORTED.values())
        raise ValueError(
            f"target {path}: architecture {arch} (model_type {model_type!r}) is not supported;"
            f" supported: {known}"
        )
    if model_type != "qwen3_5":
        return config
    text = copy.deepcopy(config.get_text_config())
    # The wrapper's own flag is the one HF ties (or not) the wrapper's lm_head by; the text
    # model built from `text` must agree, or it would tie a head the checkpoint has apart.
    text.tie_word_embeddings = bool(config.tie_word_embeddings)
    return text


def read_target_info(path: Path) -> TargetInfo:
    """The target's shape from its (text) config; a config that cannot be read, of an
    unsupported architecture or lacking a field is bad input: a one-line ValueError."""
    c = text_config(path)
    try:
        return target_info_of(c)
    except Exception as e:  # a field missing or of the wrong type
        why = str(e).strip().splitlines()[0][:200] if str(e).strip() else type(e).__name__
        raise ValueError(f"target.path: {str(path)!r}: cannot read its config ({why})") from None


def target_info_of(c: Any) -> TargetInfo:
    """The shape of a (text) config object; read_target_info reads one from a folder, the
    scaling model builds one in memory (bench/scaling.py)."""
    layer_types = getattr(c, "layer_types", None) or []
    hybrid = any(t != "full_attention" for t in layer_types)
    return TargetInfo(
        num_layers=c.num_hidden_layers,
        hidden_size=c.hidden_size,
        num_heads=c.num_attention_heads,
        num_kv_heads=getattr(c, "num_key_value_heads", c.num_attention_heads),
        head_dim=getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads,
        intermediate_size=c.intermediate_size,
        vocab_size=c.vocab_size,
        rms_norm_eps=getattr(c, "rms_norm_eps", 1e-6),
        rope_theta=_rope_theta(c),
        tied_embeddings=bool(getattr(c, "tie_word_embeddings", False)),
        model_type=c.model_type,
        layer_types=tuple(layer_types) if hybrid else (),
        max_positions=getattr(c, "max_position_embeddings", None),
    )


def check_layer_ids(layer_ids: list[int], num_layers: int) -> None:
    bad = [i for i in layer_ids if not 0 <= i < num_layers]
    if bad:
        raise ValueError(
            f"drafter.target_layer_ids: {bad} outside the target's layers 0..{num_layers - 1}"
        )
    if len(set(layer_ids)) != len(layer_ids):
        raise ValueError(f"drafter.target_layer_ids: duplicates in {layer_ids}")


def load_target(
    path: Path,
    layer_ids: list[int],
    dtype: torch.dtype,
    device: torch.device,
    packed_attention: str = "auto",
    fp8: bool = False,
) -> LoadedTarget:
    """Load the text model's layers 0..max(layer_ids) only, through HF's `from_pretrained`.

    The text config (the wrapper's `text_config` for Qwen3.5/3.6) is truncated and handed to
    `AutoModelForCausalLM`, which builds the text-only model (`Qwen3_5ForCausalLM` for the
    wrapper): HF renames the wrapper's `model.language_model.*` weights to `model.*`, and
    the vision tower's and the dropped layers' tensors match nothing, so they are never
    materialized (safetensors slices are read lazily, per matched key).

    `fp8` (`target.dtype = "fp8"`): the decoder layers' linears become row-scaled FP8
    (trainer/targets/fp8.py). A checkpoint in transformers' FP8 format is read by our own
    reader whatever the dtype: HF's loader is handed the config without its
    `quantization_config` (its own FP8 layers are not ours), and the block-scaled weights it
    cast without their scales are replaced.
    """
    from transformers import AutoModelForCausalLM

    block_scaled = fp8_weights.quantization_config(path) is not None
    config = text_config(path)
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    full = config.num_hidden_layers
    check_layer_ids(layer_ids, full)
    keep = max(layer_ids) + 1
    config.num_hidden_layers = keep
    if isinstance(getattr(config, "layer_types", None), list):
        config.layer_types = config.layer_types[:keep]
    # The dropped layers' weights are expected to go unused: no warning per tensor, and no
    # progress bars in train.log.
    from transformers.utils import logging as tf_logging

    verbosity = tf_logging.get_verbosity()
    tf_logging.set_verbosity_error()
    tf_logging.disable_progress_bar()
    try:
        loaded: Any = AutoModelForCausalLM.from_pretrained(
            path, config=config, dtype=dtype, output_loading_info=True
        )
        model, loading = loaded
    finally:
        tf_logging.set_verbosity(verbosity)
    if loading["missing_keys"]:
        # A wrong mapping would otherwise leave random weights in place, silently.
        missing = sorted(loading["missing_keys"])
        raise ValueError(f"target {path}: weights missing from the checkpoint: {missing[:4]}")
    model.to(device).eval().requires_grad_(False)
    base = model.model
    report = None
    if block_scaled:
        report = fp8_weights.load_block_scaled(base.layers, path, 0, fp8, dtype)
    elif fp8:
        report = fp8_weights.convert_linears(base.layers)
    if report is not None and device.type == "cuda":
        # The bf16 weights just replaced go back to the driver, not to the allocator's cache:
        # on the H200 the 27B FP8 run held 112.7 GB against bf16's 91.1 (12-04).
        torch.cuda.empty_cache()
    packed = resolve_packed_attention(packed_attention, device, dtype)
    if packed == "varlen" and base.config._attn_implementation != "sdpa":
        # HF calls another attention function than the one varlen is registered as.
        if packed_attention == "varlen":
            raise ValueError(
                "target.packed_attention: 'varlen': the target's attention implementation is "
                f"{base.config._attn_implementation!r}, not 'sdpa'"
            )
        packed = "mask"
    embed = base.embed_tokens.weight
    head = model.get_output_embeddings().weight
    info = read_target_info(path)
    return LoadedTarget(
        features=TargetFeatures(base, layer_ids, full, packed),
        embed_weight=embed,
        lm_head_weight=head,
        info=info,
        layer_ids=list(layer_ids),
        model=model,
        path=path,
        fp8=report if fp8 else None,
    )


class NoFeatures:
    """A drafter rank's stand-in for the target's layers: it holds the embedding and head
    only (processes mode), and never runs a target forward."""

    packed_attention = "mask"

    def __call__(
        self, input_ids: Tensor, position_ids: Tensor | None = None, docs: Any = None
    ) -> Tensor:
        raise RuntimeError("this process loaded the target's embedding and head only")

    def packed_docs(self, position_ids: Tensor | None, device: torch.device) -> None:
        return None


# Where a checkpoint keeps the text model's embedding and head: `model.` for Qwen3 and the
# text-only Qwen3.5, `model.language_model.` for the multimodal wrapper.
_EMBED_KEYS = ("model.embed_tokens.weight", "model.language_model.embed_tokens.weight")
_HEAD_KEYS = ("lm_head.weight", "model.language_model.lm_head.weight")


def load_embeddings(path: Path, dtype: torch.dtype, device: torch.device) -> LoadedTarget:
    """The target's input embedding and output head only, read from its .safetensors by
    name: what a drafter rank shares with the target (DFlash's drafter reuses both, frozen).
    A drafter rank of a 27B target would otherwise hold ~50 GB of layers it never runs."""
    from safetensors import safe_open

    info = read_target_info(path)
    found: dict[str, Tensor] = {}
    for file in checkpoint_files(path):
        with safe_open(str(file), framework="pt", device="cpu") as f:
            names = set(f.keys())
            for name, candidates in (("embed", _EMBED_KEYS), ("head", _HEAD_KEYS)):
                key = next((k for k in candidates if k in names), None)
                if key is not None and name not in found:
                    found[name] = f.get_tensor(key)
    if "head" not in found and info.tied_embeddings and "embed" in found:
        found["head"] = found["embed"]
    shape = (info.vocab_size, info.hidden_size)
    for name, keys in (("embed", _EMBED_KEYS), ("head", _HEAD_KEYS)):
        tensor = found.get(name)
        if tensor is None:
            raise ValueError(f"target {path}: no {' or '.join(keys)} in its .safetensors")
        if tuple(tensor.shape) != shape:
            raise ValueError(
                f"target {path}: {name} weight is {tuple(tensor.shape)}, its config says {shape}"
            )
    embed = found["embed"].to(device=device, dtype=dtype)
    head = embed if found["head"] is found["embed"] else found["head"].to(device, dtype)
    return LoadedTarget(
        features=NoFeatures(),
        embed_weight=embed,
        lm_head_weight=head,
        info=info,
        layer_ids=[],
        path=path,
    )


def load_tokenizer(path: Path, mask_token: str) -> tuple[Any, int]:
    """The target's tokenizer, with a mask token added when it has none. Returns (tok, mask id)."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(path)
    # The data loader truncates (and counts) long samples itself: the tokenizer's "longer
    # than the specified maximum" warning would only be noise in train.log.
    tok.model_max_length = 1 << 62
    if tok.mask_token_id is None:
        tok.add_special_tokens({"mask_token": mask_token})
    return tok, int(tok.mask_token_id)

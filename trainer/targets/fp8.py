"""The target's decoder linears in FP8 (`target.dtype = "fp8"`, opt-in).

The target is frozen and only runs forwards, so its decoder linears can run as serving runs
them: float8_e4m3fn weights with one fp32 scale per output row, each forward's activations
quantised per token (one scale per row of the input), multiplied by torch's own
`torch._scaled_mm` (row-wise scales, bf16 out). The embedding, the final norm and the lm_head
(the drafter shares the embedding and the head) stay bf16, and so does every other op.

Two sources of the FP8 weights:
- a bf16 checkpoint, quantised row-wise at load (`convert_linears`);
- a checkpoint in transformers' FP8 format (`quantization_config.quant_method = "fp8"`, a
  float8 `weight` and an fp32 `weight_scale_inv` per 128x128 block, as Qwen publishes its
  FP8 models), read by `load_block_scaled`: each block-scaled weight is dequantised and
  requantised row-wise, so one kernel serves both. Under another `target.dtype` the same
  reader gives the dequantised weights in that dtype.

`write_block_scaled` writes such a checkpoint from a bf16 one (tests, bench/make_fp8_target.py).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from trainer.targets.files import checkpoint_files

FP8 = torch.float8_e4m3fn
FP8_MAX = 448.0  # the largest finite float8_e4m3fn
BLOCK = 128  # transformers' FP8 format: one scale per 128x128 block of a weight
# _scaled_mm wants both dimensions of the weight (and the activations' inner one) in 16s.
ALIGN = 16
SCALE_SUFFIX = ".weight_scale_inv"
# A decoder layer's tensor, whichever prefix the text model is saved under (`model.` or the
# multimodal wrapper's `model.language_model.`), as trainer/targets/whole.py reads them.
_LAYER_KEY = re.compile(r"^(?:model\.language_model\.|model\.)layers\.(\d+)\.(.+)$")


# -- quantising ------------------------------------------------------------------------------


def quantize_rows(w: Tensor) -> tuple[Tensor, Tensor]:
    """[N, K] -> (float8 [N, K], fp32 scale [N]) with w ~= q * scale[:, None]: each row's
    largest magnitude maps to FP8's largest. An all-zero row gets a tiny scale (and zeros)."""
    w32 = w.float()
    scale = w32.abs().amax(dim=-1).clamp(min=1e-12) / FP8_MAX
    q = (w32 / scale[:, None]).clamp(-FP8_MAX, FP8_MAX).to(FP8)
    return q, scale


def dequantize_rows(q: Tensor, scale: Tensor) -> Tensor:
    return q.float() * scale.reshape(-1, 1).float()


def block_scale_shape(weight_shape: tuple[int, ...], block: int = BLOCK) -> tuple[int, int]:
    n, k = weight_shape
    return (-(-n // block), -(-k // block))


def quantize_blocks(w: Tensor, block: int = BLOCK) -> tuple[Tensor, Tensor]:
    """[N, K] -> (float8 [N, K], fp32 scale_inv [ceil(N/b), ceil(K/b)]), transformers' FP8
    format: w ~= q * scale_inv of its block (the last blocks may be partial)."""
    n, k = w.shape
    rows, cols = block_scale_shape((n, k), block)
    padded = torch.zeros(rows * block, cols * block, dtype=torch.float32, device=w.device)
    padded[:n, :k] = w.float()
    tiles = padded.view(rows, block, cols, block)
    scale_inv = tiles.abs().amax(dim=(1, 3)).clamp(min=1e-12) / FP8_MAX
    q = (tiles / scale_inv[:, None, :, None]).clamp(-FP8_MAX, FP8_MAX).to(FP8)
    return q.view(rows * block, cols * block)[:n, :k].contiguous(), scale_inv


def dequantize_blocks(q: Tensor, scale_inv: Tensor, block: int = BLOCK) -> Tensor:
    """float8 [N, K] and its [ceil(N/b), ceil(K/b)] scales -> fp32 [N, K]."""
    n, k = q.shape
    full = scale_inv.float().repeat_interleave(block, 0).repeat_interleave(block, 1)
    return q.float() * full[:n, :k]


def quantize_activations(x: Tensor) -> tuple[Tensor, Tensor]:
    """[M, K] -> (float8 [M, K], fp32 [M, 1]): one scale per token, made at each forward
    (dynamic), so no calibration is needed and no token's outlier clips another's."""
    amax = x.abs().amax(dim=-1, keepdim=True).float().clamp(min=1e-12)
    scale = amax / FP8_MAX
    # Row-major whatever the input's strides (_scaled_mm's first operand must be): a no-op
    # for the contiguous activations the layers give it.
    q = (x.float() / scale).clamp(-FP8_MAX, FP8_MAX).to(FP8).contiguous()
    return q, scale


# -- the module --------------------------------------------------------------------------------


class Fp8Linear(nn.Module):
    """A frozen `nn.Linear` as row-scaled FP8: y = (x_q @ w_q^T) * x_scale * w_scale, in one
    `torch._scaled_mm` (fp32 accumulation, bf16 out). Weights are buffers: nothing trains
    them, and `requires_grad_` or an optimizer never sees them."""

    weight: Tensor
    weight_scale: Tensor
    bias: Tensor | None

    def __init__(self, weight: Tensor, scale: Tensor, bias: Tensor | None = None) -> None:
        super().__init__()
        if weight.dtype != FP8 or weight.dim() != 2:
            raise ValueError(f"Fp8Linear wants a 2-D {FP8} weight, got {weight.dtype}")
        self.out_features, self.in_features = weight.shape
        self.register_buffer("weight", weight.contiguous())
        # _scaled_mm's row-wise scale of its second operand: fp32, shape [1, N].
        self.register_buffer("weight_scale", scale.float().reshape(1, -1).contiguous())
        self.register_buffer("bias", None if bias is None else bias.to(torch.bfloat16))

    @classmethod
    def from_weight(cls, weight: Tensor, bias: Tensor | None = None) -> Fp8Linear:
        q, scale = quantize_rows(weight)
        return cls(q, scale, bias)

    def forward(self, x: Tensor) -> Tensor:
        shape = x.shape
        flat = x.reshape(-1, shape[-1])
        xq, x_scale = quantize_activations(flat)
        # The weight [N, K] is row-major, so its transpose is the column-major operand
        # _scaled_mm requires of its second matrix.
        out = torch._scaled_mm(
            xq,
            self.weight.t(),
            scale_a=x_scale,
            scale_b=self.weight_scale,
            out_dtype=torch.bfloat16,
        )
        if self.bias is not None:
            out = out + self.bias
        return out.reshape(*shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, fp8 rows"


def fits(in_features: int, out_features: int) -> bool:
    """Whether _scaled_mm can take a linear of this shape (both dimensions in 16s)."""
    return in_features % ALIGN == 0 and out_features % ALIGN == 0


@dataclass
class Fp8Report:
    """What went FP8 and what stayed, by module name under the decoder layers."""

    converted: list[str] = field(default_factory=list)
    kept: list[str] = field(default_factory=list)  # shapes _scaled_mm cannot take

    def line(self) -> str:
        text = f"target FP8: {len(self.converted)} decoder linears row-scaled FP8"
        if self.kept:
            text += f", {len(self.kept)} kept bf16 (not in 16s: {', '.join(self.kept[:3])})"
        return text


def _linears(root: nn.Module) -> Iterable[tuple[nn.Module, str, str, nn.Linear]]:
    """(parent, attribute, full name, linear) for every nn.Linear under `root`."""
    for parent_name, parent in list(root.named_modules()):
        for attr, child in list(parent.named_children()):
            if isinstance(child, nn.Linear):
                name = f"{parent_name}.{attr}" if parent_name else attr
                yield parent, attr, name, child


def convert_linears(layers: nn.Module, report: Fp8Report | None = None) -> Fp8Report:
    """Every nn.Linear under `layers` (the decoder layers, nothing else) replaced in place by
    its row-scaled FP8 twin, quantised where its weight lies; one whose shape _scaled_mm
    cannot take stays as it is, named in the report."""
    report = report or Fp8Report()
    for parent, attr, name, linear in _linears(layers):
        if not fits(linear.in_features, linear.out_features):
            report.kept.append(name)
            continue
        setattr(parent, attr, Fp8Linear.from_weight(linear.weight.data, _bias(linear)))
        report.converted.append(name)
    return report


def _bias(linear: nn.Linear) -> Tensor | None:
    return None if linear.bias is None else linear.bias.data


def has_fp8(module: nn.Module) -> bool:
    return any(isinstance(m, Fp8Linear) for m in module.modules())


# -- checkpoints in transformers' FP8 format ----------------------------------------------------


def quantization_config(path: Path) -> dict[str, Any] | None:
    """config.json's `quantization_config` when it is transformers' FP8 (`quant_method =
    "fp8"`), else None. Any other quantisation is refused: its weights would load wrong."""
    try:
        config = json.loads((path / "config.json").read_text())
    except (OSError, ValueError):
        return None  # read_target_info names an unreadable config
    q = config.get("quantization_config") if isinstance(config, dict) else None
    if q is None:
        return None
    method = q.get("quant_method") if isinstance(q, dict) else None
    if method != "fp8":
        raise ValueError(
            f"target {path}: quantization_config.quant_method {str(method)[:40]!r} is not"
            " supported (only transformers' 'fp8', 128x128 block scales)"
        )
    block = q.get("weight_block_size")
    if list(block or []) != [BLOCK, BLOCK]:
        raise ValueError(
            f"target {path}: FP8 weight_block_size {str(block)[:40]} is not supported"
            f" (only [{BLOCK}, {BLOCK}])"
        )
    return q


def check_block_scaled(path: Path, layers: range | None = None) -> int:
    """Each scale of an FP8 checkpoint against its weight, from the .safetensors headers
    only (no tensor is read): every `X.weight_scale_inv` has an `X.weight` of float8_e4m3fn
    whose 128x128 blocks it covers exactly, and every float8 weight has its scale. The first
    that does not is bad input (a one-line ValueError naming it). `layers`: only those
    decoder layers. Returns how many scaled weights it checked."""
    from safetensors import safe_open

    shapes: dict[str, tuple[tuple[int, ...], str]] = {}
    for file in checkpoint_files(path):
        with safe_open(str(file), framework="pt", device="cpu") as f:
            for key in f.keys():  # noqa: SIM118 (safe_open has no __iter__)
                m = _LAYER_KEY.match(key)
                if layers is not None and (m is None or int(m.group(1)) not in layers):
                    continue
                piece = f.get_slice(key)
                shapes[key] = (tuple(piece.get_shape()), str(piece.get_dtype()))
    checked = 0
    for key in sorted(shapes, key=_natural):
        shape, dtype = shapes[key]
        if key.endswith(SCALE_SUFFIX):
            weight_key = key[: -len(SCALE_SUFFIX)] + ".weight"
            if weight_key not in shapes:
                raise ValueError(f"target {path}: FP8 scale {key} has no weight {weight_key}")
            w_shape, w_dtype = shapes[weight_key]
            if len(w_shape) != 2 or tuple(shape) != block_scale_shape(w_shape):
                want = block_scale_shape(w_shape) if len(w_shape) == 2 else "?"
                raise ValueError(
                    f"target {path}: FP8 scale {key} is {list(shape)}, its weight"
                    f" {list(w_shape)} needs {list(want) if want != '?' else want}"
                    f" ({BLOCK}x{BLOCK} blocks)"
                )
            if w_dtype != "F8_E4M3":
                raise ValueError(
                    f"target {path}: {weight_key} is {w_dtype}, its scale {key} wants F8_E4M3"
                )
            checked += 1
        elif (
            dtype.startswith("F8")
            and key.endswith(".weight")
            and key[: -len(".weight")] + SCALE_SUFFIX not in shapes
        ):
            raise ValueError(f"target {path}: FP8 weight {key} has no {SCALE_SUFFIX}")
    return checked


def _natural(key: str) -> tuple[Any, ...]:
    """Keys in layer order (layers.2 before layers.10): "the first tensor" as a reader expects."""
    return tuple(int(p) if p.isdigit() else p for p in re.split(r"(\d+)", key))


def read_block_scaled(path: Path, layers: range) -> dict[int, dict[str, tuple[Tensor, Tensor]]]:
    """{layer: {linear's name inside the layer: (float8 weight, scale_inv)}} for `layers`."""
    from safetensors import safe_open

    out: dict[int, dict[str, tuple[Tensor, Tensor]]] = {i: {} for i in layers}
    for file in checkpoint_files(path):
        with safe_open(str(file), framework="pt", device="cpu") as f:
            keys = set(f.keys())
            for key in keys:
                m = _LAYER_KEY.match(key)
                if m is None or int(m.group(1)) not in out or not key.endswith(SCALE_SUFFIX):
                    continue
                weight_key = key[: -len(SCALE_SUFFIX)] + ".weight"
                if weight_key not in keys:  # check_block_scaled refuses a split pair
                    raise ValueError(f"target {path}: FP8 scale {key} has no weight in {file.name}")
                name = m.group(2)[: -len(SCALE_SUFFIX)]
                out[int(m.group(1))][name] = (f.get_tensor(weight_key), f.get_tensor(key))
    return out


def load_block_scaled(
    layers: nn.ModuleList, path: Path, first: int, fp8: bool, dtype: torch.dtype
) -> Fp8Report:
    """Put an FP8 checkpoint's block-scaled weights into the decoder layers `layers`
    (layer `first + i` of the checkpoint is `layers[i]`), whatever HF's loader made of them:
    as row-scaled `Fp8Linear`s when `fp8`, else dequantised into the linears in `dtype`.
    Linears the checkpoint left unquantised (its `modules_to_not_convert`) are HF's, as
    loaded; with `fp8` they are quantised row-wise like those of a bf16 checkpoint."""
    report = Fp8Report()
    scaled = read_block_scaled(path, range(first, first + len(layers)))
    for offset, layer in enumerate(layers):
        i = first + offset
        for parent, attr, name, linear in _linears(layer):
            found = scaled[i].pop(name, None)
            full = f"{offset}.{name}"
            device = linear.weight.device
            if found is None:
                if fp8 and fits(linear.in_features, linear.out_features):
                    setattr(parent, attr, Fp8Linear.from_weight(linear.weight.data, _bias(linear)))
                    report.converted.append(full)
                elif fp8:
                    report.kept.append(full)
                continue
            q, scale_inv = found
            if tuple(q.shape) != (linear.out_features, linear.in_features):
                raise ValueError(
                    f"target {path}: layer {i}'s {name}.weight is {list(q.shape)}, the model"
                    f" wants {[linear.out_features, linear.in_features]}"
                )
            w = dequantize_blocks(q.to(device), scale_inv.to(device))
            bias = _bias(linear)
            if fp8 and fits(linear.in_features, linear.out_features):
                setattr(parent, attr, Fp8Linear.from_weight(w, bias))
                report.converted.append(full)
            else:
                linear.weight.data = w.to(dtype)
                if fp8:
                    report.kept.append(full)
        if scaled[i]:
            stray = sorted(scaled[i])[0]
            raise ValueError(f"target {path}: layer {i}'s FP8 weight {stray} matches no linear")
    return report


def fold_block_scales(tensors: dict[str, Tensor], dtype: torch.dtype) -> dict[str, Tensor]:
    """One layer's tensors as read from an FP8 checkpoint ({name inside the layer: tensor})
    with each block-scaled weight dequantised into `dtype` and its scale dropped: what an
    ordinary layer's `load_state_dict` takes (trainer/targets/whole.py)."""
    out = dict(tensors)
    for key in [k for k in tensors if k.endswith(SCALE_SUFFIX)]:
        weight_key = key[: -len(SCALE_SUFFIX)] + ".weight"
        out[weight_key] = dequantize_blocks(tensors[weight_key], out.pop(key)).to(dtype)
    return out


# -- writing one (tests, bench/make_fp8_target.py) ---------------------------------------------


def write_block_scaled(src: Path, out: Path, device: str = "cpu") -> int:
    """Write `src` (a bf16 checkpoint) to `out` in transformers' FP8 format: every decoder
    linear's 2-D weight (a `*_proj.weight` under `layers.N.`) as float8 with 128x128 block
    scales, everything else (embedding, norms, lm_head, the rest) as it was; config.json
    gains the `quantization_config` Qwen's FP8 checkpoints carry; the tokenizer's files are
    copied. `device`: where to quantise (a GPU does an 8B target's in seconds). Returns the
    number of weights quantised."""
    import shutil

    from safetensors import safe_open
    from safetensors.torch import save_file

    out.mkdir(parents=True, exist_ok=True)
    count = 0
    files = checkpoint_files(src)
    weight_map: dict[str, str] = {}
    for file in files:
        tensors: dict[str, Tensor] = {}
        with safe_open(str(file), framework="pt", device="cpu") as f:
            for key in f.keys():  # noqa: SIM118
                t = f.get_tensor(key)
                m = _LAYER_KEY.match(key)
                if m and key.endswith("proj.weight") and t.dim() == 2:
                    q, scale_inv = quantize_blocks(t.to(device))
                    tensors[key] = q.cpu()
                    tensors[key[: -len(".weight")] + SCALE_SUFFIX] = scale_inv.cpu()
                    count += 1
                else:
                    tensors[key] = t.contiguous()
        save_file(tensors, str(out / file.name), metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(tensors, file.name))
    if (src / "model.safetensors.index.json").is_file():
        index = {"metadata": {}, "weight_map": dict(sorted(weight_map.items()))}
        (out / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))
    config = json.loads((src / "config.json").read_text())
    config["quantization_config"] = {
        "activation_scheme": "dynamic",
        "fmt": "e4m3",
        "quant_method": "fp8",
        "weight_block_size": [BLOCK, BLOCK],
    }
    (out / "config.json").write_text(json.dumps(config, indent=2))
    written = ("config.json", "model.safetensors.index.json")
    for name in src.iterdir():  # the tokenizer's files, generation_config.json, ...
        weights = name.suffix in (".safetensors", ".pt")
        if name.is_file() and not weights and name.name not in written:
            shutil.copy2(name, out / name.name)
    return count


# -- where it can run ------------------------------------------------------------------------


def fp8_unsupported(device: torch.device) -> str | None:
    """Why row-scaled FP8 matmuls cannot run on `device` (one line), or None. Checked before
    the target loads: CUDA, compute capability 8.9 or newer (Ada, Hopper), and a tiny
    `torch._scaled_mm` of the very kind the target runs (the torch build's own answer)."""
    if device.type != "cuda":
        return f"FP8 matmuls need a CUDA GPU (the target is on {device})"
    if not hasattr(torch, "_scaled_mm") or not hasattr(torch, "float8_e4m3fn"):
        return f"torch {torch.__version__} has no FP8 matmul (torch._scaled_mm)"
    major, minor = torch.cuda.get_device_capability(device)
    name = torch.cuda.get_device_name(device)
    if (major, minor) < (8, 9):
        return (
            f"{name} ({device}, compute capability {major}.{minor}) has no FP8 matmuls;"
            " they need 8.9 or newer (Ada, Hopper)"
        )
    try:
        probe = Fp8Linear.from_weight(torch.randn(32, 64, device=device))
        probe(torch.randn(16, 64, device=device, dtype=torch.bfloat16))
        torch.cuda.synchronize(device)
    except RuntimeError as e:
        why = str(e).strip().splitlines()[0][:160] if str(e).strip() else type(e).__name__
        return f"torch {torch.__version__} cannot run row-scaled FP8 matmuls on {name}: {why}"
    return None


def check_fp8_device(dtype_name: str, device: torch.device) -> None:
    """`target.dtype = "fp8"` where it cannot run: a one-line ValueError, before any load."""
    if dtype_name != "fp8":
        return
    why = fp8_unsupported(device)
    if why is not None:
        raise ValueError(f"target.dtype: 'fp8': {why}; use 'auto' or 'bfloat16'")

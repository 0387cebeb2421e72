"""Typed trainer configuration: TOML file + `section.key=value` overrides from the CLI.

Every key is declared in a dataclass below; anything else is refused with a one-line
error naming the key, so a typo never silently trains with a default.
"""

from __future__ import annotations

import dataclasses
import json
import re
import tomllib
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


class ConfigError(ValueError):
    """A bad config key or value; the message is one line and names the key."""


@dataclass
class TargetConfig:
    # A local folder for `from_pretrained`, or "builtin:tiny-qwen3" (built once, cached).
    path: str = "builtin:tiny-qwen3"
    # "auto": bf16 on CUDA, float32 on CPU.
    dtype: str = "auto"


@dataclass
class DrafterConfig:
    num_layers: int = 5
    block_size: int = 16
    # Target layers whose outputs feed the drafter; empty = DFlash's default spread.
    target_layer_ids: list[int] = field(default_factory=list)
    # 0 = take the target's value.
    intermediate_size: int = 0
    num_heads: int = 0
    num_kv_heads: int = 0
    head_dim: int = 0
    # Added to the tokenizer when it has no mask token of its own.
    mask_token: str = "<|MASK|>"


@dataclass
class DataConfig:
    # A JSONL file, "builtin:synthetic-chat" (the shipped learnable dataset) or
    # "builtin:synthetic-sharegpt" (multi-turn, real chat lengths; generated on first use).
    path: str = "builtin:synthetic-chat"
    # "auto" (decided per line), "sharegpt" or "text".
    format: str = "auto"
    # Sequences are right-padded to the smallest bucket that holds them (static shapes).
    seq_buckets: list[int] = field(default_factory=lambda: [2048])
    # Samples longer than the largest bucket are truncated to it.
    shuffle: bool = True
    # Tokenized samples are cached on disk, keyed by the data's content, the tokenizer, the
    # format, the largest bucket and the tokenizing code (trainer/tokenized.py).
    cache: bool = True
    # "" = <cache dir>/tokenized (DFLASH_CACHE_DIR, else ~/.cache/dflash-tui).
    cache_dir: str = ""
    # Processes that tokenize on a cache miss: 0 = one per core (at most 16), 1 = in-process.
    tokenize_workers: int = 0


@dataclass
class TrainConfig:
    batch_size: int = 1
    num_anchors: int = 512
    lr: float = 6e-4
    min_lr_ratio: float = 0.1
    warmup_steps: int = 100
    weight_decay: float = 0.0
    grad_clip: float = 1.0
    betas: list[float] = field(default_factory=lambda: [0.9, 0.95])
    # Loss decay exp(-(k-1)/gamma) along the block; 0 = DFlash's value for the block size.
    gamma: float = 0.0
    # Blocks per lm_head chunk of the loss.
    loss_chunk_blocks: int = 128
    # "fused": loss and its input-gradient in one pass (lm_head once per chunk);
    # "checkpoint": torch.utils.checkpoint around each chunk (lm_head recomputed in backward).
    loss_impl: str = "fused"
    topk: int = 4
    # Gaussian noise on the target features, linearly decayed from start to end.
    noise_start: float = 0.0
    noise_end: float = 0.0
    max_steps: int = 0  # 0 = run `epochs` epochs
    epochs: float = 1.0
    seed: int = 0
    log_every: int = 10
    checkpoint_every: int = 0  # 0 = only at the end
    # "auto": flex on CUDA, sdpa on CPU (flex has no CPU backward).
    attention: str = "auto"
    # torch.compile each drafter layer on CUDA (fused norms, RoPE, SwiGLU; flex inlined).
    compile_drafter: bool = True


@dataclass
class RuntimeConfig:
    # Device of each target thread and each drafter thread: "cuda:N", N, "cpu" or "auto"
    # (cuda:0 when there is a GPU, else cpu). Roles may share a device; each is its own thread.
    targets: list[str] = field(default_factory=lambda: ["auto"])
    drafters: list[str] = field(default_factory=lambda: ["auto"])
    prefetch_threads: int = 0  # 0 = one per target
    q_pre_size: int = 8  # batches waiting for each target
    q_hs_size: int = 4  # feature batches waiting for each drafter, per target
    # Target forwards on their own CUDA stream, so a target sharing a GPU with a drafter
    # overlaps its kernels with the drafter's instead of queueing behind them.
    target_stream: bool = True
    heartbeat_interval: float = 1.0
    # Inductor/Triton cache, kept outside the run dir so a restart reuses it.
    # "" = <cache dir>/compile (see DFLASH_CACHE_DIR).
    compile_cache_dir: str = ""
    wandb_mode: str = "offline"
    wandb_project: str = "dflash"


@dataclass
class Config:
    name: str = "unnamed"
    target: TargetConfig = field(default_factory=TargetConfig)
    drafter: DrafterConfig = field(default_factory=DrafterConfig)
    data: DataConfig = field(default_factory=DataConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    runtime: RuntimeConfig = field(default_factory=RuntimeConfig)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=True)


_CHOICES: dict[str, tuple[str, ...]] = {
    "target.dtype": ("auto", "bfloat16", "float16", "float32"),
    "data.format": ("auto", "sharegpt", "text"),
    "train.loss_impl": ("fused", "checkpoint"),
    "train.attention": ("auto", "flex", "sdpa"),
    "runtime.wandb_mode": ("offline", "online", "disabled"),
}
# Device lists accept bare GPU indices (targets = [0, 1, 2]) as TOML ints.
_DEVICE_KEYS = ("runtime.targets", "runtime.drafters")
_DEVICE = re.compile(r"^(auto|cpu|cuda(:\d+)?)$")


def _coerce(key: str, value: Any, annotation: Any) -> Any:
    """Check `value` against the field's type; ints are accepted where floats are."""
    origin = typing.get_origin(annotation)
    if key in _DEVICE_KEYS:
        return _devices(key, value)
    if origin is list:
        (item_type,) = typing.get_args(annotation)
        if not isinstance(value, list):
            raise ConfigError(f"{key}: expected a list, got {value!r}")
        return [_coerce(f"{key}[{i}]", v, item_type) for i, v in enumerate(value)]
    if origin in (typing.Union, types.UnionType):
        raise AssertionError(f"{key}: union types are not used in the config")
    if annotation is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{key}: expected true/false, got {value!r}")
        return value
    if annotation is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{key}: expected an integer, got {value!r}")
        return value
    if annotation is float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ConfigError(f"{key}: expected a number, got {value!r}")
        return float(value)
    if annotation is str:
        if not isinstance(value, str):
            raise ConfigError(f"{key}: expected a string, got {value!r}")
        choices = _CHOICES.get(key)
        if choices and value not in choices:
            raise ConfigError(f"{key}: expected one of {', '.join(choices)}, got {value!r}")
        return value
    raise AssertionError(f"{key}: unsupported annotation {annotation!r}")


def _devices(key: str, value: Any) -> list[str]:
    if not isinstance(value, list) or not value:
        raise ConfigError(f"{key}: expected a non-empty list of devices, got {value!r}")
    out = []
    for v in value:
        if isinstance(v, int) and not isinstance(v, bool) and v >= 0:
            out.append(f"cuda:{v}")
        elif isinstance(v, str) and _DEVICE.match(v):
            out.append(v)
        else:
            raise ConfigError(f"{key}: {v!r} is not a device (cpu, cuda:N, N or auto)")
    return out


def _apply(obj: Any, data: dict[str, Any], prefix: str) -> None:
    hints = typing.get_type_hints(type(obj))
    names = {f.name for f in dataclasses.fields(obj)}
    for key, value in data.items():
        full = f"{prefix}{key}"
        if key not in names:
            raise ConfigError(f"unknown config key {full!r}")
        current = getattr(obj, key)
        if dataclasses.is_dataclass(current):
            if not isinstance(value, dict):
                raise ConfigError(f"{full}: expected a [{full}] table, got {value!r}")
            _apply(current, value, f"{full}.")
        else:
            setattr(obj, key, _coerce(full, value, hints[key]))


def _parse_override(text: str) -> tuple[list[str], Any]:
    if "=" not in text:
        raise ConfigError(f"override {text!r}: expected section.key=value")
    key, raw = text.split("=", 1)
    key = key.strip()
    try:
        # TOML syntax for the value: 3, 1e-4, true, "x", [1, 2]; bare words are strings.
        value = tomllib.loads(f"v = {raw}")["v"]
    except tomllib.TOMLDecodeError:
        value = raw
    return key.split("."), value


def _nest(path: list[str], value: Any) -> dict[str, Any]:
    out: dict[str, Any] = {path[-1]: value}
    for part in reversed(path[:-1]):
        out = {part: out}
    return out


def validate(cfg: Config) -> None:
    """Cross-field checks that a single type cannot express."""
    if cfg.drafter.block_size < 2:
        raise ConfigError("drafter.block_size: must be at least 2")
    if cfg.drafter.num_layers < 1:
        raise ConfigError("drafter.num_layers: must be at least 1")
    if not cfg.data.seq_buckets or any(b < 2 for b in cfg.data.seq_buckets):
        raise ConfigError("data.seq_buckets: needs at least one length >= 2")
    if cfg.data.seq_buckets != sorted(set(cfg.data.seq_buckets)):
        raise ConfigError("data.seq_buckets: must be strictly increasing")
    for key in ("batch_size", "num_anchors", "loss_chunk_blocks", "topk", "log_every"):
        if getattr(cfg.train, key) < 1:
            raise ConfigError(f"train.{key}: must be at least 1")
    if cfg.data.tokenize_workers < 0:
        raise ConfigError("data.tokenize_workers: must be 0 (one per core) or more")
    if cfg.train.lr <= 0:
        raise ConfigError("train.lr: must be positive")
    if len(cfg.train.betas) != 2:
        raise ConfigError("train.betas: expected two numbers")
    r = cfg.runtime
    for key in ("q_pre_size", "q_hs_size"):
        if getattr(r, key) < 1:
            raise ConfigError(f"runtime.{key}: must be at least 1")
    if r.prefetch_threads < 0:
        raise ConfigError("runtime.prefetch_threads: must be 0 (one per target) or more")
    if not 0 < r.heartbeat_interval <= 2:
        raise ConfigError("runtime.heartbeat_interval: must be in (0, 2] seconds")


def load_config(path: str | Path | None, overrides: list[str] | None = None) -> Config:
    cfg = Config()
    if path is not None:
        p = Path(path)
        try:
            data = tomllib.loads(p.read_text())
        except FileNotFoundError:
            raise ConfigError(f"config file {str(p)!r} not found") from None
        except tomllib.TOMLDecodeError as e:
            raise ConfigError(f"config file {str(p)!r}: {e}") from None
        if "name" not in data:
            data["name"] = p.stem
        _apply(cfg, data, "")
    return apply_overrides(cfg, overrides or [])


def apply_overrides(cfg: Config, overrides: list[str]) -> Config:
    """Apply `section.key=value` overrides (TOML values) in place, then validate."""
    for text in overrides:
        keys, value = _parse_override(text)
        _apply(cfg, _nest(keys, value), "")
    validate(cfg)
    return cfg


def config_from_dict(data: dict[str, Any]) -> Config:
    """Rebuild a config saved with `to_dict` (config.json of a run dir; its "run" is metadata)."""
    cfg = Config()
    _apply(cfg, {k: v for k, v in data.items() if k != "run"}, "")
    validate(cfg)
    return cfg

"""Typed trainer configuration: TOML file + `section.key=value` overrides from the CLI.

Every key is declared in a dataclass below, and every number has a rule (`RULES`);
anything else is refused before anything is loaded, with one line naming the key, the
value and the rule (`config: drafter.num_heads = -2: must be a positive integer, ...`), so
a typo never silently trains with a default and a bad value never reaches the model.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import math
import re
import tomllib
import types
import typing
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from trainer.contract.textfile import TextFileError, read_text_file


class ConfigError(ValueError):
    """A bad config file, key or value; the message is one line and names it."""


@dataclass
class TargetConfig:
    # A local folder for `from_pretrained`, or "builtin:tiny-qwen3" (built once, cached).
    path: str = "builtin:tiny-qwen3"
    # "auto": bf16 on CUDA, float32 on CPU. "fp8" (opt-in; CUDA, compute capability >= 8.9):
    # the decoder layers' linears as row-scaled FP8, everything else bf16 (trainer/targets/fp8.py).
    dtype: str = "auto"
    # A packed row's full attention (documents kept apart): "varlen" (torch's varlen flash
    # kernel given the documents' boundaries: CUDA, bf16/fp16, torch >= 2.10), "mask" (a
    # boolean block-diagonal mask through SDPA, which leaves its flash kernel), "auto"
    # (varlen where it can run, else mask).
    packed_attention: str = "auto"
    # torch.compile each full-attention decoder layer of the target on CUDA (fused RMSNorm,
    # RoPE and SwiGLU; varlen attention stays eager between two graphs), compiled in the
    # warm-up before any thread starts. The held-out eval's decode calls the layers eagerly.
    compile: bool = False


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
    # A warm start: a DFlash drafter folder as SpecForge and SGLang load it (config.json +
    # *.safetensors, e.g. `python -m trainer export`'s output) whose shape is this drafter's.
    init_from: str = ""


@dataclass
class DataConfig:
    # A JSONL file, "builtin:synthetic-chat" (the shipped learnable dataset) or
    # "builtin:synthetic-sharegpt" (multi-turn, real chat lengths; generated on first use).
    path: str = "builtin:synthetic-chat"
    # "auto" (decided per line), "sharegpt", "text" or "tokens" (input_ids + loss_mask, as
    # `python -m trainer regenerate` writes).
    format: str = "auto"
    # Sequences are right-padded to the smallest bucket that holds them (static shapes).
    seq_buckets: list[int] = field(default_factory=lambda: [2048])
    # Samples longer than the largest bucket are truncated to it.
    shuffle: bool = True
    # Pack several documents into each row (trainer/data/packing.py), none seeing another; false
    # pads each sample to its own bucket row (most of a row is padding on chat data).
    packing: bool = True
    # Tokenized samples are cached on disk, keyed by the data's content, the tokenizer, the
    # format, the largest bucket and the tokenizing code (trainer/data/tokenized.py).
    cache: bool = True
    # Samples never trained on, for held-out evaluation (`python -m trainer eval`): the N
    # with the smallest sample ids (a hash of their tokens), so the split does not depend
    # on the file's order or the shuffle, and a duplicate of a held-out sample is held out too.
    held_out: int = 0
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
    # The LR schedule (warmup, then cosine to lr * min_lr_ratio) runs over steps
    # [schedule_start, schedule_start + schedule_steps) and holds its final value after;
    # 0 steps = to the run's last step. A continued run (`dflash-tui restart --more-steps`)
    # sets both: the parent's schedule kept (the lr holds its final value) or a new one.
    schedule_start: int = 0
    schedule_steps: int = 0
    epochs: float = 1.0
    seed: int = 0
    log_every: int = 10
    checkpoint_every: int = 0  # 0 = only at the end
    # After each save, keep the newest N checkpoints and the one with the best held-out τ,
    # never the resume point; 0 = keep every one (a deletion is not undone, so opt in).
    keep_checkpoints: int = 0
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
    # "" = <cache dir>/compile (see DFLASH_CACHE_DIR), or torch's own TORCHINDUCTOR_CACHE_DIR
    # and TRITON_CACHE_DIR where set; a folder named here wins over both.
    compile_cache_dir: str = ""
    wandb_mode: str = "offline"
    wandb_project: str = "dflash"
    # "threads": every role a thread of one process. "processes": one process per role,
    # started by torchrun (`python -m torch.distributed.run --nproc-per-node T+D -m trainer
    # ...`): ranks 0..T-1 are the targets, T..T+D-1 the drafters (trainer/distributed/layout.py).
    mode: str = "threads"
    # processes mode: the dtype the drafter ranks' gradients cross the wire in (DDP's
    # buckets, trainer/distributed/replica_sync.py); "bf16" halves the bytes of every step's
    # all-reduce (a PCIe box's link), the sum landing back in the fp32 gradients.
    grad_reduce_dtype: str = "fp32"
    # processes mode: how long any collective or feature transfer may wait before the rank
    # gives up (init_process_group's timeout), so no rank blocks forever on a lost peer.
    collective_timeout_s: float = 600.0
    # How batches find their target and drafter replica (trainer/runtime/pipeline.py):
    # "fixed": batch g goes to target g % T and replica g % D over T×D private queues:
    # reproducible to the bit, and a resume continues the same trajectory, but one slow
    # target stalls every drafter. "shared" (threads mode only): one q_pre feeds every
    # target and one q_hs every replica, so any idle thread takes the next batch; a resume
    # may retrain the batches that were in flight. "node" (processes mode): a target on
    # the replica's own node forwards its batches, so feature batches stay off the
    # inter-node link (trainer/distributed/routing.py).
    routing: str = "fixed"


@dataclass
class EvalConfig:
    # Every N optimizer steps (and at the last), the eval thread decodes held-out prompts
    # speculatively (the drafter of that step proposes, the whole target verifies) and
    # reports the acceptance length τ (trainer/evaluation/online.py). 0 = never; needs
    # data.held_out samples to take the prompts from. Training never waits for it: an eval
    # due while the last one still runs is skipped and counted.
    every: int = 0
    prompts: int = 8  # held-out prompts per eval (at most data.held_out)
    new_tokens: int = 64  # tokens decoded per prompt
    prompt_len: int = 512  # a prompt's last tokens before its answer, at most
    final: bool = True  # also evaluate the last step's drafter of a run that finishes
    # The decode step captured as a CUDA graph and replayed (trainer/evaluation/graphs.py):
    # "auto" (on a CUDA device), "on" (refused on a CPU), "off" (eager: the fallback when a
    # capture fails, kept for comparison). Hybrid targets decode eagerly one prompt at a time.
    cuda_graphs: str = "auto"
    # DDTree beside the chain: the same prompts decoded again with a draft tree of this many
    # nodes per verify step (trainer/evaluation/tree.py), its τ reported beside the chain's.
    # 0 = off. A hybrid (Gated DeltaNet) target reports it as not measured.
    tree_nodes: int = 0
    # The eval's CUDA stream beside training on the same GPU: "high" (its small decode
    # kernels start as SMs free up, ahead of training's queued ones: a quick eval that takes
    # its GPU time from training) or "low" (it runs in what training leaves: a slower eval
    # that costs training less). bench/README.md measures both.
    stream_priority: str = "high"


@dataclass
class Config:
    name: str = "unnamed"
    target: TargetConfig = field(default_factory=TargetConfig)
    drafter: DrafterConfig = field(default_factory=DrafterConfig)
    data: DataConfig = field(default_factory=DataConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    runtime: RuntimeConfig = field(default_factory=RuntimeConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=True)


_CHOICES: dict[str, tuple[str, ...]] = {
    "target.dtype": ("auto", "bfloat16", "float16", "float32", "fp8"),
    "target.packed_attention": ("auto", "varlen", "mask"),
    "data.format": ("auto", "sharegpt", "text", "tokens"),
    "train.loss_impl": ("fused", "checkpoint"),
    "train.attention": ("auto", "flex", "sdpa"),
    "runtime.grad_reduce_dtype": ("fp32", "bf16"),
    "runtime.wandb_mode": ("offline", "online", "disabled"),
    "runtime.mode": ("threads", "processes"),
    "runtime.routing": ("fixed", "shared", "node"),
    "eval.cuda_graphs": ("auto", "on", "off"),
    "eval.stream_priority": ("high", "low"),
}
# Device lists accept bare GPU indices (targets = [0, 1, 2]) as TOML ints.
_DEVICE_KEYS = ("runtime.targets", "runtime.drafters")
_DEVICE = re.compile(r"^(auto|cpu|cuda(:\d+)?)$")
_INT64_MAX = 2**63 - 1

_POSITIVE_INT = "must be a positive integer"
_NON_NEGATIVE_INT = "must be a non-negative integer"
_TARGETS_OR_POSITIVE = "must be a positive integer, or 0 for the target's"

# Every number in the config has a rule, checked before anything is loaded or built: the
# test of this module fails for a numeric key without one. `[]` is each item of a list.
# Ints must also fit in 64 bits and floats must be finite; those are checked for all.
RULES: dict[str, tuple[Callable[[float], bool], str]] = {
    "drafter.num_layers": (lambda v: v >= 1, _POSITIVE_INT),
    "drafter.block_size": (lambda v: v >= 2, "must be an integer >= 2"),
    "drafter.target_layer_ids[]": (lambda v: v >= 0, "must be a non-negative layer index"),
    "drafter.intermediate_size": (lambda v: v >= 0, _TARGETS_OR_POSITIVE),
    "drafter.num_heads": (lambda v: v >= 0, _TARGETS_OR_POSITIVE),
    "drafter.num_kv_heads": (lambda v: v >= 0, _TARGETS_OR_POSITIVE),
    "drafter.head_dim": (lambda v: v >= 0, _TARGETS_OR_POSITIVE),
    "data.seq_buckets[]": (lambda v: v >= 2, "must be an integer >= 2"),
    "data.tokenize_workers": (lambda v: v >= 0, "must be 0 (one per core) or more"),
    "data.held_out": (lambda v: v >= 0, "must be 0 (none) or more samples"),
    "train.batch_size": (lambda v: v >= 1, _POSITIVE_INT),
    "train.num_anchors": (lambda v: v >= 1, _POSITIVE_INT),
    "train.lr": (lambda v: v > 0, "must be a positive number"),
    "train.min_lr_ratio": (lambda v: 0 <= v <= 1, "must be in [0, 1]"),
    "train.warmup_steps": (lambda v: v >= 0, _NON_NEGATIVE_INT),
    "train.weight_decay": (lambda v: v >= 0, "must be a non-negative number"),
    "train.grad_clip": (lambda v: v >= 0, "must be a non-negative number (0 = no clipping)"),
    "train.betas[]": (lambda v: 0 <= v < 1, "must be in [0, 1)"),
    "train.gamma": (lambda v: v >= 0, "must be a non-negative number (0 = DFlash's value)"),
    "train.loss_chunk_blocks": (lambda v: v >= 1, _POSITIVE_INT),
    "train.topk": (lambda v: v >= 1, _POSITIVE_INT),
    "train.noise_start": (lambda v: v >= 0, "must be a non-negative number"),
    "train.noise_end": (lambda v: v >= 0, "must be a non-negative number"),
    "train.max_steps": (lambda v: v >= 0, "must be a non-negative integer (0 = train.epochs)"),
    "train.epochs": (lambda v: v > 0, "must be a positive number"),
    "train.schedule_start": (lambda v: v >= 0, _NON_NEGATIVE_INT),
    "train.schedule_steps": (
        lambda v: v >= 0,
        "must be a non-negative integer (0 = to the run's last step)",
    ),
    "train.seed": (lambda v: v >= 0, _NON_NEGATIVE_INT),
    "train.log_every": (lambda v: v >= 1, _POSITIVE_INT),
    "train.checkpoint_every": (lambda v: v >= 0, "must be a non-negative integer (0 = at the end)"),
    "train.keep_checkpoints": (
        lambda v: v >= 0,
        "must be a non-negative integer (0 = keep every checkpoint)",
    ),
    "eval.every": (lambda v: v >= 0, "must be 0 (never) or a number of steps"),
    "eval.prompts": (lambda v: v >= 1, _POSITIVE_INT),
    "eval.new_tokens": (lambda v: 2 <= v <= 100_000, "must be an integer in [2, 100000]"),
    "eval.prompt_len": (lambda v: v >= 1, _POSITIVE_INT),
    # the tree is one forward of tree_nodes + 1 tokens: beyond a few thousand it is a prefill
    "eval.tree_nodes": (lambda v: 0 <= v <= 4096, "must be 0 (off) or a node budget up to 4096"),
    "runtime.prefetch_threads": (
        lambda v: 0 <= v <= 64,
        "must be 0 (one per target) to 64",
    ),
    "runtime.q_pre_size": (lambda v: v >= 1, _POSITIVE_INT),
    "runtime.q_hs_size": (lambda v: v >= 1, _POSITIVE_INT),
    "runtime.heartbeat_interval": (lambda v: 0 < v <= 2, "must be in (0, 2] seconds"),
    "runtime.collective_timeout_s": (
        lambda v: 1 <= v <= 86_400,
        "must be in [1, 86400] seconds",
    ),
}


def show(value: Any, depth: int = 0) -> str:
    """A value as a one-line, bounded, ASCII text, written as in TOML where it can be."""
    if isinstance(value, bool):
        text = "true" if value else "false"
    elif isinstance(value, int):
        # str() of an int over 4300 digits raises (CPython's conversion limit).
        text = str(value) if value.bit_length() < 200 else f"<a {value.bit_length()}-bit integer>"
    elif isinstance(value, float):
        text = "nan" if math.isnan(value) else repr(value)
    elif isinstance(value, str):  # paths among them: shown whole up to 300 characters
        text = json.dumps(value[:300])
        return text if len(text) <= 300 else text[:297] + "..."
    elif isinstance(value, list):
        if depth >= 3:
            return "[...]"
        text = "[" + ", ".join(show(v, depth + 1) for v in value[:8])
        text += ", ...]" if len(value) > 8 else "]"
    elif isinstance(value, dict):
        text = "{...}" if value else "{}"
    else:  # TOML dates and times
        text = json.dumps(str(value)[:200]).strip('"')
    return text if len(text) <= 80 else text[:77] + "..."


def show_path(path: str | Path) -> str:
    """A path quoted and escaped, whole up to 300 characters (then its end, which names it)."""
    text = json.dumps(str(path))
    return text if len(text) <= 300 else '"...' + text[-297:]


def show_key(key: str) -> str:
    """A key as typed, or quoted when it holds anything but a plain dotted name."""
    return key if re.fullmatch(r"[A-Za-z0-9_.\[\]-]{1,80}", key) else show(key)


def bad_value(key: str, value: Any, rule: str) -> ConfigError:
    """The one line every bad value gets: `config: drafter.num_heads = -2: must be ...`."""
    return ConfigError(f"config: {show_key(key)} = {show(value)}: {rule}")


def _check_number(key: str, rule_key: str, value: int | float) -> None:
    """The checks every number gets (64 bits, finite), then its key's rule."""
    if isinstance(value, int) and not -_INT64_MAX - 1 <= value <= _INT64_MAX:
        raise bad_value(key, value, "must fit in a 64-bit integer")
    if isinstance(value, float) and not math.isfinite(value):
        raise bad_value(key, value, "must be a finite number")
    check, rule = RULES[rule_key]
    if not check(value):
        raise bad_value(key, value, rule)


def _coerce(key: str, value: Any, annotation: Any, rule_key: str | None = None) -> Any:
    """Check `value` against the field's type and rule; ints are accepted where floats are."""
    rule_key = rule_key or key
    origin = typing.get_origin(annotation)
    if key in _DEVICE_KEYS:
        return _devices(key, value)
    if origin is list:
        (item_type,) = typing.get_args(annotation)
        if not isinstance(value, list):
            raise bad_value(key, value, "expected a list")
        return [_coerce(f"{key}[{i}]", v, item_type, f"{rule_key}[]") for i, v in enumerate(value)]
    if origin in (typing.Union, types.UnionType):
        raise AssertionError(f"{key}: union types are not used in the config")
    if annotation is bool:
        if not isinstance(value, bool):
            raise bad_value(key, value, "expected true or false")
        return value
    if annotation is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise bad_value(key, value, "expected an integer")
        _check_number(key, rule_key, value)
        return value
    if annotation is float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise bad_value(key, value, "expected a number")
        _check_number(key, rule_key, value)  # the value as written, in the message
        return float(value)
    if annotation is str:
        if not isinstance(value, str):
            choices = _CHOICES.get(key)  # `eval.cuda_graphs=true` is read as a TOML bool
            rule = f"expected one of {', '.join(choices)}" if choices else "expected a string"
            raise bad_value(key, value, rule)
        if "\0" in value or _has_surrogate(value):
            raise bad_value(key, value, "must be text without NUL bytes or lone surrogates")
        choices = _CHOICES.get(key)
        if choices and value not in choices:
            raise bad_value(key, value, f"expected one of {', '.join(choices)}")
        return value
    raise AssertionError(f"{key}: unsupported annotation {annotation!r}")


def _has_surrogate(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def _devices(key: str, value: Any) -> list[str]:
    if not isinstance(value, list) or not value:
        raise bad_value(key, value, "expected a non-empty list of devices")
    out = []
    for i, v in enumerate(value):
        if isinstance(v, int) and not isinstance(v, bool) and 0 <= v <= 1023:
            out.append(f"cuda:{v}")
        elif isinstance(v, str) and _DEVICE.match(v):
            out.append(v)
        else:
            raise bad_value(f"{key}[{i}]", v, "not a device (cpu, cuda:N, N or auto)")
    return out


def _apply(obj: Any, data: dict[str, Any], prefix: str) -> None:
    hints = typing.get_type_hints(type(obj))
    names = [f.name for f in dataclasses.fields(obj)]
    for key, value in data.items():
        full = f"{prefix}{key}"
        if key not in names:
            near = difflib.get_close_matches(key, names, n=1)
            hint = f" (did you mean {prefix}{near[0]}?)" if near else ""
            raise bad_value(full, value, f"unknown key{hint}")
        current = getattr(obj, key)
        if dataclasses.is_dataclass(current):
            if not isinstance(value, dict):
                raise bad_value(full, value, f"expected a [{full}] table")
            _apply(current, value, f"{full}.")
        else:
            setattr(obj, key, _coerce(full, value, hints[key]))


def _parse_override(text: str) -> tuple[list[str], Any]:
    if "=" not in text:
        raise ConfigError(f"config: --set {show(text)}: expected section.key=value")
    key, raw = text.split("=", 1)
    key = key.strip()
    try:
        # TOML syntax for the value: 3, 1e-4, true, "x", [1, 2]; bare words are strings.
        value = tomllib.loads(f"v = {raw}")["v"]
    except (ValueError, RecursionError):  # TOMLDecodeError, or an int over 4300 digits
        value = raw
    return key.split("."), value


def _check_sections(cfg: Config, keys: list[str], value: Any) -> None:
    """An override's sections, each a section: `foo.bar=1` is said whole, not as `foo = {...}`."""
    obj: Any = cfg
    for i, part in enumerate(keys[:-1]):
        names = [f.name for f in dataclasses.fields(obj)]
        current = getattr(obj, part, None) if part in names else None
        if not dataclasses.is_dataclass(current):
            where = ".".join(keys[: i + 1])
            sections = [n for n in names if dataclasses.is_dataclass(getattr(obj, n))]
            near = difflib.get_close_matches(part, sections, n=1)
            prefix = ".".join(keys[:i])
            hint = f" (did you mean {prefix + '.' if prefix else ''}{near[0]}?)" if near else ""
            raise bad_value(".".join(keys), value, f"{where} is no section{hint}")
        obj = current


def _nest(path: list[str], value: Any) -> dict[str, Any]:
    out: dict[str, Any] = {path[-1]: value}
    for part in reversed(path[:-1]):
        out = {part: out}
    return out


def validate(cfg: Config) -> None:
    """Cross-field checks that a single key's rule cannot express (each key's own rule was
    checked as it was set)."""
    d, t = cfg.drafter, cfg.train
    buckets = cfg.data.seq_buckets
    if not buckets:
        raise bad_value("data.seq_buckets", buckets, "needs at least one length")
    if buckets != sorted(set(buckets)):
        raise bad_value("data.seq_buckets", buckets, "must be strictly increasing")
    if t.num_anchors > buckets[-1]:
        rule = f"must be at most the longest data.seq_buckets ({buckets[-1]})"
        raise bad_value("train.num_anchors", t.num_anchors, rule)
    if d.block_size > buckets[-1]:
        rule = f"must be at most the longest data.seq_buckets ({buckets[-1]})"
        raise bad_value("drafter.block_size", d.block_size, rule)
    if len(set(d.target_layer_ids)) != len(d.target_layer_ids):
        raise bad_value("drafter.target_layer_ids", d.target_layer_ids, "has duplicates")
    for key in ("target.path", "data.path", "drafter.mask_token"):
        section, name = key.split(".")
        value = getattr(getattr(cfg, section), name)
        if not value.strip():
            raise bad_value(key, value, "must not be empty")
    if len(t.betas) != 2:
        raise bad_value("train.betas", t.betas, "expected two numbers")
    if cfg.runtime.grad_reduce_dtype != "fp32" and cfg.runtime.mode != "processes":
        rule = (
            "processes mode only (threads mode's replicas add their gradients on the device "
            'in fp32); set runtime.grad_reduce_dtype = "fp32"'
        )
        raise bad_value("runtime.grad_reduce_dtype", cfg.runtime.grad_reduce_dtype, rule)
    if d.head_dim % 2:
        raise bad_value("drafter.head_dim", d.head_dim, "must be even (RoPE rotates pairs)")
    if cfg.eval.every and not cfg.data.held_out:
        rule = "needs data.held_out > 0: held-out τ is measured on samples never trained on"
        raise bad_value("eval.every", cfg.eval.every, rule)
    if cfg.runtime.routing == "shared" and cfg.runtime.mode != "threads":
        rule = (
            f'threads mode only (runtime.mode = "{cfg.runtime.mode}" routes batches to fixed '
            'ranks); set runtime.routing = "fixed"'
        )
        raise bad_value("runtime.routing", cfg.runtime.routing, rule)
    if cfg.runtime.routing == "node" and cfg.runtime.mode != "processes":
        rule = 'needs runtime.mode = "processes" (threads mode runs on one node)'
        raise bad_value("runtime.routing", cfg.runtime.routing, rule)
    if d.num_heads and d.num_kv_heads and d.num_heads % d.num_kv_heads:
        rule = f"must be a multiple of drafter.num_kv_heads ({d.num_kv_heads})"
        raise bad_value("drafter.num_heads", d.num_heads, rule)


class TargetShape(Protocol):
    """What the config is checked against once the target's config.json is read."""

    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int
    max_positions: int | None


def check_target_fit(cfg: Config, target: TargetShape, default_layer_ids: list[int]) -> None:
    """The checks that need the target's shape: before any data is read or model is built.

    `default_layer_ids`: DFlash's spread for this target, used when target_layer_ids is empty."""
    d = cfg.drafter
    top = target.num_layers - 1
    if d.target_layer_ids:
        if max(d.target_layer_ids) > top:
            rule = f"the target has layers 0..{top}"
            raise bad_value("drafter.target_layer_ids", d.target_layer_ids, rule)
    elif (
        len(default_layer_ids) != d.num_layers
        or len(set(default_layer_ids)) != len(default_layer_ids)
        or not all(0 <= i <= top for i in default_layer_ids)
    ):
        spread = f" (it would read {show(default_layer_ids)})" if default_layer_ids else ""
        rule = (
            f"too many for DFlash's default spread over the target's {target.num_layers}"
            f" layers{spread}; set drafter.target_layer_ids"
        )
        raise bad_value("drafter.num_layers", d.num_layers, rule)
    heads = d.num_heads or target.num_heads
    kv_heads = d.num_kv_heads or target.num_kv_heads
    if heads % kv_heads:
        key, value = (
            ("drafter.num_heads", d.num_heads)
            if d.num_heads
            else ("drafter.num_kv_heads", d.num_kv_heads)
        )
        rule = f"{heads} query heads must be a multiple of {kv_heads} key/value heads"
        if not d.num_heads:
            rule += f" (the target has {target.num_heads} heads)"
        raise bad_value(key, value, rule)
    head_dim = d.head_dim or target.head_dim
    if head_dim % 2:
        raise bad_value("drafter.head_dim", d.head_dim, f"{head_dim} is odd (RoPE rotates pairs)")
    longest = cfg.data.seq_buckets[-1]
    if target.max_positions is not None and longest > target.max_positions:
        rule = f"{longest} is beyond the target's {target.max_positions} positions"
        raise bad_value("data.seq_buckets", cfg.data.seq_buckets, rule)


def check_mask_token(cfg: Config, mask_id: int, vocab_size: int) -> None:
    if mask_id >= vocab_size:
        rule = (
            f"its id {mask_id} is outside the target's {vocab_size}-row embedding;"
            " use a token the tokenizer reserves"
        )
        raise bad_value("drafter.mask_token", cfg.drafter.mask_token, rule)


def _read_toml(path: Path) -> dict[str, Any]:
    name = show_path(path)
    try:
        text = read_text_file(path, f"config: file {name}")
    except TextFileError as e:
        raise ConfigError(str(e)) from None
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"config: file {name}: not TOML ({one_line(str(e))})") from None
    except ValueError as e:  # an integer over 4300 digits
        raise ConfigError(f"config: file {name}: not TOML ({one_line(str(e))})") from None
    except RecursionError:
        raise ConfigError(f"config: file {name}: not TOML (nested too deep)") from None


def one_line(text: str, limit: int = 200) -> str:
    """The first line of a message, bounded: what an error line carries."""
    lines = text.strip().splitlines()
    first = lines[0] if lines else ""
    return first if len(first) <= limit else first[: limit - 3] + "..."


def load_config(path: str | Path | None, overrides: list[str] | None = None) -> Config:
    cfg = Config()
    if path is not None:
        p = Path(path)
        data = _read_toml(p)
        if "name" not in data:
            data["name"] = p.stem
        _apply(cfg, data, "")
    return apply_overrides(cfg, overrides or [])


class OverrideErrors(ConfigError):
    """Every bad `--set`, one line each (`lines`, `config: KEY = VALUE: rule`): all of them
    at once, not the first only, so one relaunch fixes them all."""

    def __init__(self, lines: list[str]) -> None:
        super().__init__("\n".join(lines))
        self.lines = lines


def error_lines(e: ConfigError) -> list[str]:
    """The lines a ConfigError is said in: one per bad override, else its first line."""
    return [one_line(x) for x in e.lines] if isinstance(e, OverrideErrors) else [one_line(str(e))]


def apply_overrides(cfg: Config, overrides: list[str]) -> Config:
    """Apply `section.key=value` overrides (TOML values) in place, then validate. Each bad
    one is a line of one OverrideErrors; the good ones are applied all the same."""
    bad = []
    for text in overrides:
        try:
            keys, value = _parse_override(text)
            _check_sections(cfg, keys, value)
            _apply(cfg, _nest(keys, value), "")
        except ConfigError as e:
            bad.append(str(e))
    if bad:
        raise OverrideErrors(bad)
    validate(cfg)
    return cfg


def check_launch(config_toml: str, overrides: list[str]) -> None:
    """A launch's config text and overrides, checked as the trainer will check them before
    anything is shipped or started (the monitor's `launch` and `demo`): a ConfigError."""
    try:
        data = tomllib.loads(config_toml)
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"config: not TOML ({one_line(str(e))})") from None
    cfg = Config()
    _apply(cfg, data, "")
    apply_overrides(cfg, overrides)


def config_from_dict(data: Any, source: str = "config") -> Config:
    """Rebuild a config saved with `to_dict` (config.json of a run dir; its "run" is metadata)."""
    if not isinstance(data, dict):
        raise ConfigError(f"config: {source}: expected a JSON object, got {show(data)}")
    cfg = Config()
    _apply(cfg, {k: v for k, v in data.items() if k != "run"}, "")
    validate(cfg)
    return cfg

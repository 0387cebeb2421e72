"""Everything a run needs before its first step: target, tokenizer, data, drafters, optimizer."""

from __future__ import annotations

import dataclasses
import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from trainer.builtins.progress import reporting
from trainer.builtins.resolve import resolve_data_path, resolve_target_path
from trainer.config import Config, check_mask_token, check_target_fit
from trainer.contract.heartbeat import DataInfo
from trainer.contract.phases import LOADING_DATA, LOADING_TARGET, STARTING
from trainer.data.held_out import split_held_out
from trainer.data.packing import packed_batches_per_epoch
from trainer.data.samples import (
    LoadReport,
    Sample,
    batches_per_epoch,
)
from trainer.data.tokenized import load_tokenized
from trainer.evaluation.export import warm_start
from trainer.evaluation.graphs import check_cuda_graphs
from trainer.model.attention import compiled_flex_attention, resolve_backend
from trainer.model.blocks import default_gamma
from trainer.model.drafter import DFlashDrafter, DrafterArch
from trainer.model.optim import make_optimizer
from trainer.model.replicas import DrafterReplicas
from trainer.model.step import LossSettings
from trainer.runtime.faults import FaultPlan
from trainer.targets import fp8 as fp8_weights
from trainer.targets.load import (
    LoadedTarget,
    TargetInfo,
    default_target_layer_ids,
    load_embeddings,
    load_target,
    load_tokenizer,
    read_target_info,
    resolve_dtype,
    resolve_packed_attention,
)

LOADER_UNIT = "target copies"  # the loader ends while compiling: its count stays its own


class TargetLoader(threading.Thread):
    """Loads one target copy per distinct target device, off the main thread."""

    def __init__(
        self,
        path: Path,
        layer_ids: list[int],
        devices: list[torch.device],
        dtype_name: str,
        progress: Callable[[int], None],
        span: tuple[Callable[[], None], Callable[[], None]],
        delay_s: float = 0.0,
        embeddings_only: bool = False,
        packed_attention: str = "auto",
    ) -> None:
        super().__init__(name="target-loader", daemon=True)
        # transformers resolves its classes lazily, and a lazy import racing another thread's
        # fails ("Could not import module …", seen once in a CPU test run): resolve the
        # loader's entry point here, on the starting thread, before the thread exists.
        from transformers import AutoModelForCausalLM  # noqa: F401

        self.path, self.layer_ids, self.devices = path, layer_ids, devices
        self.dtype_name, self.progress = dtype_name, progress
        self.span, self.delay_s = span, delay_s
        self.embeddings_only = embeddings_only  # a drafter rank: no target layers
        self.packed_attention = packed_attention  # target.packed_attention
        self._targets: dict[torch.device, LoadedTarget] = {}
        self._error: BaseException | None = None

    def run(self) -> None:
        started, ended = self.span
        started()
        try:
            time.sleep(self.delay_s)  # DFLASH_FAULT=slow:load_target:S (a slow disk)
            for i, dev in enumerate(self.devices):
                dtype = resolve_dtype(self.dtype_name, dev)
                if self.embeddings_only:
                    self._targets[dev] = load_embeddings(self.path, dtype, dev)
                else:
                    self._targets[dev] = load_target(
                        self.path,
                        self.layer_ids,
                        dtype,
                        dev,
                        self.packed_attention,
                        fp8=self.dtype_name == "fp8",
                    )
                self.progress(i + 1)  # counted in target copies only (build_run)
        except BaseException as e:  # re-raised on the main thread by result()
            self._error = e
        finally:
            ended()

    def result(self) -> dict[torch.device, LoadedTarget]:
        self.join()
        if self._error is not None:
            raise self._error
        return self._targets


def _built(
    phase: Callable[..., None], progress: Callable[..., None], unit: str, done: int, total: int
) -> None:
    """A builtin's first build, counted in `starting`'s progress (the monitor shows it).
    Each unit's first report (0 or 1 done) starts its count."""
    if done in (0, 1):
        phase(STARTING, total=total, unit=unit)
    progress(done, unit)


def resolve_device(name: str, key: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda:0" if torch.cuda.is_available() else "cpu")
    dev = torch.device(name)
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"{key}: {name!r} requested but CUDA is not available")
        index = dev.index or 0
        if index >= torch.cuda.device_count():
            raise ValueError(
                f"{key}: {name!r} but only {torch.cuda.device_count()} GPU(s) are visible"
            )
        dev = torch.device("cuda", index)
    return dev


def compile_layers(model: DFlashDrafter) -> None:
    """Compile each decoder layer in place (state_dict keys unchanged) on CUDA devices.

    All layers share one graph per shape bucket; the warm-up compiles them on one thread
    before any worker starts."""
    if model.embed_weight.device.type != "cuda":
        return
    # Create the compiled flex_attention now. Made lazily inside the first traced layer, it
    # left that graph guarded on "not created yet", a guard no later call passes: layer 0's
    # graph then recompiled at the first training step, in every drafter thread at once.
    compiled_flex_attention()
    for layer in model.layers:
        layer.compile(dynamic=False)


def drafter_arch(cfg: Config, info: TargetInfo, layer_ids: list[int], mask_id: int) -> DrafterArch:
    d = cfg.drafter
    return DrafterArch(
        hidden_size=info.hidden_size,
        num_layers=d.num_layers,
        num_heads=d.num_heads or info.num_heads,
        num_kv_heads=d.num_kv_heads or info.num_kv_heads,
        head_dim=d.head_dim or info.head_dim,
        intermediate_size=d.intermediate_size or info.intermediate_size,
        vocab_size=info.vocab_size,
        rms_norm_eps=info.rms_norm_eps,
        rope_theta=info.rope_theta,
        block_size=d.block_size,
        mask_token_id=mask_id,
        target_layer_ids=tuple(layer_ids),
    )


def loss_settings(cfg: Config, device: torch.device) -> LossSettings:
    t = cfg.train
    return LossSettings(
        backend=resolve_backend(t.attention, device),
        block_size=cfg.drafter.block_size,
        gamma=t.gamma or default_gamma(cfg.drafter.block_size),
        chunk_blocks=t.loss_chunk_blocks,
        topk=t.topk,
        impl=t.loss_impl,
    )


@dataclass
class RunSetup:
    cfg: Config
    target_devices: list[torch.device]
    drafter_devices: list[torch.device]
    target_path: Path
    targets: dict[torch.device, LoadedTarget]  # one loaded model per distinct device
    tokenizer: Any
    arch: DrafterArch
    replicas: DrafterReplicas
    optimizer: torch.optim.Optimizer
    samples: list[Sample]
    data_report: LoadReport
    batches_per_epoch: int
    total_steps: int
    settings: LossSettings
    loader: Any = None  # TargetLoader until finish_loading()
    warm_start: str = ""  # what drafter.init_from loaded, for train.log
    held_out: list[Sample] = field(default_factory=list)  # never trained on (data.held_out)

    def finish_loading(self) -> None:
        """Wait for the target; give every drafter replica its real embedding and head."""
        if self.loader is None:
            return
        self.targets = self.loader.result()
        self.loader = None
        first = self.targets[self.target_devices[0]]
        for model in self.replicas.models:
            dev = model.embed_weight.device
            source = self.targets.get(dev, first)
            tied = model.lm_head_weight is model.embed_weight
            with torch.no_grad():
                # Same shape, dtype and device as the placeholders: compiled code stays valid.
                model.embed_weight.data = source.embed_weight.to(dev)
                if not tied:
                    model.lm_head_weight.data = source.lm_head_weight.to(dev)

    @property
    def devices(self) -> list[torch.device]:
        return list(dict.fromkeys([*self.target_devices, *self.drafter_devices]))


class StartupLaps:
    """How long each step of the start-up took, said in one log line: the cold start is
    judged against a minute, and this says which part to look at."""

    def __init__(self) -> None:
        self.t = time.monotonic()
        self.laps: list[tuple[str, float]] = []

    def __call__(self, name: str) -> None:
        now = time.monotonic()
        self.laps.append((name, now - self.t))
        self.t = now

    def line(self) -> str:
        return "start-up: " + ", ".join(f"{n} {s:.1f}s" for n, s in self.laps)


def build_run(
    cfg: Config,
    warn: Callable[[str], None],
    phase: Callable[..., None] = lambda *_a, **_k: None,
    progress: Callable[..., None] = lambda _d, _u=None: None,
    load_span: tuple[Callable[[], None], Callable[[], None]] = (lambda: None, lambda: None),
    faults: FaultPlan | None = None,
    preflight: Callable[[Path, str, int], None] = lambda _p, _d, _k: None,
    on_data: Callable[[DataInfo], None] = lambda _i: None,
    laps: StartupLaps | None = None,
    batches_per_step: int | None = None,
    run_target: bool = True,
) -> RunSetup:
    """Check the cheap things first (devices, paths), then tokenize, then load weights.
    `preflight(target path, target device, layers kept)` runs once the target's config is
    known, before anything heavy (trainer/targets/preflight.py). `batches_per_step`: the job's
    drafter replicas when this process holds only some (processes mode); default all.
    `run_target` False: this process runs no target forward (a drafter rank), so only the
    target's embedding and head are loaded, not its layers."""
    lap = laps or StartupLaps()
    rt = cfg.runtime
    target_devices = [resolve_device(d, "runtime.targets") for d in rt.targets]
    drafter_devices = [resolve_device(d, "runtime.drafters") for d in rt.drafters]
    lap("devices")
    settings = loss_settings(cfg, drafter_devices[0])
    for dev in drafter_devices[1:]:
        loss_settings(cfg, dev)  # refuses flex on a CPU replica too
    check_cuda_graphs(cfg.eval.cuda_graphs, target_devices[0])  # where the eval runs
    if run_target:  # refuses varlen or FP8 where it cannot run, before anything loads
        for dev in target_devices:
            fp8_weights.check_fp8_device(cfg.target.dtype, dev)
            resolve_packed_attention(
                cfg.target.packed_attention, dev, resolve_dtype(cfg.target.dtype, dev)
            )
    with reporting(lambda unit, done, total: _built(phase, progress, unit, done, total)):
        data_path = resolve_data_path(cfg.data.path)  # a builtin may be built here, once
        target_path = resolve_target_path(cfg.target.path)
    info = read_target_info(target_path)
    if run_target and fp8_weights.quantization_config(target_path) is not None:
        fp8_weights.check_block_scaled(target_path)  # the headers only: before the heavy load
    n_draft = cfg.drafter.num_layers
    # DFlash's spread reads one target layer per drafter layer: none for more than the target has.
    default_ids = (
        default_target_layer_ids(info.num_layers, n_draft) if n_draft <= info.num_layers else []
    )
    check_target_fit(cfg, info, default_ids)  # bad input exits 2 here, before data or models
    layer_ids = cfg.drafter.target_layer_ids or default_ids
    lap("target config")
    preflight(target_path, str(target_devices[0]), max(layer_ids) + 1)
    lap("preflight")
    tokenizer, mask_id = load_tokenizer(target_path, cfg.drafter.mask_token)
    check_mask_token(cfg, mask_id, info.vocab_size)
    lap("tokenizer")

    faults = faults or FaultPlan("")
    phase(LOADING_DATA)
    time.sleep(faults.slow_s("data"))  # DFLASH_FAULT=slow:data:S
    d = cfg.data
    data = load_tokenized(
        data_path,
        tokenizer,
        d.format,
        max(d.seq_buckets),
        warn,
        cache_root=Path(d.cache_dir).expanduser() if d.cache_dir else None,
        use_cache=d.cache,
        workers=d.tokenize_workers,
        on_total=lambda n: phase(LOADING_DATA, total=n, unit="lines"),
        progress=progress,
        vocab_size=info.vocab_size,
    )
    samples, report = data.samples, data.report
    samples, held_out = split_held_out(samples, d.held_out)  # never trained on
    on_data(
        dataclasses.replace(data.info, packing=d.packing, truncated_tokens=report.truncated_tokens)
    )
    lap("data")
    count = packed_batches_per_epoch if d.packing else batches_per_epoch
    per_epoch = count(samples, d.seq_buckets, cfg.train.batch_size)
    lap("batches")

    # The drafters first, on placeholder embedding/head tensors of the target's shape:
    # compiling needs shapes, not weights, so the target loads on a thread meanwhile and
    # `finish_loading` puts its real (frozen, shared) weights in place.
    arch = drafter_arch(cfg, info, layer_ids, mask_id)
    torch.manual_seed(cfg.train.seed)
    placeholders: dict[torch.device, tuple[Tensor, Tensor]] = {}
    for dev in dict.fromkeys(drafter_devices):
        dtype = resolve_dtype(cfg.target.dtype, dev)
        embed = torch.empty(info.vocab_size, info.hidden_size, dtype=dtype, device=dev)
        head = embed if info.tied_embeddings else torch.empty_like(embed)
        placeholders[dev] = (embed, head)
    # Built on its device: initialising ~1B parameters on the host took 10-15 s of a restart.
    with torch.device(drafter_devices[0]):
        primary = DFlashDrafter(arch, *placeholders[drafter_devices[0]])
    warmed = ""
    if cfg.drafter.init_from:  # before the replicas copy it; a resumed checkpoint wins later
        folder = Path(cfg.drafter.init_from).expanduser()
        warmed = f"warm start: {warm_start(primary, arch, folder)} drafter tensors from {folder}"
    replicas = DrafterReplicas(primary, drafter_devices, placeholders)
    if cfg.train.compile_drafter:
        for model in replicas.models:
            compile_layers(model)
    lap("drafters")
    distinct = list(dict.fromkeys(target_devices))
    phase(LOADING_TARGET, total=len(distinct), unit=LOADER_UNIT)
    loader = TargetLoader(
        target_path,
        layer_ids,
        distinct,
        cfg.target.dtype,
        lambda done: progress(done, LOADER_UNIT),
        load_span,
        faults.slow_s("load_target"),
        embeddings_only=not run_target,
        packed_attention=cfg.target.packed_attention,
    )
    loader.start()
    optimizer = make_optimizer(primary, cfg.train, drafter_devices[0])
    lap("optimizer")
    per_step = batches_per_step or len(drafter_devices)
    total = cfg.train.max_steps or max(1, math.ceil(cfg.train.epochs * per_epoch / per_step))
    return RunSetup(
        cfg=cfg,
        target_devices=target_devices,
        drafter_devices=drafter_devices,
        target_path=target_path,
        targets={},
        loader=loader,
        tokenizer=tokenizer,
        arch=arch,
        replicas=replicas,
        optimizer=optimizer,
        samples=samples,
        data_report=report,
        batches_per_epoch=per_epoch,
        total_steps=total,
        settings=settings,
        warm_start=warmed,
        held_out=held_out,
    )

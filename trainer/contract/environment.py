"""What a run ran on: the environment fingerprint and the fast-kernel preflight, as records.

Both are written by the trainer before the target's weights load (trainer/targets/preflight.py):
config.json carries them under `run` (`run.environment`, `run.preflight`), the heartbeat
carries the preflight (`Heartbeat.preflight`). An older trainer writes neither: readers
return None. They are read from untrusted files: `read_environment` and `read_preflight`
keep every value they can and reset an odd one to its default (they never fail a run's
whole config.json, and never raise).

The preflight: which layer types the target runs (Qwen3: all full attention; Qwen3.5/3.6:
Gated DeltaNet `linear_attention` layers between `full_attention` ones), which fast-kernel
packages each needs, whether each is installed and works on the device, and the path
transformers will take: `fast`, `slow` (transformers' reference PyTorch fallback on a GPU,
which it takes silently, logging one warning), or `torch` (a CPU run, or a layer type that
needs no extra kernel: the torch path is the only one and no problem).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from trainer.contract.typed import Invalid, decode

FAST, SLOW, TORCH = "fast", "slow", "torch"  # LayerPath.path
MISSING = "missing"  # Environment.fast_kernels: the package is not installed
BROKEN = "not working"  # … installed, but it does not import or a call on the device failed
# How to install each fast-kernel package (PyPI names: `flash-linear-attention` brings
# `fla-core`, which holds fla.ops; causal-conv1d compiles against the torch already there).
INSTALL = {
    "fla": "pip install flash-linear-attention",
    "causal_conv1d": "pip install --no-build-isolation causal-conv1d",
}


@dataclasses.dataclass
class KernelPackage:
    """One fast-kernel package a layer type needs."""

    name: str  # import name: "fla", "causal_conv1d"
    distribution: str = ""  # what pip installs: "flash-linear-attention", "causal-conv1d"
    version: str | None = None  # installed version; None: not installed
    importable: bool | None = None  # None: not tried
    working: bool | None = None  # a tiny call on the device; None: not tried (no GPU)
    used: bool | None = None  # whether transformers took it; None: not known
    error: str = ""  # why it does not import or work (one line)

    def state(self) -> str:
        """The fingerprint's word for it: its version, `missing` or `not working`."""
        if self.version is None and not self.importable:
            return MISSING
        if self.importable is False or self.working is False:
            return BROKEN
        return self.version or "?"


@dataclasses.dataclass
class LayerPath:
    """One layer type of the target and the path its layers take."""

    layer_type: str  # "linear_attention", "full_attention"
    count: int = 0  # layers of this type the run loads (the target is truncated)
    packages: list[KernelPackage] = dataclasses.field(default_factory=list)  # needed
    path: str = TORCH  # fast | slow | torch
    why: str = ""


@dataclasses.dataclass
class Preflight:
    """The fast-kernel preflight of one run, decided from the target's config alone."""

    model_type: str = ""
    device: str = ""  # the target's device: "cuda:0", "cpu"
    layers: list[LayerPath] = dataclasses.field(default_factory=list)
    transformers: str = ""  # the version whose decision this mirrors
    decided_by: str = ""  # how: "transformers' own resolved kernels", "config only (cpu)"
    seconds: float = 0.0  # how long the preflight took
    error: str = ""  # the preflight itself failed: why (the run goes on)

    def slow(self) -> list[LayerPath]:
        """Layer types that run a slow fallback, or whose fast kernel fails on the device."""
        return [
            lp
            for lp in self.layers
            if lp.path == SLOW or any(p.working is False for p in lp.packages)
        ]

    def summary(self) -> str:
        """One line: "24 linear_attention: slow (fla missing); 8 full_attention: fast"."""
        parts = []
        for lp in self.layers:
            bad = [
                f"{p.name} {MISSING if p.version is None else BROKEN}"
                for p in lp.packages
                if p.state() in (MISSING, BROKEN)
            ]
            parts.append(
                f"{lp.count} {lp.layer_type}: {lp.path}" + (f" ({', '.join(bad)})" if bad else "")
            )
        return "; ".join(parts) or (self.error and f"preflight failed: {self.error}") or ""


@dataclasses.dataclass
class Environment:
    """The software and hardware a run ran on (config.json `run.environment`)."""

    python: str = ""
    torch: str = ""
    cuda: str | None = None  # torch.version.cuda; None: a CPU build
    driver: str | None = None  # the NVIDIA driver (NVML); None: no NVML here
    transformers: str = ""
    fast_kernels: dict[str, str] = dataclasses.field(default_factory=dict)  # name -> version,
    # `missing` or `not working`
    gpus: list[str] = dataclasses.field(default_factory=list)  # names, in CUDA order
    gpu_count: int = 0
    host: str = ""

    def describe(self) -> str:
        """Compact: "torch 2.13 cu12.8, transformers 5.24, py 3.11, 8× NVIDIA H200, fla 0.4"."""
        torch_part = f"torch {self.torch or '?'}" + (f" cu{self.cuda}" if self.cuda else "")
        parts = [torch_part, f"transformers {self.transformers or '?'}"]
        if self.python:
            parts.append(f"py {self.python}")
        if self.gpu_count:
            names = sorted(set(self.gpus)) or ["GPU"]
            parts.append(f"{self.gpu_count}× {'+'.join(names)}")
        if self.driver:
            parts.append(f"driver {self.driver}")
        parts.extend(f"{k} {v}" for k, v in sorted(self.fast_kernels.items()))
        return ", ".join(parts)

    def differences(self, before: Environment) -> list[str]:
        """What changed since `before`, each as "what old → new" ("fla 0.4.1 → missing")."""
        out = []
        for label, old, new in (
            ("torch", before.torch, self.torch),
            ("CUDA", before.cuda, self.cuda),
            ("driver", before.driver, self.driver),
            ("transformers", before.transformers, self.transformers),
            ("python", before.python, self.python),
        ):
            if old and new and old != new:
                out.append(f"{label} {old} → {new}")
            elif (old or new) and old != new and label in ("torch", "transformers"):
                out.append(f"{label} {old or '?'} → {new or '?'}")
        for name in sorted(set(before.fast_kernels) | set(self.fast_kernels)):
            old_k = before.fast_kernels.get(name, "?")
            new_k = self.fast_kernels.get(name, "?")
            if old_k != new_k:
                out.append(
                    f"{name} {new_k}" if new_k in (MISSING, BROKEN) else f"{name} {old_k} → {new_k}"
                )
        if before.gpus and self.gpus and sorted(before.gpus) != sorted(self.gpus):
            out.append(f"GPUs {_gpus(before)} → {_gpus(self)}")
        if before.host and self.host and before.host != self.host:
            out.append(f"host {before.host} → {self.host}")
        return out


def _gpus(env: Environment) -> str:
    names = sorted(set(env.gpus))
    return f"{env.gpu_count}× {'+'.join(names)}"


def _run_section(config: Any) -> dict[str, Any]:
    run = config.get("run") if isinstance(config, dict) else None
    return run if isinstance(run, dict) else {}


def _lenient(cls: type[Any], data: Any) -> Any:
    """`data` as a `cls` record with every odd value reset to its default; None when it is
    not an object at all."""
    if not isinstance(data, dict):
        return None
    try:
        return decode(cls, data, lenient=True)
    except Invalid:  # a required field is bad: only `name`/`layer_type` deep inside
        return None


def parse_environment(data: Any) -> Environment | None:
    env: Environment | None = _lenient(Environment, data)
    return env


def parse_preflight(data: Any) -> Preflight | None:
    if not isinstance(data, dict):
        return None
    layers = data.get("layers")
    clean = dict(data)
    if isinstance(layers, list):
        # A bad layer (a required name missing) drops that layer, not the whole record.
        good = []
        for item in layers:
            lp = _parse_layer(item)
            if lp is not None:
                good.append(dataclasses.asdict(lp))
        clean["layers"] = good
    pf: Preflight | None = _lenient(Preflight, clean)
    return pf


def _parse_layer(item: Any) -> LayerPath | None:
    if not isinstance(item, dict):
        return None
    packages = item.get("packages")
    clean = dict(item)
    if isinstance(packages, list):
        clean["packages"] = [
            dataclasses.asdict(p)
            for p in (_lenient(KernelPackage, x) for x in packages)
            if p is not None
        ]
    lp: LayerPath | None = _lenient(LayerPath, clean)
    return lp


def read_environment(config: Any) -> Environment | None:
    """config.json's `run.environment` (config.json as read by `records.read_config`)."""
    return parse_environment(_run_section(config).get("environment"))


def read_preflight(config: Any) -> Preflight | None:
    """config.json's `run.preflight`."""
    return parse_preflight(_run_section(config).get("preflight"))

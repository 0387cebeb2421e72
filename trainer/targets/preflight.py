"""Before the target's weights load: which fast kernels it needs, and which path it will take.

A Qwen3.5/3.6 target mixes Gated DeltaNet (`linear_attention`) layers with `full_attention`
ones. transformers runs the DeltaNet layers with `fla` (chunk_gated_delta_rule) and
`causal_conv1d` (causal_conv1d_fn) when it can import them, and otherwise falls back to its
reference PyTorch code, logging one warning: correct, but much slower. That choice is made
when transformers imports the model's modeling module, so this module asks that module what
it resolved: transformers 5.17 and 5.24 (seen on an H200 and here) wrap each kernel
function in a closure that holds `implementation` and `is_new_implementation`; an older 5.x
has `is_fast_path_available` and the kernel functions, None when missing; else this asks
transformers' own `is_flash_linear_attention_available` / `is_causal_conv1d_available`.
On a GPU it then calls each kernel the training forward uses once, on tiny tensors: an
installed kernel that fails there is found before the load.

On a CPU the fast kernels do not apply: the preflight reads the config and the installed
versions only (no transformers import, well under a second) and says "cpu: torch path".

`environment()` is the run's fingerprint (torch, CUDA, driver, transformers, Python, the
fast-kernel packages, GPUs, host). Both records are the contract's
(trainer/contract/environment.py).
"""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
import json
import platform
import socket
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trainer.contract.environment import (
    FAST,
    SLOW,
    TORCH,
    Environment,
    KernelPackage,
    LayerPath,
    Preflight,
)

FULL_ATTENTION, LINEAR_ATTENTION = "full_attention", "linear_attention"
# Model types whose linear_attention layers are Gated DeltaNet (transformers' modeling
# module is the model type without "_text").
GATED_DELTANET = ("qwen3_5", "qwen3_5_text", "qwen3_5_moe", "qwen3_5_moe_text", "qwen3_next")
# The fast-kernel packages a layer type needs: (import name, what pip installs, the kernel
# functions a training forward calls; the decode-only ones are not tried).
KERNELS: dict[str, tuple[tuple[str, str, tuple[str, ...]], ...]] = {
    LINEAR_ATTENTION: (
        ("fla", "flash-linear-attention", ("chunk_gated_delta_rule",)),
        ("causal_conv1d", "causal-conv1d", ("causal_conv1d_fn",)),
    ),
}
# Packages whose torch fallback costs little: causal_conv1d's is a 4-tap depthwise conv
# (a few % of a Gated DeltaNet layer), and packed rows use fla's own conv, which takes the
# documents' boundaries. Missing, they are named in `why`, and the path stays fast.
OPTIONAL = {"causal_conv1d"}
# Where each package's version is recorded (fla ships as fla-core + flash-linear-attention).
DISTRIBUTIONS = {"fla": ("fla-core", "flash-linear-attention"), "causal_conv1d": ("causal-conv1d",)}


def text_config(config: dict[str, Any]) -> dict[str, Any]:
    """The language model's config: `text_config` of a multimodal wrapper, else itself."""
    text = config.get("text_config")
    return text if isinstance(text, dict) else config


def read_config_json(target_path: Path) -> dict[str, Any]:
    data = json.loads((Path(target_path) / "config.json").read_text())
    if not isinstance(data, dict):
        raise ValueError("config.json is not a JSON object")
    return data


def layer_counts(config: dict[str, Any], keep: int | None = None) -> dict[str, int]:
    """{layer type: how many of the first `keep` layers} (Qwen3 has no `layer_types`: all
    full attention)."""
    text = text_config(config)
    n = text.get("num_hidden_layers")
    n = n if isinstance(n, int) and n > 0 else 0
    types = text.get("layer_types")
    if not isinstance(types, list) or not types:
        types = [FULL_ATTENTION] * n
    types = types[: keep if keep is not None else len(types)]
    counts: dict[str, int] = {}
    for t in types:
        counts[str(t)] = counts.get(str(t), 0) + 1
    return counts


def package_version(name: str) -> str | None:
    """The installed version, without importing it; None when not installed."""
    for dist in DISTRIBUTIONS.get(name, (name,)):
        try:
            return importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            continue
    if importlib.util.find_spec(name) is not None:
        return "?"  # importable, installed some other way
    return None


def transformers_version() -> str:
    try:
        return importlib.metadata.version("transformers")
    except importlib.metadata.PackageNotFoundError:
        return ""


# -- transformers' own decision --------------------------------------------------------------
@dataclass
class Resolved:
    """One kernel function as transformers resolved it."""

    func: str  # "chunk_gated_delta_rule"
    package: str  # "fla"
    used: bool  # transformers calls the package's kernel (not its torch fallback)
    call: Callable[..., Any] | None  # what the model calls (the wrapper, or the kernel)


def _closure(fn: Any) -> dict[str, Any]:
    code, cells = getattr(fn, "__code__", None), getattr(fn, "__closure__", None)
    if code is None or not cells:
        return {}
    out = {}
    for name, cell in zip(code.co_freevars, cells, strict=False):
        try:
            out[name] = cell.cell_contents
        except ValueError:  # an empty cell
            continue
    return out


def _kernel_closure(value: Any, depth: int = 3) -> dict[str, Any]:
    """The closure of transformers' kernel-or-fallback wrapper behind `value`, else {}.

    Up to 5.17 the module-level name is the wrapper function itself; from 5.25 it is a
    small `nn.Module` whose `forward` closes over that wrapper: follow `forward` and the
    functions a closure holds, a few levels deep."""
    cv = _closure(value)
    if "is_new_implementation" in cv or depth == 0:
        return cv
    inner = [getattr(getattr(value, "forward", None), "__func__", None), *cv.values()]
    for fn in inner:
        if callable(fn) and hasattr(fn, "__code__"):
            found = _kernel_closure(fn, depth - 1)
            if "is_new_implementation" in found:
                return found
    return {}


def resolved_kernels(module: Any) -> tuple[list[Resolved], str]:
    """What the modeling module resolved, and how that was read."""
    found = []
    for value in vars(module).values():
        cv = _kernel_closure(value) if callable(value) else {}
        if "is_new_implementation" in cv and isinstance(cv.get("package"), str):
            func = cv.get("func_name", getattr(value, "__name__", "?"))
            used = bool(cv["is_new_implementation"])
            found.append(Resolved(str(func), cv["package"], used, value))
    if found:
        return found, "transformers' resolved kernel functions"
    if hasattr(module, "is_fast_path_available"):  # older transformers 5.x
        for func, package in (
            ("chunk_gated_delta_rule", "fla"),
            ("causal_conv1d_fn", "causal_conv1d"),
        ):
            fn = getattr(module, func, None)
            found.append(Resolved(func, package, fn is not None, fn))
        return found, "transformers' is_fast_path_available and kernel functions"
    from transformers.utils import import_utils

    for func, package, helper in (
        ("chunk_gated_delta_rule", "fla", "is_flash_linear_attention_available"),
        ("causal_conv1d_fn", "causal_conv1d", "is_causal_conv1d_available"),
    ):
        check = getattr(import_utils, helper, None)
        found.append(Resolved(func, package, bool(check and check()), None))
    return found, "transformers' availability helpers"


def modeling_module(model_type: str) -> Any:
    base = model_type.removesuffix("_text")
    return importlib.import_module(f"transformers.models.{base}.modeling_{base}")


# -- a tiny call on the device --------------------------------------------------------------
def _try_chunk_gated_delta_rule(fn: Callable[..., Any], device: str) -> None:
    import torch

    b, t, h, d = 1, 64, 2, 64
    q, k, v = (torch.randn(b, t, h, d, device=device, dtype=torch.bfloat16) for _ in range(3))
    g = -torch.rand(b, t, h, device=device, dtype=torch.float32)
    beta = torch.rand(b, t, h, device=device, dtype=torch.bfloat16)
    out = fn(q, k, v, g=g, beta=beta, initial_state=None, output_final_state=False,
             use_qk_l2norm_in_kernel=True)  # fmt: skip
    out = out[0] if isinstance(out, tuple) else out
    if tuple(out.shape) != (b, t, h, d) or not bool(torch.isfinite(out).all()):
        raise RuntimeError(f"wrong result: shape {tuple(out.shape)}")


def _try_causal_conv1d_fn(fn: Callable[..., Any], device: str) -> None:
    import torch

    x = torch.randn(1, 64, 32, device=device, dtype=torch.bfloat16)
    w = torch.randn(64, 4, device=device, dtype=torch.bfloat16)
    out = fn(x, w, None, activation="silu")
    if tuple(out.shape) != tuple(x.shape) or not bool(torch.isfinite(out).all()):
        raise RuntimeError(f"wrong result: shape {tuple(out.shape)}")


TRIALS: dict[str, Callable[[Callable[..., Any], str], None]] = {
    "chunk_gated_delta_rule": _try_chunk_gated_delta_rule,
    "causal_conv1d_fn": _try_causal_conv1d_fn,
}


def try_kernel(resolved: Resolved, device: str) -> str:
    """ "" when the kernel ran on `device`, else why not (one line)."""
    trial = TRIALS.get(resolved.func)
    if trial is None or resolved.call is None:
        return ""
    try:
        trial(resolved.call, device)
        import torch

        if device.startswith("cuda"):
            torch.cuda.synchronize(device)
    except Exception as e:
        return f"{type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}"[
            :300
        ]
    return ""


# -- the preflight ----------------------------------------------------------------------------
def _package(name: str, dist: str) -> KernelPackage:
    version = package_version(name)
    return KernelPackage(name=name, distribution=dist, version=version)


def _decide_gpu(
    lp: LayerPath, module: Any, device: str, note: Callable[[str], None]
) -> tuple[LayerPath, str]:
    """Fill `lp` (needing packages) from transformers' decision and a call on `device`."""
    resolved, how = resolved_kernels(module)
    wanted = {f for _n, _d, funcs in KERNELS[lp.layer_type] for f in funcs}
    missing: list[str] = []
    failing: list[str] = []
    optional: list[str] = []
    for pkg in lp.packages:
        mine = [r for r in resolved if r.package == pkg.name and r.func in wanted]
        pkg.used = bool(mine) and all(r.used for r in mine)
        if pkg.version is None:
            pkg.importable = False
            pkg.error = "not installed"
        elif not pkg.used:
            pkg.importable = False
            pkg.error = _import_error(pkg.name) or "transformers did not take it"
        else:
            pkg.importable = True
            note(f"preflight: trying {pkg.name} on {device}")
            errors = [e for r in mine if (e := try_kernel(r, device))]
            pkg.working = not errors
            pkg.error = "; ".join(errors)
        if not pkg.used:
            (optional if pkg.name in OPTIONAL else missing).append(f"{pkg.name} {pkg.error}")
        elif pkg.working is False:
            failing.append(f"{pkg.name} fails on {device}: {pkg.error}")
    if missing:
        lp.path = SLOW
        lp.why = "transformers' torch fallback: " + "; ".join(missing + optional)
    else:
        lp.path = FAST
        cheap = [f"{o} (its torch fallback is cheap)" for o in optional]
        lp.why = "; ".join(failing + cheap) or "fast kernels in use and working"
    return lp, how


def _import_error(name: str) -> str:
    try:
        importlib.import_module(name)
    except Exception as e:
        return f"does not import ({type(e).__name__}: {str(e)[:200]})"
    return ""


def run_preflight(
    target_path: Path,
    device: str,
    keep_layers: int | None = None,
    note: Callable[[str], None] = lambda _s: None,
) -> Preflight:
    """The preflight of a target (a folder with config.json) on `device` ("cuda:0", "cpu").
    `device` is the boundary a test may set: the decision below it is the real one. Never
    raises: a failure is the record's `error` (the load that follows says more)."""
    started = time.perf_counter()
    pf = Preflight(device=device, transformers=transformers_version())
    try:
        config = read_config_json(target_path)
        text = text_config(config)
        pf.model_type = str(text.get("model_type") or config.get("model_type") or "")
        on_gpu = device.startswith("cuda")
        module = None
        for layer_type, count in layer_counts(config, keep_layers).items():
            needs = KERNELS.get(layer_type, ()) if pf.model_type in GATED_DELTANET else ()
            lp = LayerPath(layer_type, count, [_package(n, d) for n, d, _f in needs])
            if not on_gpu:
                lp.path, lp.why = TORCH, f"{device.split(':', maxsplit=1)[0]}: torch path"
                pf.decided_by = "config only (fast kernels apply on GPUs)"
            elif not needs:
                lp.path, lp.why = FAST, "no extra kernel needed (torch attention)"
                pf.decided_by = pf.decided_by or "config only"
            else:
                note(f"preflight: reading transformers' choice for {pf.model_type}")
                module = module or modeling_module(pf.model_type)
                lp, pf.decided_by = _decide_gpu(lp, module, device, note)
            pf.layers.append(lp)
    except Exception as e:
        pf.error = f"{type(e).__name__}: {e}"[:300]
    pf.seconds = round(time.perf_counter() - started, 3)
    return pf


# -- the environment fingerprint ---------------------------------------------------------------
def nvidia_driver() -> str | None:
    """The driver version through NVML (pynvml: installed, or deploy's _vendor copy)."""
    try:
        try:
            import pynvml
        except ImportError:
            vendored = Path(__file__).resolve().parents[2] / "_vendor"  # the release root
            if not (vendored / "pynvml.py").is_file():
                return None
            sys.path.append(str(vendored))
            import pynvml
        pynvml.nvmlInit()
        try:
            v = pynvml.nvmlSystemGetDriverVersion()
        finally:
            pynvml.nvmlShutdown()
        return v.decode() if isinstance(v, bytes) else str(v)
    except Exception:  # no driver, no library: not an error of the run
        return None


def environment(preflight: Preflight | None = None) -> Environment:
    import torch

    gpus: list[str] = []
    if torch.cuda.is_available():
        gpus = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    kernels: dict[str, str] = {}
    for name in DISTRIBUTIONS:
        kernels[name] = _package(name, "").state()
    for lp in preflight.layers if preflight else []:
        for pkg in lp.packages:  # the preflight tried them: its word wins
            kernels[pkg.name] = pkg.state()
    return Environment(
        python=platform.python_version(),
        torch=str(torch.__version__),
        cuda=torch.version.cuda,
        driver=nvidia_driver() if gpus else None,
        transformers=transformers_version(),
        fast_kernels=kernels,
        gpus=gpus,
        gpu_count=len(gpus),
        host=socket.gethostname(),
    )

"""Portable compile caches: a fresh host starts warm.

A cold compile of the 8B config costs ~30 s of a ~56 s start on the H200 (before the block
mask was built from its structure, ~200 s); a warm one ~5 s. The on-disk caches only help the
host that compiled. torch's "mega-cache" (`torch.compiler.save_cache_artifacts`) packs every
cache entry this process compiled or loaded (Inductor graphs with their Triton kernels,
AOTAutograd entries, autotuning results) into one portable blob:

- after its warm-up, a run on a GPU saves the blob to `<compile cache>/artifacts/NAME`
  (NAME: torch's version and the GPU's name: the blob is only valid for both);
- `dflash-tui pull-cache` copies it to the monitor's machine, and `dflash-tui deploy` ships
  what it has to a host, into `<remote dir>/compile-artifacts/` (the agent sets
  DFLASH_COMPILE_ARTIFACTS to that folder for the runs it launches);
- before its warm-up, a run loads the shipped blob for its torch and GPU into the local
  caches (`load_cache_artifacts`), once per blob (their sha256s are kept beside it).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import time
from collections.abc import Callable
from pathlib import Path

import torch

from trainer.fsutil import atomic_write, atomic_write_json

ENV = "DFLASH_COMPILE_ARTIFACTS"
LOADED = "loaded.json"  # in the local artifacts folder: the sha256s already loaded
MAX_BYTES = 1 << 30  # a blob larger than this is not one of ours


def artifact_name(device: torch.device) -> str:
    """'torch-2.11.0-cu130-NVIDIA-H200.bin': what a blob is valid for, as a file name."""
    gpu = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    raw = f"torch-{torch.__version__}-{gpu}"
    return re.sub(r"[^A-Za-z0-9._-]+", "-", raw).strip("-")[:120] + ".bin"


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def describe_loaded(info: object) -> str:
    """'8 entries (aot_autograd 4, inductor 4)': what load_cache_artifacts put in the local
    caches. Its CacheInfo keeps them by kind in `artifacts` (a dict of key lists)."""
    kinds = getattr(info, "artifacts", None)
    if not isinstance(kinds, dict):
        return "no entries"
    counts = {str(k): len(v) for k, v in sorted(kinds.items()) if isinstance(v, list) and v}
    total = sum(counts.values())
    parts = ", ".join(f"{k} {n}" for k, n in counts.items())
    return f"{total} entries ({parts})" if total else "no entries"


def load_shipped(local_dir: Path, device: torch.device, note: Callable[[str], None]) -> bool:
    """Load the blob shipped for this torch and GPU, if there is one not loaded before."""
    shipped = os.environ.get(ENV)
    if not shipped or device.type != "cuda":
        return False
    path = Path(shipped) / artifact_name(device)
    try:
        if not path.is_file() or path.stat().st_size > MAX_BYTES:
            return False
        data = path.read_bytes()
    except OSError as e:
        note(f"compile cache: cannot read {path} ({e.strerror or e}): compiling without it")
        return False
    digest = _sha256(data)
    loaded_path = local_dir / LOADED
    try:
        loaded = json.loads(loaded_path.read_text())
    except (OSError, ValueError):
        loaded = []
    if not isinstance(loaded, list):
        loaded = []
    if digest in loaded:
        return False
    t0 = time.monotonic()
    try:
        info = torch.compiler.load_cache_artifacts(data)
    except Exception as e:  # a blob from another build: compile as if it were not there
        note(f"compile cache: {path.name} shipped by deploy did not load ({e}): compiling")
        return False
    note(
        f"compile cache: loaded {describe_loaded(info)} ({len(data) / 1e6:.1f} MB) shipped by "
        f"deploy from {path} in {time.monotonic() - t0:.1f}s"
    )
    local_dir.mkdir(parents=True, exist_ok=True)
    atomic_write_json(loaded_path, [*loaded[-31:], digest], durable=False)
    return True


def save_after_warmup(
    local_dir: Path, device: torch.device, note: Callable[[str], None], new: bool = True
) -> None:
    """Save this process's compile caches as one blob for other hosts (GPU runs only: a CPU
    run compiles nothing). `new`: this warm-up generated code; a warm one only rewrites the
    blob when there is none."""
    path = local_dir / "artifacts" / artifact_name(device)
    if device.type != "cuda" or (not new and path.is_file()):
        return
    try:
        saved = torch.compiler.save_cache_artifacts()
    except Exception as e:  # never fail a run over a cache it can do without
        note(f"compile cache: could not pack the artifacts ({e})")
        return
    if not saved or not saved[0]:
        return
    data = saved[0]
    try:
        if path.is_file() and _sha256(path.read_bytes()) == _sha256(data):
            return
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(path, lambda f: f.write(data), durable=False)
    except OSError as e:
        note(f"compile cache: could not save the artifacts to {path} ({e.strerror or e})")
        return
    note(
        f"compile cache: {len(data) / 1e6:.1f} MB of portable artifacts in {path} "
        "(dflash-tui pull-cache copies them; deploy ships them to a fresh host)"
    )

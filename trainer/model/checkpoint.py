"""Drafter checkpoints: written atomically, off the training thread, found by step, and
checked before a resume trusts them.

A checkpoint holds only what the drafter trains (not the target's embedding or head), the
optimizer, and the data position. Anchors and feature noise are seeded per batch, so model +
optimizer + position reproduce an uninterrupted run exactly. Beside each `step-N.pt` a sidecar
`step-N.json` (trainer/contract/checkpoints.py) says whether it is good: finite weights and
optimizer moments, a finite loss before it. A restart resumes from the newest good one.

Writing is split so that training waits only for the copy: `CheckpointWriter.save` copies the
state into host memory (pinned and reused on CUDA: one transfer, one sync) and a thread of its
own writes the file. The 8B drafter's 12.6 GB took 25 s to save in the training thread on the
H200, a 25 s stall every `checkpoint_every` steps and at every stop. torch.save's per-record
CRC32 is skipped (it was about half of that on a 2-core host); torch.load does not need it.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from trainer.contract.checkpoints import (
    CHECKPOINTS,
    CheckpointMeta,
    ResumeChoice,
    choose_resume,
    meta_name,
    parse_meta,
    pt_name,
    step_of,
)
from trainer.contract.typed import encode
from trainer.fsutil import atomic_write, atomic_write_json


@dataclass
class TrainPosition:
    step: int  # optimizer steps done
    batches: int  # global batches consumed (all epochs, all drafter replicas)
    tokens: int  # real tokens trained on so far


def checkpoint_path(run_dir: Path, step: int) -> Path:
    return run_dir / CHECKPOINTS / pt_name(step)


def _tensors(obj: Any) -> list[torch.Tensor]:
    if isinstance(obj, torch.Tensor):
        return [obj]
    if isinstance(obj, dict):
        return [t for v in obj.values() for t in _tensors(v)]
    if isinstance(obj, list | tuple):
        return [t for v in obj for t in _tensors(v)]
    return []


def all_finite(obj: Any) -> bool:
    """Every floating-point tensor in `obj` is finite: one reduction per device, one sync."""
    flags = [torch.isfinite(t).all() for t in _tensors(obj) if t.is_floating_point() and t.numel()]
    by_device: dict[torch.device, list[torch.Tensor]] = {}
    for f in flags:
        by_device.setdefault(f.device, []).append(f)
    return all(bool(torch.stack(fs).all()) for fs in by_device.values())


class _HostCopy:
    """Copies nested state into host tensors; on CUDA into pinned buffers kept for the next
    checkpoint (same names, same shapes), all transfers queued before one sync."""

    def __init__(self) -> None:
        self._buffers: dict[str, torch.Tensor] = {}

    def __call__(self, obj: Any, key: str = "") -> Any:
        if isinstance(obj, torch.Tensor):
            src = obj.detach()
            if src.device.type == "cpu":
                return src.clone()
            buf = self._buffers.get(key)
            if buf is None or buf.shape != src.shape or buf.dtype != src.dtype:
                buf = torch.empty(src.shape, dtype=src.dtype, pin_memory=True)
                self._buffers[key] = buf
            buf.copy_(src, non_blocking=True)
            return buf
        if isinstance(obj, dict):
            return {k: self(v, f"{key}/{k}") for k, v in obj.items()}
        if isinstance(obj, list | tuple):
            return type(obj)(self(v, f"{key}/{i}") for i, v in enumerate(obj))
        return obj


def _wait_for_copies(obj: Any) -> None:
    """The non-blocking copies to host were queued on each source device's current stream:
    wait for those streams only (the target's stream goes on)."""
    for dev in {t.device for t in _tensors(obj) if t.device.type == "cuda"}:
        done = torch.cuda.Event()
        done.record(torch.cuda.current_stream(dev))
        done.synchronize()


def _save_without_crc() -> None:
    try:
        from torch.utils.serialization import config
    except ImportError:  # an older torch: it computes the CRC32, which is only slower
        return
    config.save.compute_crc32 = False


def write_checkpoint(
    run_dir: Path,
    position: TrainPosition,
    model_state: dict[str, torch.Tensor],
    optimizer_state: dict[str, Any],
    arch: dict[str, Any],
    config: dict[str, Any],
    loss: float | None = None,
    finite: bool | None = None,
) -> CheckpointMeta:
    """Write `step-N.pt` then its sidecar, each atomically (temp file, fsync, rename): a
    crash mid-save leaves the previous checkpoint intact and this one absent."""
    t0 = time.monotonic()
    path = checkpoint_path(run_dir, position.step)
    path.parent.mkdir(parents=True, exist_ok=True)
    payload = {
        "format": 1,
        "position": position.__dict__,
        "model": model_state,
        "optimizer": optimizer_state,
        "arch": arch,
        "config": config,
    }
    if finite is None:
        finite = all_finite([model_state, optimizer_state])
    _save_without_crc()
    atomic_write(path, lambda f: torch.save(payload, f))
    meta = CheckpointMeta(
        step=position.step,
        file=path.name,
        finite=finite,
        loss=loss,
        bytes=path.stat().st_size,
        written_at=time.time(),
        seconds=round(time.monotonic() - t0, 3),
    )
    atomic_write_json(path.with_name(meta_name(position.step)), encode(meta))
    return meta


def save_checkpoint(
    run_dir: Path,
    position: TrainPosition,
    model_state: dict[str, torch.Tensor],
    optimizer_state: dict[str, Any],
    arch: dict[str, Any],
    config: dict[str, Any],
    loss: float | None = None,
) -> Path:
    """The synchronous form (tests, tools): host copies of the state, then the write."""
    state = _HostCopy()([model_state, optimizer_state])
    _wait_for_copies([model_state, optimizer_state])
    write_checkpoint(run_dir, position, state[0], state[1], arch, config, loss)
    return checkpoint_path(run_dir, position.step)


@dataclass
class Saved:
    meta: CheckpointMeta
    snapshot_s: float  # what the training thread waited for


class CheckpointWriter:
    """One checkpoint write at a time, on a thread of its own. `save` returns once the state
    is in host memory; `wait` returns when the last write is on disk (and raises its error)."""

    def __init__(self, run_dir: Path, on_saved: Callable[[Saved], None]) -> None:
        self.run_dir, self.on_saved = run_dir, on_saved
        self._copy = _HostCopy()
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None

    def save(
        self,
        position: TrainPosition,
        model_state: dict[str, torch.Tensor],
        optimizer_state: dict[str, Any],
        arch: dict[str, Any],
        config: dict[str, Any],
        loss: float | None,
    ) -> float:
        """Seconds the caller waited (the previous write, the finite check, the copy)."""
        t0 = time.monotonic()
        self.wait()  # its buffers are about to be reused
        finite = all_finite([model_state, optimizer_state])
        state = self._copy([model_state, optimizer_state])
        _wait_for_copies([model_state, optimizer_state])
        snapshot_s = time.monotonic() - t0
        pos = TrainPosition(**position.__dict__)

        def write() -> None:
            try:
                meta = write_checkpoint(
                    self.run_dir, pos, state[0], state[1], arch, config, loss, finite
                )
                self.on_saved(Saved(meta, snapshot_s))
            except BaseException as e:  # raised on the training thread by the next wait()
                self._error = e

        self._thread = threading.Thread(target=write, name="checkpoint-writer", daemon=True)
        self._thread.start()
        return snapshot_s

    def wait(self) -> None:
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if self._error is not None:
            error, self._error = self._error, None
            raise error

    @property
    def busy(self) -> bool:
        return self._thread is not None and self._thread.is_alive()


def latest_checkpoint(run_dir: Path) -> Path | None:
    folder = run_dir / CHECKPOINTS
    if not folder.is_dir():
        return None
    steps = [(s, p) for p in folder.iterdir() if (s := step_of(p.name)) is not None]
    return max(steps)[1] if steps else None


def _sidecars(run_dir: Path) -> dict[int, CheckpointMeta | Any]:
    folder = run_dir / CHECKPOINTS
    found: dict[int, Any] = {}
    if not folder.is_dir():
        return found
    for p in folder.iterdir():
        step = step_of(p.name)
        if step is None or not p.is_file():
            continue
        side = p.with_name(meta_name(step))
        found[step] = parse_meta(side.read_bytes(), side.name) if side.is_file() else None
    return found


def choose_good_checkpoint(run_dir: Path) -> ResumeChoice:
    """The newest good checkpoint (trainer/contract/checkpoints.py's rule). One without a
    sidecar is loaded and checked here: finite weights and optimizer state, or skipped."""
    candidates = _sidecars(run_dir)
    skipped: list[tuple[str, str]] = []
    while True:
        choice = choose_resume(candidates)
        skipped += choice.skipped
        if choice.name is None or choice.verified:
            return ResumeChoice(choice.name, choice.step, choice.verified, tuple(skipped))
        assert choice.step is not None
        try:
            data = load_checkpoint(run_dir / choice.name)
            ok = all_finite([data["model"], data["optimizer"]])
            why = None if ok else "weights or optimizer state not finite"
        except (OSError, ValueError, RuntimeError, KeyError) as e:
            why = f"unreadable ({str(e).splitlines()[0][:120] if str(e) else type(e).__name__})"
        if why is None:
            return ResumeChoice(choice.name, choice.step, True, tuple(skipped))
        skipped.append((choice.name, why))
        del candidates[choice.step]


def load_checkpoint(path: Path) -> dict[str, Any]:
    data: dict[str, Any] = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    if data.get("format") != 1:
        raise ValueError(f"checkpoint {path}: unknown format {data.get('format')!r}")
    return data

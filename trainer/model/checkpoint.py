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

A write that fails (disk full, any OSError; torch.save turns the file's own error into
`RuntimeError: ... unexpected pos`, which is how a full disk read on the H200) is a
`CheckpointFailed` with one line that says why ("disk full (needed 22.1 GB, free 14.1 GB)"):
its temp file is removed, the previous checkpoint stays the resume point, and the run goes on.
`forecast_bytes` says how large a checkpoint will be before the first one is written.
"""

from __future__ import annotations

import errno
import os
import pickle
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

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
    # runtime.routing = "shared": `batches` is the lowest batch index not yet trained, and
    # this many batches beyond it were trained already (out of order): a resume trains them
    # again. Always 0 under "fixed" (batches train in order).
    ahead: int = 0

    def to_dict(self) -> dict[str, int]:
        """As a checkpoint stores it: `ahead` only when there are such batches, so a fixed
        run's checkpoint is the one an older trainer (without the field) reads."""
        d = dict(self.__dict__)
        if not d["ahead"]:
            del d["ahead"]
        return d

    def retrain_note(self) -> str:
        """What a resume from here says of the batches it trains again ("" for none)."""
        if not self.ahead:
            return ""
        return (
            f"; {self.ahead} batch(es) trained out of order beyond batch {self.batches}"
            ' (runtime.routing = "shared") are trained again'
        )


def checkpoint_path(run_dir: Path, step: int) -> Path:
    return run_dir / CHECKPOINTS / pt_name(step)


# A torch.save record beyond its bytes: its zip local header and central-directory entry,
# each with the name (archive/data/N), the 64-byte alignment's padding, and its persistent id
# in the pickle. Measured on the tiny CPU run's checkpoints (tests/trainer/test_checkpoint_disk.py).
RECORD_OVERHEAD = 200
ADAMW_STATE = ("exp_avg", "exp_avg_sq")  # each the shape and dtype of its parameter
STEP_BYTES = 4  # AdamW's step counter: a float32 scalar per parameter


def forecast_bytes(trainable: Iterable[torch.Tensor], arch: dict[str, Any], config: Any) -> int:
    """A checkpoint's size before any is written: each trained tensor and AdamW's two moments
    of its shape and dtype (12 B per fp32 parameter), its step counter, the records' overhead,
    and the pickled arch and config. Within 1 % of the tiny CPU run's real file."""
    total, records = 0, 0
    for t in trainable:
        total += t.numel() * t.element_size() * (1 + len(ADAMW_STATE)) + STEP_BYTES
        records += 2 + len(ADAMW_STATE)
    return total + records * RECORD_OVERHEAD + len(pickle.dumps((arch, config)))


def size(n: float) -> str:
    """Bytes as a person reads them in a log line: 22.10 GB, 5.2 MB."""
    return f"{n / 1e9:.2f} GB" if n >= 1e9 else f"{n / 1e6:.2f} MB"


class CheckpointFailed(OSError):
    """A checkpoint was not written; `str()` is the one line that says why."""

    def __init__(self, step: int, message: str) -> None:
        super().__init__(message)
        self.step, self.message = step, message


def _free_bytes(folder: Path) -> int | None:
    """Free bytes for an unprivileged writer; None when the file system does not say (a
    FUSE mount reporting no blocks at all): then nothing is refused before the write."""
    try:
        st = os.statvfs(folder)
    except OSError:
        return None
    return st.f_bavail * st.f_frsize if st.f_blocks > 0 else None


def _why_failed(error: BaseException, needed: int, free: int | None) -> str:
    """One line: "disk full (needed X, free Y)" when the disk is what failed it, else the
    error itself, in one line."""
    have = f"needed {size(needed)}, free {size(free)}" if free is not None else ""
    code = getattr(error, "errno", None)
    if code in (errno.ENOSPC, errno.EDQUOT) or (free is not None and free < needed):
        return f"disk full ({have})" if have else "disk full"
    if isinstance(error, OSError) and error.strerror:
        name = errno.errorcode.get(code, str(code)) if code else ""
        what = f"{error.strerror} ({name})" if name else error.strerror
    else:
        lines = str(error).strip().splitlines()
        what = f"{type(error).__name__}: {lines[0][:200]}" if lines else type(error).__name__
    return f"{what} ({have})" if have else what


class _FileErrors:
    """The file torch.save writes to, keeping the first OSError a write raised: torch turns it
    into `RuntimeError: unexpected pos`, which no longer says the disk was full."""

    def __init__(self, f: IO[bytes]) -> None:
        self._f = f
        self.error: OSError | None = None

    def write(self, data: Any) -> int:
        try:
            return self._f.write(data)
        except OSError as e:
            self.error = self.error or e
            raise

    def flush(self) -> None:
        self._f.flush()


def _tensor_bytes(obj: Any) -> int:
    return sum(t.numel() * t.element_size() for t in _tensors(obj))


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
    crash mid-save leaves the previous checkpoint intact and this one absent. A write that
    fails raises `CheckpointFailed`, no part of it left behind; one that cannot fit (the
    tensors alone exceed the free disk) is refused before a byte is written."""
    t0 = time.monotonic()
    path = checkpoint_path(run_dir, position.step)
    tensors = _tensor_bytes([model_state, optimizer_state])
    needed = tensors + RECORD_OVERHEAD * len(_tensors([model_state, optimizer_state]))
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise CheckpointFailed(position.step, _why_failed(e, needed, None)) from e
    free = _free_bytes(path.parent)
    if free is not None and free < tensors:
        raise CheckpointFailed(position.step, _why_failed(OSError(), needed, free))
    payload = {
        "format": 1,
        "position": position.to_dict(),
        "model": model_state,
        "optimizer": optimizer_state,
        "arch": arch,
        "config": config,
    }
    if finite is None:
        finite = all_finite([model_state, optimizer_state])
    _save_without_crc()
    sink: list[_FileErrors] = []

    def write(f: IO[bytes]) -> None:
        sink.append(_FileErrors(f))
        torch.save(payload, sink[0])  # type: ignore[arg-type]

    try:
        atomic_write(path, write)
    except (OSError, RuntimeError) as e:  # the temp file is gone (fsutil.atomic_write)
        cause = sink[0].error if sink and sink[0].error is not None else e
        raise CheckpointFailed(
            position.step, _why_failed(cause, needed, _free_bytes(path.parent))
        ) from e
    meta = CheckpointMeta(
        step=position.step,
        file=path.name,
        finite=finite,
        loss=loss,
        bytes=path.stat().st_size,
        written_at=time.time(),
        seconds=round(time.monotonic() - t0, 3),
    )
    try:
        atomic_write_json(path.with_name(meta_name(position.step)), encode(meta))
    except OSError as e:  # a .pt without its sidecar would still be a candidate: not this one
        path.unlink(missing_ok=True)
        raise CheckpointFailed(
            position.step, _why_failed(e, needed, _free_bytes(path.parent))
        ) from e
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
    is in host memory; `wait` returns when the last write is on disk (and raises its error).
    With `on_failed`, a write that failed (`CheckpointFailed`) is handed to it instead of
    raised, and `failed` holds it until a later write succeeds: the run goes on."""

    def __init__(
        self,
        run_dir: Path,
        on_saved: Callable[[Saved], None],
        on_failed: Callable[[CheckpointFailed], None] | None = None,
    ) -> None:
        self.run_dir, self.on_saved, self.on_failed = run_dir, on_saved, on_failed
        self._copy = _HostCopy()
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        self.failed: CheckpointFailed | None = None

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
                self.failed = None
                self.on_saved(Saved(meta, snapshot_s))
            except CheckpointFailed as e:
                self.failed = e
                if self.on_failed is None:
                    self._error = e
                else:
                    self.on_failed(e)
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

"""Moving a target's features to a drafter device without stalling either one.

The copy runs on a dedicated stream of the destination device, after an event recorded on
the target's stream (so it reads finished features), and records a `ready` event that the
drafter's stream waits on before use. The host never synchronises.
"""

from __future__ import annotations

import threading
from typing import Any

import torch
from torch import Tensor

_streams: dict[int, torch.cuda.Stream] = {}
_lock = threading.Lock()


def _copy_stream(device: torch.device) -> torch.cuda.Stream:
    with _lock:
        index = device.index or 0
        if index not in _streams:
            _streams[index] = torch.cuda.Stream(device=device)
        return _streams[index]


def send(tensors: list[Tensor], dst: torch.device) -> tuple[list[Tensor], torch.cuda.Event | None]:
    """Copies of `tensors` on `dst`, and the event after which they are valid (None = now)."""
    if all(t.device == dst for t in tensors):
        return tensors, None
    if dst.type != "cuda":
        return [t.to(dst) for t in tensors], None
    src_ready = torch.cuda.Event()
    src_ready.record()  # on the producing (current) stream of the source device
    stream = _copy_stream(dst)
    with torch.cuda.stream(stream):
        stream.wait_event(src_ready)
        out = [t.to(dst, non_blocking=True) for t in tensors]
        for t in tensors:
            if t.device.type == "cuda":
                # The source memory must outlive the copy even if the producer frees it.
                t.record_stream(stream)
        done = torch.cuda.Event()
        done.record(stream)
    for t in out:
        t.record_stream(torch.cuda.current_stream(dst))
    return out, done


def tensors_in(obj: Any, depth: int = 0) -> list[Tensor]:
    """Every tensor reachable from a batch item: dataclass fields, a BlockMask's attributes,
    and the tensors its mask_mod closes over (flex reads those inside the kernel)."""
    if isinstance(obj, Tensor):
        return [obj]
    if depth > 4 or obj is None or isinstance(obj, (int, float, str)):  # bool is an int
        return []
    found: list[Tensor] = []
    if isinstance(obj, (list, tuple)):
        children: list[Any] = list(obj)
    elif callable(obj) and getattr(obj, "__closure__", None):
        children = [c.cell_contents for c in obj.__closure__ or ()]
    elif hasattr(obj, "__dict__"):
        children = list(vars(obj).values())
    else:
        children = []
    for child in children:
        found += tensors_in(child, depth + 1)
    return found


def hand_over(item: Any, producer: torch.cuda.Stream, consumer: torch.device) -> torch.cuda.Event:
    """Hand a batch item made on `producer` to the consumer device's default stream (both on
    one GPU): an event the consumer waits on, and every tensor marked as in use there, so the
    allocator never gives its memory back to the producer while the consumer still reads it."""
    done = torch.cuda.Event()
    done.record(producer)
    stream = torch.cuda.default_stream(consumer)
    seen: set[int] = set()
    for t in tensors_in(item):
        if t.device.type == "cuda" and id(t) not in seen:
            seen.add(id(t))
            t.record_stream(stream)
    return done


def wait_ready(event: torch.cuda.Event | None, device: torch.device) -> None:
    if event is not None:
        torch.cuda.current_stream(device).wait_event(event)

"""Compile progress for the heartbeat: which graph is compiling now, how many are done, and
what the same graphs took the last time.

Dynamo calls `torch._dynamo.callback`'s start and end hooks around every compile it runs: a
forward graph when a frame is first traced, and (`LAZY_BACKWARD`) its backward at the first
backward pass. The warm-up registers them, so `CompileInfo.current` names the graph under
way and `done` counts finished ones (also the compiling phase's progress).

The history (`<compile cache>/history.json`) remembers, per compile signature (the trainer's
code, torch's version, the drafter's shapes, the buckets, the devices), how many graphs the
warm-up compiled and how long it took, and whether the cache was empty then. A later run
with the same signature shows "graph 3/6, 30.6 s last time with an empty cache".
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from trainer.fsutil import atomic_write_json
from trainer.reporting.runstate import RunState

HISTORY_FILE = "history.json"
MAX_ENTRIES = 64  # signatures kept (a cache dir outlives many code versions)


def compile_signature(parts: dict[str, Any]) -> str:
    """A short stable key for the things that decide which graphs compile."""
    blob = json.dumps(parts, sort_keys=True, default=str).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


class CompileHistory:
    def __init__(self, cache_dir: str | os.PathLike[str] | None) -> None:
        self.path = Path(cache_dir) / HISTORY_FILE if cache_dir else None

    def _read(self) -> dict[str, Any]:
        if self.path is None:
            return {}
        try:
            data = json.loads(self.path.read_bytes()[: 1 << 20])
        except (OSError, ValueError, RecursionError):
            return {}  # absent or torn: no history, which only costs the estimate
        return data if isinstance(data, dict) else {}

    def last(self, signature: str) -> dict[str, Any] | None:
        entry = self._read().get(signature)
        ok = isinstance(entry, dict) and isinstance(entry.get("graphs"), int)
        return entry if ok else None

    def record(self, signature: str, graphs: int, seconds: float, cache: str) -> None:
        if self.path is None:
            return
        data = {k: v for k, v in self._read().items() if isinstance(v, dict)}
        data[signature] = {"graphs": graphs, "seconds": round(seconds, 2), "cache": cache,
                           "at": time.time()}  # fmt: skip
        newest = sorted(data.items(), key=lambda kv: -_number(kv[1].get("at")))
        with contextlib.suppress(OSError):  # a read-only cache dir: no history, no failure
            atomic_write_json(self.path, dict(newest[:MAX_ENTRIES]), durable=False)


def _number(value: Any) -> float:
    return float(value) if isinstance(value, int | float) else 0.0


def _callbacks() -> Any:
    try:
        from torch._dynamo import callback
    except ImportError:  # a torch without compile hooks: no live progress, nothing else lost
        return None
    return callback.callback_handler


def _label(args: tuple[Any, ...]) -> str:
    """What a hook's argument says of the graph: '0/1' (frame/compile) and the trigger."""
    if not args:
        return ""
    a = args[0]
    trigger = getattr(getattr(a, "callback_trigger", None), "name", "")
    kind = {"DYNAMO": "forward", "LAZY_BACKWARD": "backward"}.get(trigger, trigger.lower())
    cid = getattr(a, "compile_id", "")
    return f"{kind} of {cid}".strip() if cid else kind


@contextlib.contextmanager
def watch_compiles(state: RunState, where: Callable[[], str]) -> Iterator[None]:
    """Within the block, every compile updates `state.compile` and the phase's progress.
    `where()`: what the warm-up is doing ("bucket 4096 on cuda:0")."""
    handler = _callbacks()
    if handler is None:
        yield
        return

    def start(*args: Any) -> None:
        state.compile_started(f"graph {state.compile.done + 1}: {_label(args)}, {where()}")

    def end(*args: Any) -> None:
        state.compile_ended()

    handler.register_start_callback(start)
    handler.register_end_callback(end)
    try:
        yield
    finally:
        with contextlib.suppress(ValueError):
            handler.remove_start_callback(start)
            handler.remove_end_callback(end)

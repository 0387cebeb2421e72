"""Which earlier runs a run may be compared with: the one rule every comparison uses.

Memory a role should hold, the throughput to expect, how long a phase should take: all come
from earlier runs, and only from runs that did the same work on the same hardware. Two runs
are comparable when their signatures match: the same target, the same drafter shape, the
same batch and sequence buckets, the same device layout and kind. The config's name is not
part of it (two names can train the same thing; one name can be edited into another run).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from trainer.contract.heartbeat import DeviceId

# Config keys that change the work a step does (section -> keys).
SHAPE_KEYS = {
    "target": ("path", "dtype"),
    "drafter": (
        "num_layers",
        "block_size",
        "target_layer_ids",
        "intermediate_size",
        "num_heads",
        "num_kv_heads",
        "head_dim",
    ),
    "data": ("seq_buckets",),
    "train": ("batch_size", "num_anchors", "attention", "compile_drafter", "loss_impl"),
}


@dataclasses.dataclass(frozen=True)
class RunSignature:
    shape: str  # the SHAPE_KEYS values, canonical text
    layout: str  # "2 targets, 2 drafters"
    device_kind: str  # "NVIDIA H200", "cpu", "" when not known yet

    def describe(self) -> str:
        return f"{self.layout} on {self.device_kind or '?'}"


def _canonical(value: Any) -> str:
    if isinstance(value, list | tuple):
        return "[" + ",".join(_canonical(v) for v in value) + "]"
    return repr(value)


def signature_of(
    config: dict[str, Any], devices: dict[str, DeviceId] | None = None
) -> RunSignature:
    """The signature of a run from its config.json (a dict of sections) and, once known, the
    heartbeat's devices (their names say the kind: "NVIDIA H200", "cpu")."""
    parts: list[str] = []
    for section, keys in SHAPE_KEYS.items():
        values = config.get(section)
        values = values if isinstance(values, dict) else {}
        parts.extend(f"{section}.{k}={_canonical(values.get(k))}" for k in keys)
    runtime = config.get("runtime")
    runtime = runtime if isinstance(runtime, dict) else {}
    targets, drafters = runtime.get("targets"), runtime.get("drafters")
    n_t = len(targets) if isinstance(targets, list) else 0
    n_d = len(drafters) if isinstance(drafters, list) else 0
    kinds = sorted({d.name for d in (devices or {}).values() if d.name})
    return RunSignature(
        shape=" ".join(parts),
        layout=f"{n_t} target{'s' * (n_t != 1)}, {n_d} drafter{'s' * (n_d != 1)}",
        device_kind="+".join(kinds),
    )


def comparable(a: RunSignature | None, b: RunSignature | None) -> bool:
    """Same work on the same kind of hardware. A device kind not known yet (no heartbeat
    with devices) matches any: the config alone then decides."""
    if a is None or b is None:
        return False
    if a.shape != b.shape or a.layout != b.layout:
        return False
    return not a.device_kind or not b.device_kind or a.device_kind == b.device_kind

"""CPU cost of keeping packed documents apart in a Gated DeltaNet layer (torch fallback).

    .venv/bin/python bench/gdn_packing_cpu.py

One HF `Qwen3_5GatedDeltaNet` (hidden 1024, 8 key / 16 value heads of 64), fp32, 1 thread,
two rows of 1024 tokens: the row run whole without boundaries (the cost to match, wrong
across documents), grouped per-document batches (`DocBounds.per_document`, what the target
uses), and one call per document. Best of 3.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from trainer.targets.packing import DocBounds
from trainer.targets.tiny import tiny_qwen35_text_config

CASES = {
    "even 8 x 256": [[256] * 4, [256] * 4],
    "skewed": [[700, 100, 124, 100], [50] * 4 + [824]],
    "48 short": [[64] * 16, [32] * 32],
}


def best(fn: Callable[[], object], n: int = 3) -> float:
    fn()
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def main() -> None:
    from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5GatedDeltaNet
    from transformers.utils import logging

    logging.set_verbosity_error()
    torch.set_num_threads(1)
    cfg = tiny_qwen35_text_config(
        256,
        hidden_size=1024,
        linear_num_key_heads=8,
        linear_num_value_heads=16,
        linear_key_head_dim=64,
        linear_value_head_dim=64,
    )
    layer = Qwen3_5GatedDeltaNet(cfg, 0).eval()
    g = torch.Generator().manual_seed(0)
    for name, rows in CASES.items():
        measure(name, rows, layer, g)


def measure(name: str, rows: list[list[int]], layer: Any, g: torch.Generator) -> None:
    pos = torch.stack([torch.cat([torch.arange(n) for n in row]) for row in rows])
    x = torch.randn(*pos.shape, 1024, generator=g)
    bounds = DocBounds.from_positions(pos)

    def loop() -> torch.Tensor:
        out = torch.empty_like(x)
        for r, row in enumerate(rows):
            s = 0
            for n in row:
                out[r, s : s + n] = layer(x[r : r + 1, s : s + n])[0]
                s += n
        return out

    with torch.no_grad():
        whole = best(lambda: layer(x))
        grouped = best(lambda: bounds.per_document(layer, x))
        each = best(loop)
        diff = (bounds.per_document(layer, x) - loop()).abs().max().item()
    groups = [len(g) for g in bounds.groups()]
    print(
        f"{name:14s} docs {bounds.num_docs:2d} groups {groups}:"
        f" whole row {whole * 1e3:5.0f} ms, grouped {grouped * 1e3:5.0f} ms,"
        f" one call per document {each * 1e3:5.0f} ms (max diff {diff:.0e})"
    )


if __name__ == "__main__":
    main()

"""Write a bf16 target folder in transformers' FP8 format (128x128 block scales), the format
of Qwen's published FP8 checkpoints, so the FP8 reader can be tested and measured here:

    python3 bench/make_fp8_target.py /tmp/qwen3-8b-random /tmp/qwen3-8b-fp8

Every decoder linear's weight becomes float8_e4m3fn with a `weight_scale_inv` per block,
quantised on the GPU where there is one; the embedding, norms and lm_head are copied as
they are (trainer/targets/fp8.py).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from trainer.targets.fp8 import write_block_scaled


def main(src: Path, out: Path) -> None:
    t0 = time.time()
    n = write_block_scaled(src, out, "cuda" if torch.cuda.is_available() else "cpu")
    print(f"wrote {out}: {n} weights in FP8 (128x128 blocks) in {time.time() - t0:.1f}s")


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]))

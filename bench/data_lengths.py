"""Sample lengths of a dataset in tokens, as the trainer sees them (chat template included).

    .venv/bin/python bench/data_lengths.py [DATA] [--target TARGET]   (defaults: the builtins)

Tokenizes through the trainer's own loader (no truncation: max_len 1M), so the figures are
the lengths before any bucket cuts them.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from trainer.builtins.resolve import resolve_data_path, resolve_target_path
from trainer.data.samples import load_samples
from trainer.targets.load import load_tokenizer


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("data", nargs="?", default="builtin:synthetic-sharegpt")
    parser.add_argument("--target", default="builtin:tiny-qwen3")
    args = parser.parse_args()
    tokenizer, _ = load_tokenizer(resolve_target_path(args.target), "<|MASK|>")
    samples, report = load_samples(resolve_data_path(args.data), tokenizer, max_len=1 << 20)
    lengths = sorted(len(s.input_ids) for s in samples)
    n = len(lengths)

    def q(p: float) -> int:
        return lengths[min(n - 1, int(p * n))]

    print(f"{args.data}: {n} samples, {sum(lengths)} tokens ({report.skipped} lines skipped)")
    print(
        f"tokens/sample: mean {statistics.mean(lengths):.0f}  p10 {q(0.1)}  p50 {q(0.5)}"
        f"  p90 {q(0.9)}  p99 {q(0.99)}  max {lengths[-1]}"
    )
    for cut in (512, 1024, 2048, 4096, 8192):
        print(f"  > {cut:5d}: {sum(x > cut for x in lengths) / n:6.1%}")


if __name__ == "__main__":
    main()

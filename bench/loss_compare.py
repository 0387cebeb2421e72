"""Two runs' losses at the steps both logged (their `metrics.jsonl`): whether a change to the
trainer left the loss trajectory of a reference run with the same seed, config and data.

    python3 bench/loss_compare.py REFERENCE.jsonl OTHER.jsonl [--name OTHER]

Prints each common step's two losses and the largest absolute difference, then one
`LOSSDIFF name max_abs=… steps=…` line for a summary to grep."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def losses(path: Path) -> dict[int, float]:
    rows = (json.loads(line) for line in path.read_text().splitlines() if line.strip())
    return {int(r["step"]): float(r["loss"]) for r in rows if "loss" in r}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("reference", type=Path)
    p.add_argument("other", type=Path)
    p.add_argument("--name", default=None, help="the other run's name in the summary line")
    args = p.parse_args()
    try:
        ref, other = losses(args.reference), losses(args.other)
    except (OSError, ValueError, KeyError, TypeError) as e:
        print(f"error: cannot read the metrics: {e}", file=sys.stderr)
        return 2
    steps = sorted(set(ref) & set(other))
    for s in steps:
        diff = other[s] - ref[s]
        print(f"step {s:5d}  reference {ref[s]:.4f}  other {other[s]:.4f}  diff {diff:+.4f}")
    worst = max((abs(other[s] - ref[s]) for s in steps), default=float("nan"))
    print(f"LOSSDIFF {args.name or args.other.stem} max_abs={worst:.4f} steps={len(steps)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

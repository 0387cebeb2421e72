"""`python -m trainer export RUN_DIR [--step N] --out DIR [--dtype bfloat16|float32]`: the
run's newest good checkpoint (or step N) as a folder SpecForge and SGLang load (see
trainer/evaluation/export.py). Exit codes: 0 exported, 2 bad input (one line naming the thing at
fault)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from trainer.commands.args import OneLineParser
from trainer.config import one_line


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = OneLineParser(prog="python -m trainer export", description=__doc__.splitlines()[0])
    p.add_argument("run_dir", type=Path, help="the run dir whose drafter to export")
    p.add_argument("--out", type=Path, required=True, help="a new folder (never overwritten)")
    p.add_argument("--step", type=int, help="this checkpoint (default: the newest good one)")
    p.add_argument("--dtype", default="bfloat16", help="bfloat16 (default, for serving) or float32")
    return p.parse_args(argv)


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    from trainer.evaluation.export import ExportError, export_drafter  # imports torch

    try:
        done = export_drafter(args.run_dir, args.out, args.step, args.dtype)
    except ExportError as e:
        print(f"error: {one_line(str(e))}", file=sys.stderr)
        return 2
    print(done.describe(), flush=True)
    return 0

"""`python -m trainer regenerate --config CFG --out FILE.jsonl [--max-new-tokens 128]
[--device cpu] [--batch 64] [--limit N] [--set k=v ...]`: the config's prompts answered by
its target, as training data (trainer/evaluation/regenerate.py). Exit codes: 0 written, 2 bad
input."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from trainer.commands.args import OneLineParser, positive_int
from trainer.config import ConfigError, load_config, one_line


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = OneLineParser(prog="python -m trainer regenerate", description=__doc__.splitlines()[0])
    p.add_argument("--config", type=Path, required=True, help="TOML config: target and data")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--out", type=Path, required=True, help="a new JSONL file (never overwritten)")
    p.add_argument("--max-new-tokens", type=positive_int, default=128)
    p.add_argument("--device", default="cpu", help="e.g. cuda:0 (default cpu)")
    p.add_argument("--batch", type=positive_int, default=64, help="prompts of one length at once")
    p.add_argument("--limit", type=positive_int, help="only the first N samples")
    return p.parse_args(argv)


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    try:
        cfg = load_config(args.config, args.overrides)
    except ConfigError as e:
        print(f"error: {one_line(str(e))}", file=sys.stderr)
        return 2
    from trainer.evaluation.export import ExportError
    from trainer.evaluation.regenerate import regenerate  # imports torch

    try:
        done = regenerate(
            cfg, args.out, args.max_new_tokens, args.device, args.batch, args.limit,
            say=lambda line: print(line, flush=True),
        )  # fmt: skip
    except ExportError as e:
        print(f"error: {one_line(str(e))}", file=sys.stderr)
        return 2
    print(
        f"wrote {done['prompts']} prompts with {done['answer_tokens']} answer tokens to "
        f"{done['out']} in {done['seconds']}s (data.path = that file)",
        flush=True,
    )
    return 0

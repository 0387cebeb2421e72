"""`python -m trainer eval RUN_DIR [--step N] [--prompts 8] [--new-tokens 64] [--device cpu]
[--tree-nodes N]`: held-out acceptance length of a run's checkpoint, decoding for real
(trainer/evaluation/acceptance.py). Exit codes: 0 measured, 2 bad input (one line naming the thing
at fault)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from trainer.commands.args import OneLineParser, positive_int
from trainer.config import one_line


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = OneLineParser(prog="python -m trainer eval", description=__doc__.splitlines()[0])
    p.add_argument("run_dir", type=Path, help="the run dir whose checkpoint to evaluate")
    p.add_argument("--step", type=int, help="this checkpoint (default: the newest good one)")
    p.add_argument("--prompts", type=positive_int, default=8, help="held-out prompts (default 8)")
    p.add_argument("--new-tokens", type=positive_int, default=64, help="per prompt (default 64)")
    p.add_argument("--prompt-len", type=positive_int, default=512, help="at most (default 512)")
    p.add_argument("--device", default="cpu", help="where to decode, e.g. cuda:0 (default cpu)")
    p.add_argument(
        "--tree-nodes", type=int,
        help="DDTree's τ beside the chain's at this node budget (default: the run's "
        "eval.tree_nodes; 0 = none)",
    )  # fmt: skip
    p.add_argument(
        "--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
        help="a config override for this eval only, e.g. target.dtype=fp8 (repeatable); "
        "the record is written beside the run's own, named after the overrides",
    )  # fmt: skip
    return p.parse_args(argv)


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    from trainer.evaluation.acceptance import describe, evaluate  # imports torch
    from trainer.evaluation.export import ExportError

    try:
        result = evaluate(
            args.run_dir, args.step, args.prompts, args.new_tokens, args.prompt_len, args.device,
            args.tree_nodes, args.overrides,
        )  # fmt: skip
    except ExportError as e:
        print(f"error: {one_line(str(e))}", file=sys.stderr)
        return 2
    print(describe(result), flush=True)
    return 0

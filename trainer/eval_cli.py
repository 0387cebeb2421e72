"""`python -m trainer eval RUN_DIR [--step N] [--prompts 8] [--new-tokens 64] [--device cpu]`:
held-out acceptance length of a run's checkpoint, decoding for real (trainer/evaluate.py).
Exit codes: 0 measured, 2 bad input (one line naming the thing at fault)."""

from __future__ import annotations

import argparse
import sys
import typing
from pathlib import Path

from trainer.config import one_line


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> typing.NoReturn:
        self.exit(2, f"error: {one_line(message)} (see python -m trainer eval --help)\n")


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value}: must be 1 or more")
    return value


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = _Parser(prog="python -m trainer eval", description=__doc__.splitlines()[0])
    p.add_argument("run_dir", type=Path, help="the run dir whose checkpoint to evaluate")
    p.add_argument("--step", type=int, help="this checkpoint (default: the newest good one)")
    p.add_argument("--prompts", type=_positive, default=8, help="held-out prompts (default 8)")
    p.add_argument("--new-tokens", type=_positive, default=64, help="per prompt (default 64)")
    p.add_argument("--prompt-len", type=_positive, default=512, help="at most (default 512)")
    p.add_argument("--device", default="cpu", help="where to decode, e.g. cuda:0 (default cpu)")
    return p.parse_args(argv)


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    from trainer.evaluate import describe, evaluate  # imports torch
    from trainer.export import ExportError

    try:
        result = evaluate(
            args.run_dir, args.step, args.prompts, args.new_tokens, args.prompt_len, args.device
        )
    except ExportError as e:
        print(f"error: {one_line(str(e))}", file=sys.stderr)
        return 2
    print(describe(result), flush=True)
    return 0

"""Which way of using several cores tokenizes the bundled chat data faster.

    .venv/bin/python bench/tokenize_bench.py [builtin:synthetic-sharegpt] [--workers N]

1. `load_samples`, one process (the reference).
2. trainer/data/tokenized.py's forked workers: every step of a line (JSON, chat template,
   encode, loss mask) runs in N processes.
3. The fast tokenizer's batch encode (Rust, multithreaded) of the rendered chats, against
   encoding them one at a time as `_chat_sample` does: only the encode step is parallel, the
   JSON, template and mask stay on one core; (3) times that step alone.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from trainer.builtins.resolve import resolve_data_path
from trainer.data.samples import ROLE_ALIASES, load_samples
from trainer.data.tokenized import auto_workers, count_lines, parse_in_workers
from trainer.targets.tiny import build_tokenizer


def timed(label: str, fn: Callable[[], object]) -> object:
    t0 = time.perf_counter()
    out = fn()
    print(f"{label:58s} {time.perf_counter() - t0:6.2f} s", flush=True)
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("data", nargs="?", default="builtin:synthetic-sharegpt")
    parser.add_argument("--workers", type=int, default=0)
    args = parser.parse_args()
    path = resolve_data_path(args.data)
    tok = build_tokenizer()
    raw = path.read_bytes().split(b"\n")
    workers = auto_workers(args.workers, count_lines(raw))
    cores = len(os.sched_getaffinity(0))
    print(f"{path.name}: {count_lines(raw)} lines; {cores} cores; load {os.getloadavg()[0]:.1f}")
    timed("1. load_samples, 1 process (all steps)", lambda: load_samples(path, tok, "auto", 2048))
    timed(
        f"2. forked workers x{workers} (all steps, parsed lines back)",
        lambda: parse_in_workers(raw, tok, "auto", workers),
    )
    texts = []
    for line in raw:
        if line.strip():
            turns = json.loads(line)["conversations"]
            messages = [{"role": ROLE_ALIASES[t["from"]], "content": t["value"]} for t in turns]
            texts.append(tok.apply_chat_template(messages, tokenize=False))
    kw = {"add_special_tokens": False, "return_offsets_mapping": True}
    timed("3a. encode step only, one text at a time", lambda: [tok(t, **kw) for t in texts])
    timed("3b. encode step only, one batch (Rust threads)", lambda: tok(texts, **kw))


if __name__ == "__main__":
    main()

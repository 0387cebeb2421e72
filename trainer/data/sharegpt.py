"""`builtin:synthetic-sharegpt`: seeded multi-turn chats with a real chat-length distribution.

`builtin:synthetic-chat` has answers of 20-40 words, so every sample fits a 128-token bucket:
nothing about buckets, truncation, padding waste or tokenization time is exercised by it.
This dataset keeps that dataset's learnable content (every assistant run is a deterministic
continuation of the header before it: counting, cyclic repetition, walking the alphabet, and
only `synthetic_vocabulary()` words, so the word-level tiny tokenizer has no `<unk>`), but
draws the number of exchanges and each turn's length from lognormals fitted to published
ShareGPT statistics:

- exchanges (a user turn and its answer) per conversation: mean 3.51. ShareChat
  (Yan et al. 2025, arXiv 2512.17843, table 1, the ShareGPT row: 94,145 conversations,
  330,239 turns, 3.51 turns on average) and LMSYS-Chat-1M (Zheng et al. 2023, arXiv
  2309.11998, table 1) both give 3.51.
- tokens per user prompt: mean 94.5, std 626; per response: mean 348.5, std 269.9 (Llama
  tokenizer; LMSYS-Chat-1M table 1, ShareGPT row. Quoted from the paper, not re-measured:
  the search excerpt of ShareChat's copy of the table ended before its token columns).

A lognormal with mean m and std s has sigma^2 = ln(1 + s^2/m^2) and median m/exp(sigma^2/2):
prompts median 14 tokens, sigma 1.95 (pasted documents make the tail); responses median 275,
sigma 0.69. Exchanges are 1 + floor(X), X lognormal with a mean of 3.51 and 45 % single
exchanges (the 45 % is assumed, not sourced; the cap at 24 brings the measured mean to 3.3).
Nothing is shaped to fit a bucket.
The measured result (tiny tokenizer, chat template included; `bench/data_lengths.py`) is
in bench/README.md: a median of a few hundred tokens, a p99 in the thousands.

The file (~4.7M tokens, ~18 MB) is not committed: `ensure_dataset` writes it into the cache
on first use, atomically, named by VERSION. Bump VERSION with any change to the output.

    python -m trainer.data.sharegpt --out PATH [--n N] [--seed S]
"""

from __future__ import annotations

import argparse
import json
import math
import random
import statistics
import sys
import time
from pathlib import Path

from trainer.data.synthetic import LETTERS, MAX_NUMBER, SYSTEM_PROMPTS, WORDS
from trainer.fsutil import atomic_write

VERSION = "synthetic-sharegpt-v1"
CONVERSATIONS = 3000
SEED = 0

EXCHANGES_MEAN = 3.51
SINGLE_EXCHANGE = 0.45  # assumed, not sourced: most shared chats are one question
MAX_EXCHANGES = 24
PROMPT_MEAN, PROMPT_STD, PROMPT_MAX = 94.5, 626.0, 8192
RESPONSE_MEAN, RESPONSE_STD, RESPONSE_MAX = 348.5, 269.9, 4096
# A predictable run after each header: long enough that a drafter's block can be accepted.
RUN_MIN, RUN_MAX = 16, 96
MODULUS = MAX_NUMBER + 1  # counting wraps at 300: numbers stay in the vocabulary


def lognormal_params(mean: float, std: float) -> tuple[float, float]:
    """(mu, sigma) of the lognormal with this mean and standard deviation."""
    sigma2 = math.log(1.0 + (std / mean) ** 2)
    return math.log(mean) - sigma2 / 2, math.sqrt(sigma2)


def exchanges_params(mean: float, single: float) -> tuple[float, float]:
    """(mu, sigma) of X such that 1 + floor(X) has about this mean and P(X < 1) = single.

    floor() takes ~0.5 off on average, so E[X] = mean - 0.5; P(X < 1) = single gives
    mu = -z * sigma with z the standard normal quantile of `single`."""
    z = statistics.NormalDist().inv_cdf(single)
    log_mean = math.log(mean - 0.5)  # = mu + sigma^2 / 2 = -z sigma + sigma^2 / 2
    sigma = z + math.sqrt(z * z + 2 * log_mean)
    return -z * sigma, sigma


EXCHANGES_LOGN = exchanges_params(EXCHANGES_MEAN, SINGLE_EXCHANGE)
PROMPT_LOGN = lognormal_params(PROMPT_MEAN, PROMPT_STD)
RESPONSE_LOGN = lognormal_params(RESPONSE_MEAN, RESPONSE_STD)


def _run(rng: random.Random, n: int) -> list[str]:
    """A header, then `n` words that the header determines."""
    kind = rng.randrange(5)
    if kind == 0:
        start, step = rng.randrange(MODULUS), rng.randint(1, 9)
        head = ["count", "from", str(start), "by", str(step), ":"]
        return head + [str((start + step * i) % MODULUS) for i in range(n)]
    if kind == 1:
        start, step = rng.randrange(MODULUS), rng.randint(1, 9)
        head = ["count", "down", "from", str(start), "by", str(step), ":"]
        return head + [str((start - step * i) % MODULUS) for i in range(n)]
    if kind == 2:
        cycle = rng.sample(WORDS, rng.randint(2, 5))
        return ["repeat", ":", *cycle, ":"] + [cycle[i % len(cycle)] for i in range(n)]
    start = rng.randrange(26)
    sign = 1 if kind == 3 else -1
    head = ["letters", "from"] if sign > 0 else ["letters", "back", "from"]
    return [*head, LETTERS[start], ":"] + [LETTERS[(start + sign * i) % 26] for i in range(n)]


def _text(rng: random.Random, words: int) -> str:
    """About `words` words of runs separated by '.', cut to exactly `words` (>= 1)."""
    out: list[str] = []
    while len(out) < words:
        if out:
            out.append(".")
        out.extend(_run(rng, rng.randint(RUN_MIN, RUN_MAX)))
    return " ".join(out[:words])


def _length(rng: random.Random, mu_sigma: tuple[float, float], cap: int) -> int:
    mu, sigma = mu_sigma
    return max(1, min(cap, round(rng.lognormvariate(mu, sigma))))


def _exchanges(rng: random.Random) -> int:
    # 1 + floor(X), X lognormal: mean ~EXCHANGES_MEAN, P(X < 1) = SINGLE_EXCHANGE.
    mu, sigma = EXCHANGES_LOGN
    return min(MAX_EXCHANGES, 1 + math.floor(rng.lognormvariate(mu, sigma)))


def generate_conversation(rng: random.Random) -> list[dict[str, str]]:
    """ShareGPT turns: {"from": "system" | "human" | "gpt", "value": text}."""
    turns: list[dict[str, str]] = []
    if rng.random() < 0.4:
        turns.append({"from": "system", "value": rng.choice(SYSTEM_PROMPTS)})
    for _ in range(_exchanges(rng)):
        prompt = _text(rng, _length(rng, PROMPT_LOGN, PROMPT_MAX))
        answer = _text(rng, _length(rng, RESPONSE_LOGN, RESPONSE_MAX))
        turns.append({"from": "human", "value": prompt})
        turns.append({"from": "gpt", "value": answer})
    return turns


def generate_lines(n: int = CONVERSATIONS, seed: int = SEED) -> list[str]:
    rng = random.Random(f"synthetic-sharegpt:{seed}")  # a private Random: seed alone decides
    return [
        json.dumps({"conversations": generate_conversation(rng)}, ensure_ascii=False)
        for _ in range(n)
    ]


def write_dataset(out: Path, n: int = CONVERSATIONS, seed: int = SEED) -> Path:
    data = "".join(line + "\n" for line in generate_lines(n, seed)).encode()
    out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(out, lambda f: f.write(data))
    return out


def ensure_dataset(cache_root: Path) -> Path:
    """The dataset's file under `cache_root`, generated on first use (seconds, once)."""
    out = cache_root / "datasets" / f"{VERSION}.jsonl"
    if not out.is_file():
        t0 = time.monotonic()
        print(f"data: generating builtin:synthetic-sharegpt into {out} (once)", file=sys.stderr)
        write_dataset(out)
        print(f"data: generated in {time.monotonic() - t0:.1f}s", file=sys.stderr)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m trainer.data.sharegpt",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--out", type=Path, required=True, help="JSONL file to write")
    parser.add_argument("--n", type=int, default=CONVERSATIONS, help="number of conversations")
    parser.add_argument("--seed", type=int, default=SEED)
    args = parser.parse_args(argv)
    if args.n < 1:
        parser.error("--n must be at least 1")
    write_dataset(args.out, args.n, args.seed)
    print(f"wrote {args.n} conversations to {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())

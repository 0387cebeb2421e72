"""A seeded generator of a small chat dataset whose answers a tiny drafter can learn.

Every assistant answer is a deterministic continuation of its first few tokens (counting,
cyclic repetition, walking the alphabet), so after seeing a handful of answer tokens a
2-layer drafter can predict the next ~15 exactly; a loss that does not fall on this data
points at a bug, not at model capacity. Text is word-level, words separated by one space,
and only ever uses `synthetic_vocabulary()` so the builtin tiny tokenizer has no `<unk>`.

    python -m trainer.data.synthetic --out PATH --n N --seed S [--format chat|text]

The shipped files are regenerated with (see SHIPPED):

    python -m trainer.data.synthetic --out trainer/datasets/synthetic-chat.jsonl --n 1500 --seed 0
    python -m trainer.data.synthetic --out trainer/datasets/synthetic-text.jsonl --n 200 --seed 1 \
        --format text
"""

from __future__ import annotations

import argparse
import json
import random
import string
import sys
from collections.abc import Callable
from pathlib import Path

# trainer/datasets/<name> → (format, n, seed) it was generated with; a test checks they match.
SHIPPED = {
    "synthetic-chat.jsonl": ("chat", 1500, 0),
    "synthetic-text.jsonl": ("text", 200, 1),
}
MAX_NUMBER = 299
LETTERS = list(string.ascii_lowercase)
WORDS = [
    "apple", "river", "stone", "cloud", "tiger", "lamp", "music", "green", "paper", "moon",
    "bread", "train", "glass", "forest", "honey", "window", "salt", "violet", "candle", "ocean",
    "pepper", "rocket", "silver", "garden", "winter", "orange", "bridge", "copper", "feather",
    "island", "marble", "thunder",
]  # fmt: skip
SYSTEM_PROMPTS = [
    "you are a helpful assistant .",
    "answer with the sequence only .",
    "you are a precise assistant . follow the pattern .",
]
# Role names: the chat template writes them as words (`<|im_start|>user`).
ROLES = ["system", "user", "assistant"]
# Prompt words that are not numbers, letters or WORDS.
TASK_WORDS = [
    "count", "from", "by", "down", "repeat", ":", "letters", "back", "and", "now", "again",
    "please", "continue", "more", "you", "are", "a", "helpful", "precise", "assistant", ".",
    "answer", "with", "the", "sequence", "only", "follow", "pattern",
]  # fmt: skip

Message = dict[str, str]
Task = Callable[[random.Random], tuple[str, str]]


def synthetic_vocabulary() -> list[str]:
    """Every word the generator (and the chat template's role names) can emit, sorted.

    This is the builtin tokenizer's vocabulary: changing it changes token ids, so bump the
    cached target's version in `trainer.targets.tiny.BUILTIN_TARGETS` with it.
    """
    words = {str(n) for n in range(MAX_NUMBER + 1)}
    words.update(LETTERS, WORDS, TASK_WORDS, ROLES)
    for prompt in SYSTEM_PROMPTS:
        words.update(prompt.split())
    return sorted(words)


def _count_up(rng: random.Random) -> tuple[str, str]:
    step = rng.randint(1, 9)
    n = rng.randint(20, min(40, 1 + MAX_NUMBER // step))  # stay within 0..MAX_NUMBER
    start = rng.randint(0, MAX_NUMBER - step * (n - 1))
    numbers = [start + step * i for i in range(n)]
    return f"count from {start} by {step}", " ".join(map(str, numbers))


def _count_down(rng: random.Random) -> tuple[str, str]:
    step = rng.randint(1, 9)
    n = rng.randint(20, min(40, 1 + MAX_NUMBER // step))  # stay within 0..MAX_NUMBER
    start = rng.randint(step * (n - 1), MAX_NUMBER)
    numbers = [start - step * i for i in range(n)]
    return f"count down from {start} by {step}", " ".join(map(str, numbers))


def _repeat(rng: random.Random) -> tuple[str, str]:
    words = rng.sample(WORDS, rng.randint(2, 5))
    n = rng.randint(30, 40)
    return f"repeat : {' '.join(words)}", " ".join(words[i % len(words)] for i in range(n))


def _letters(rng: random.Random) -> tuple[str, str]:
    start = rng.randrange(26)
    n = rng.randint(26, 34)
    return f"letters from {LETTERS[start]}", " ".join(LETTERS[(start + i) % 26] for i in range(n))


def _letters_back(rng: random.Random) -> tuple[str, str]:
    start = rng.randrange(26)
    n = rng.randint(26, 34)
    answer = " ".join(LETTERS[(start - i) % 26] for i in range(n))
    return f"letters back from {LETTERS[start]}", answer


TASKS: list[Task] = [_count_up, _count_down, _repeat, _letters, _letters_back]
# Second-turn openers; the task itself is always spelled out so the answer stays determined.
FOLLOW_UPS = ["now", "and now", "again", "please", "continue with more ."]


def generate_conversation(rng: random.Random) -> list[Message]:
    messages: list[Message] = []
    if rng.random() < 0.4:
        messages.append({"role": "system", "content": rng.choice(SYSTEM_PROMPTS)})
    turns = 2 if rng.random() < 0.3 else 1
    for turn in range(turns):
        prompt, answer = rng.choice(TASKS)(rng)
        if turn > 0:
            prompt = f"{rng.choice(FOLLOW_UPS)} {prompt}"
        messages.append({"role": "user", "content": prompt})
        messages.append({"role": "assistant", "content": answer})
    return messages


def generate_conversations(n: int, seed: int) -> list[list[Message]]:
    # A private Random: the output depends on `seed` alone, never on global state.
    rng = random.Random(seed)
    return [generate_conversation(rng) for _ in range(n)]


def conversation_text(messages: list[Message]) -> str:
    """The plain-text form: user and assistant contents, one per line."""
    return "\n".join(m["content"] for m in messages if m["role"] != "system")


def write_jsonl(out: Path, n: int, seed: int, fmt: str = "chat") -> None:
    lines = []
    for messages in generate_conversations(n, seed):
        record = (
            {"conversations": messages} if fmt == "chat" else {"text": conversation_text(messages)}
        )
        lines.append(json.dumps(record, ensure_ascii=False))
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("".join(line + "\n" for line in lines), encoding="utf-8")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m trainer.data.synthetic",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--out", type=Path, required=True, help="JSONL file to write")
    parser.add_argument("--n", type=int, default=1500, help="number of conversations")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--format", choices=("chat", "text"), default="chat")
    args = parser.parse_args(argv)
    if args.n < 1:
        parser.error("--n must be at least 1")
    write_jsonl(args.out, args.n, args.seed, args.format)
    print(f"wrote {args.n} {args.format} lines to {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""builtin:synthetic-sharegpt: deterministic, closed vocabulary, learnable answers, and the
length distribution of real chats (measured with the tiny tokenizer and its chat template)."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

from transformers import PreTrainedTokenizerFast

from trainer.builtins.resolve import resolve_data_path
from trainer.data.sharegpt import VERSION, generate_conversation, generate_lines
from trainer.data.synthetic import LETTERS, MAX_NUMBER

ROLES = {"system": "system", "human": "user", "gpt": "assistant"}


def continuation_ok(run: list[str]) -> bool:
    """A run is `header : w0 w1 ...`; the words after the header follow from it."""
    colon = run.index(":")
    head, words = run[:colon], run[colon + 1 :]
    if head == ["repeat"]:
        second = words.index(":")
        cycle, words = words[:second], words[second + 1 :]
        return all(w == cycle[i % len(cycle)] for i, w in enumerate(words))
    if head[0] == "count":
        down = head[1] == "down"
        start, step = int(head[-3]), int(head[-1])
        sign = -1 if down else 1
        return all(
            int(w) == (start + sign * step * i) % (MAX_NUMBER + 1) for i, w in enumerate(words)
        )
    start = LETTERS.index(head[-1])
    sign = -1 if head[1] == "back" else 1
    return all(w == LETTERS[(start + sign * i) % 26] for i, w in enumerate(words))


def test_the_generator_is_deterministic_and_multi_turn() -> None:
    assert generate_lines(40, seed=3) == generate_lines(40, seed=3)
    assert generate_lines(40, seed=3) != generate_lines(40, seed=4)
    conversations = [json.loads(line)["conversations"] for line in generate_lines(400, seed=1)]
    exchanges = [sum(t["from"] == "gpt" for t in c) for c in conversations]
    assert 2.5 < statistics.mean(exchanges) < 4.5  # ShareGPT: 3.51
    assert 0.3 < exchanges.count(1) / len(exchanges) < 0.6 and max(exchanges) >= 10
    for c in conversations:
        roles = [t["from"] for t in c if t["from"] != "system"]
        assert roles == ["human", "gpt"] * (len(roles) // 2)


def test_every_answer_run_follows_its_header() -> None:
    import random

    rng = random.Random(9)
    for _ in range(60):
        for turn in generate_conversation(rng):
            if turn["from"] != "gpt":
                continue
            runs = turn["value"].split(" . ")
            # The last run may be cut short (even inside its header); the others are whole.
            for run in runs[:-1]:
                assert continuation_ok(run.split()), run


def test_lengths_follow_real_chats(tiny_tokenizer: PreTrainedTokenizerFast) -> None:
    """Sample lengths in tokens (tiny tokenizer, chat template): median in the hundreds,
    p99 in the thousands, a meaningful fraction over 2048. 800 of the 3000 conversations."""
    texts = []
    for line in generate_lines(800):
        messages = [
            {"role": ROLES[t["from"]], "content": t["value"]}
            for t in json.loads(line)["conversations"]
        ]
        texts.append(tiny_tokenizer.apply_chat_template(messages, tokenize=False))
    ids = tiny_tokenizer(texts, add_special_tokens=False)["input_ids"]
    lengths = sorted(len(x) for x in ids)
    assert all(tiny_tokenizer.unk_token_id not in x for x in ids)

    def q(p: float) -> int:
        return lengths[min(len(lengths) - 1, int(p * len(lengths)))]

    assert 300 <= q(0.5) < 1000, q(0.5)
    assert q(0.99) >= 2000, q(0.99)
    assert 0.1 < sum(n > 2048 for n in lengths) / len(lengths) < 0.35
    assert q(0.1) < 300
    assert 1000 < statistics.mean(lengths) < 2000  # ShareGPT: ~3.5 x (94 + 348) = ~1550


def test_the_builtin_is_generated_into_the_cache_once(dflash_cache_dir: Path) -> None:
    path = resolve_data_path("builtin:synthetic-sharegpt")
    assert path == dflash_cache_dir / "datasets" / f"{VERSION}.jsonl"
    mtime = path.stat().st_mtime_ns
    assert resolve_data_path("builtin:synthetic-sharegpt").stat().st_mtime_ns == mtime
    lines = path.read_text().splitlines()
    assert len(lines) == 3000 and lines[:50] == generate_lines(50)  # one seeded stream

"""The synthetic dataset: deterministic, closed vocabulary, answers that follow their prompt."""

from __future__ import annotations

import json
import string
from collections import Counter
from pathlib import Path

import pytest

from trainer.data.synthetic import (
    SHIPPED,
    conversation_text,
    generate_conversations,
    main,
    synthetic_vocabulary,
)

DATASETS = Path(__file__).resolve().parents[2] / "trainer" / "datasets"
LETTERS = string.ascii_lowercase


def expected_answer(prompt: str, n: int) -> tuple[str, list[str]]:
    """(family, the first n words the prompt asks for), parsed independently of the generator."""
    words = prompt.split()
    # Second turns start with a follow-up such as "and now"; the task follows.
    first = next(i for i, w in enumerate(words) if w in ("count", "repeat", "letters"))
    task = words[first:]
    if task[:2] == ["count", "from"] and task[3] == "by":
        start, step = int(task[2]), int(task[4])
        return "count", [str(start + step * k) for k in range(n)]
    if task[:3] == ["count", "down", "from"] and task[4] == "by":
        start, step = int(task[3]), int(task[5])
        return "count down", [str(start - step * k) for k in range(n)]
    if task[:2] == ["repeat", ":"]:
        cycle = task[2:]
        assert 2 <= len(cycle) <= 5, prompt
        return "repeat", [cycle[k % len(cycle)] for k in range(n)]
    if task[:2] == ["letters", "from"]:
        start = LETTERS.index(task[2])
        return "letters", [LETTERS[(start + k) % 26] for k in range(n)]
    if task[:3] == ["letters", "back", "from"]:
        start = LETTERS.index(task[3])
        return "letters back", [LETTERS[(start - k) % 26] for k in range(n)]
    raise AssertionError(f"unknown task: {prompt!r}")


def test_generator_is_deterministic_for_a_seed() -> None:
    assert generate_conversations(50, seed=7) == generate_conversations(50, seed=7)
    assert generate_conversations(50, seed=7) != generate_conversations(50, seed=8)


def test_answers_follow_their_prompts() -> None:
    families: Counter[str] = Counter()
    turns: Counter[int] = Counter()
    with_system = 0
    for messages in generate_conversations(600, seed=3):
        roles = [m["role"] for m in messages]
        with_system += roles[0] == "system"
        body = messages[1:] if roles[0] == "system" else messages
        assert [m["role"] for m in body] == ["user", "assistant"] * (len(body) // 2)
        turns[len(body) // 2] += 1
        for user, assistant in zip(body[::2], body[1::2], strict=True):
            answer = assistant["content"].split()
            family, expected = expected_answer(user["content"], len(answer))
            families[family] += 1
            assert answer == expected, user["content"]
            assert assistant["content"] == " ".join(answer)  # single spaces only
            if family.startswith("count"):
                assert 20 <= len(answer) <= 40
                assert all(0 <= int(w) <= 299 for w in answer)
            else:
                assert 26 <= len(answer) <= 40
    assert set(families) == {"count", "count down", "repeat", "letters", "letters back"}
    assert min(families.values()) > 50
    assert set(turns) == {1, 2} and turns[2] > 100
    assert 150 < with_system < 350


def test_vocabulary_covers_every_generated_word() -> None:
    vocab = synthetic_vocabulary()
    assert vocab == sorted(set(vocab))
    assert vocab == synthetic_vocabulary()
    assert {"0", "150", "299", "a", "z", ":", "apple", "user", "assistant"} <= set(vocab)
    assert "300" not in vocab
    used = set()
    for messages in generate_conversations(2000, seed=11):
        for m in messages:
            used.update(m["content"].split())
            used.add(m["role"])
    assert used <= set(vocab), sorted(used - set(vocab))


def test_text_form_keeps_user_and_assistant_lines() -> None:
    messages = [
        {"role": "system", "content": "you are a helpful assistant ."},
        {"role": "user", "content": "letters from y"},
        {"role": "assistant", "content": "y z a"},
    ]
    assert conversation_text(messages) == "letters from y\ny z a"


def test_cli_writes_the_generated_lines(tmp_path: Path) -> None:
    out = tmp_path / "sub" / "chat.jsonl"
    assert main(["--out", str(out), "--n", "5", "--seed", "4"]) == 0
    lines = out.read_text().splitlines()
    assert [json.loads(line)["conversations"] for line in lines] == generate_conversations(5, 4)
    text_out = tmp_path / "text.jsonl"
    main(["--out", str(text_out), "--n", "3", "--seed", "4", "--format", "text"])
    texts = [json.loads(line)["text"] for line in text_out.read_text().splitlines()]
    assert texts == [conversation_text(m) for m in generate_conversations(3, 4)]


@pytest.mark.parametrize("name", sorted(SHIPPED))
def test_shipped_files_are_reproducible(name: str, tmp_path: Path) -> None:
    fmt, n, seed = SHIPPED[name]
    out = tmp_path / name
    main(["--out", str(out), "--n", str(n), "--seed", str(seed), "--format", fmt])
    shipped = DATASETS / name
    assert shipped.read_bytes() == out.read_bytes()
    assert shipped.stat().st_size < 1_000_000

"""Loading (formats, loss mask, bad lines) and batching (buckets, static shapes, determinism)."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import PreTrainedTokenizerFast

from trainer.builtins.resolve import resolve_data_path
from trainer.data.samples import (
    DataError,
    LoadReport,
    Sample,
    batches_per_epoch,
    collate,
    epoch_batches,
    load_samples,
    pick_bucket,
)

CONVERSATION = [
    {"role": "system", "content": "you are a helpful assistant ."},
    # The user turn contains the first answer verbatim: the mask must not land on it.
    {"role": "user", "content": "repeat : apple river apple river please"},
    {"role": "assistant", "content": "apple river apple river"},
    {"role": "user", "content": "and now count from 3 by 2"},
    {"role": "assistant", "content": "3 5 7 9 11"},
]
FROM_VALUE = {"system": "system", "user": "human", "assistant": "gpt"}


def write_jsonl(path: Path, records: list[Any]) -> Path:
    lines = [r if isinstance(r, str) else json.dumps(r) for r in records]
    path.write_text("".join(line + "\n" for line in lines))
    return path


def masked_runs(sample: Sample, tok: PreTrainedTokenizerFast) -> list[str]:
    """The decoded text of each contiguous run of loss-masked tokens."""
    runs: list[list[int]] = []
    previous = 0
    for token, m in zip(sample.input_ids, sample.loss_mask, strict=True):
        if m and not previous:
            runs.append([])
        if m:
            runs[-1].append(token)
        previous = m
    texts = [tok.decode(run) for run in runs]
    assert all(isinstance(t, str) for t in texts)
    return [str(t) for t in texts]


def load(
    path: Path, tok: PreTrainedTokenizerFast, **kwargs: Any
) -> tuple[list[Sample], LoadReport, list[str]]:
    warnings: list[str] = []
    samples, report = load_samples(path, tok, warn=warnings.append, **kwargs)
    return samples, report, warnings


def test_loss_mask_covers_assistant_content_and_end_of_turn(
    tmp_path: Path, tiny_tokenizer: PreTrainedTokenizerFast
) -> None:
    path = write_jsonl(tmp_path / "chat.jsonl", [{"conversations": CONVERSATION}])
    (sample,), report, warnings = load(path, tiny_tokenizer)
    assert warnings == [] and (report.lines, report.samples, report.skipped) == (1, 1, 0)
    encoded: Any = tiny_tokenizer.apply_chat_template(CONVERSATION)
    assert sample.input_ids == encoded["input_ids"]
    assert len(sample.loss_mask) == len(sample.input_ids)
    assert set(sample.loss_mask) == {0, 1}
    tokens = tiny_tokenizer.convert_ids_to_tokens(sample.input_ids)
    starts = [i for i, m in enumerate(sample.loss_mask) if m and not sample.loss_mask[i - 1]]
    assert [tokens[i - 1] for i in starts] == ["assistant", "assistant"]
    assert masked_runs(sample, tiny_tokenizer) == [
        "apple river apple river <|im_end|>",
        "3 5 7 9 11 <|im_end|>",
    ]


def test_from_value_form_matches_role_content(
    tmp_path: Path, tiny_tokenizer: PreTrainedTokenizerFast
) -> None:
    sharegpt = [{"from": FROM_VALUE[m["role"]], "value": m["content"]} for m in CONVERSATION]
    path = write_jsonl(
        tmp_path / "chat.jsonl", [{"conversations": CONVERSATION}, {"conversations": sharegpt}]
    )
    (a, b), _, warnings = load(path, tiny_tokenizer, fmt="sharegpt")
    assert warnings == []
    assert a == b


def test_text_format_masks_everything(
    tmp_path: Path, tiny_tokenizer: PreTrainedTokenizerFast
) -> None:
    text = "letters from x\nx y z a b"
    path = write_jsonl(tmp_path / "text.jsonl", [{"text": text}])
    (sample,), _, _ = load(path, tiny_tokenizer, fmt="text")
    assert tiny_tokenizer.decode(sample.input_ids) == "letters from x x y z a b"
    assert sample.loss_mask == [1] * 8


def test_auto_decides_per_line_and_explicit_formats_refuse_the_other(
    tmp_path: Path, tiny_tokenizer: PreTrainedTokenizerFast
) -> None:
    path = write_jsonl(
        tmp_path / "mixed.jsonl", [{"text": "a b c"}, {"conversations": CONVERSATION}]
    )
    samples, _, _ = load(path, tiny_tokenizer)
    assert [sum(s.loss_mask) for s in samples] == [3, 11]
    _, report, warnings = load(path, tiny_tokenizer, fmt="text")
    assert report.samples == 1 and warnings == [
        f"data: {path}:2: skipped (no 'text' key (data.format = text))",
        f"data: {path}: skipped 1 of 2 lines (no 'text' key (data.format = text): 1)",
    ]
    _, report, warnings = load(path, tiny_tokenizer, fmt="sharegpt")
    assert report.samples == 1 and warnings[0] == (
        f"data: {path}:1: skipped (no 'conversations' key (data.format = sharegpt))"
    )


def test_malformed_lines_are_skipped_with_their_line_numbers(
    tmp_path: Path, tiny_tokenizer: PreTrainedTokenizerFast
) -> None:
    good = {"conversations": CONVERSATION[1:3]}
    user_only = [{"role": "user", "content": "count from 1 by 1"}]
    bad: list[tuple[Any, str]] = [
        ('{"conversations": [', "invalid JSON"),
        ("[1, 2]", "not a JSON object"),
        ({"prompt": "a"}, "no 'conversations', 'text' or 'input_ids' key"),
        ({"conversations": "a b"}, "'conversations' is not a non-empty list"),
        ({"conversations": []}, "'conversations' is not a non-empty list"),
        ({"conversations": ["a b"]}, "a turn is not an object"),
        ({"conversations": [{"role": "robot", "content": "a"}]}, "unknown role 'robot'"),
        ({"conversations": [{"from": "gpt"}]}, "empty content"),
        ({"conversations": [{"role": "assistant", "content": "  "}]}, "empty content"),
        ({"conversations": user_only}, "no assistant turn"),
        ({"text": ""}, "empty text"),
        ({"text": 7}, "empty text"),
        ({"text": "z"}, "fewer than 2 tokens"),
    ]
    records: list[Any] = [good]
    for record, _ in bad:
        records += [record, good]
    path = write_jsonl(tmp_path / "messy.jsonl", records)
    # Blank lines are neither samples nor skipped; invalid UTF-8 is a skipped line.
    with path.open("ab") as f:
        f.write(b"\n   \n" + b'{"text": "caf\xe9"}\n')
    samples, report, warnings = load(path, tiny_tokenizer)

    expected = [
        f"data: {path}:{2 * i + 2}: skipped ({reason})" for i, (_, reason) in enumerate(bad)
    ]
    expected.append(f"data: {path}:{2 * len(bad) + 4}: skipped (invalid UTF-8)")
    expected.append(
        f"data: {path}: skipped 14 of {2 * len(bad) + 2} lines ('conversations' is not a "
        "non-empty list: 2, empty content: 2, empty text: 2, 8 other reasons)"
    )
    assert warnings == expected
    assert len(samples) == len(bad) + 1
    assert all(s == samples[0] for s in samples)
    assert (report.lines, report.samples, report.skipped) == (2 * len(bad) + 2, len(bad) + 1, 14)
    assert report.skip_reasons["empty content"] == 2
    assert report.skip_reasons["invalid JSON"] == report.skip_reasons["invalid UTF-8"] == 1
    assert sum(report.skip_reasons.values()) == report.skipped


def test_warnings_are_capped(tmp_path: Path, tiny_tokenizer: PreTrainedTokenizerFast) -> None:
    path = write_jsonl(tmp_path / "bad.jsonl", ["nope"] * 25 + [json.dumps({"text": "a b"})])
    samples, report, warnings = load(path, tiny_tokenizer)
    assert len(samples) == 1 and report.skipped == 25
    assert len(warnings) == 22
    assert warnings[19] == f"data: {path}:20: skipped (invalid JSON)"
    assert warnings[20].startswith(f"data: {path}: 5 more lines skipped")
    assert warnings[21] == f"data: {path}: skipped 25 of 26 lines (invalid JSON: 25)"


def test_all_bad_file_raises_naming_the_path(
    tmp_path: Path, tiny_tokenizer: PreTrainedTokenizerFast
) -> None:
    path = write_jsonl(tmp_path / "bad.jsonl", ["nope", "{}", "nope"])
    with pytest.raises(DataError) as err:
        load(path, tiny_tokenizer)
    message = str(err.value)
    assert "\n" not in message
    assert message.startswith("data.path:") and str(path) in message
    assert "3 lines, 3 skipped" in message and "most often: invalid JSON" in message

    empty = write_jsonl(tmp_path / "empty.jsonl", [])
    with pytest.raises(DataError, match="0 lines"):
        load(empty, tiny_tokenizer)


def test_truncation(tmp_path: Path, tiny_tokenizer: PreTrainedTokenizerFast) -> None:
    late_answer = [
        {"role": "user", "content": " ".join(["apple"] * 30)},
        {"role": "assistant", "content": "a b c"},
    ]
    path = write_jsonl(
        tmp_path / "long.jsonl",
        [{"conversations": CONVERSATION}, {"text": "a b c"}, {"conversations": late_answer}],
    )
    samples, report, warnings = load(path, tiny_tokenizer, max_len=26)
    assert [len(s.input_ids) for s in samples] == [26, 3]
    assert len(samples[0].loss_mask) == 26
    # The cut lands right after the first answer's end-of-turn token.
    assert masked_runs(samples[0], tiny_tokenizer) == ["apple river apple river <|im_end|>"]
    assert (report.samples, report.truncated, report.skipped) == (2, 1, 1)
    assert warnings[0] == f"data: {path}:3: skipped (no loss token within the first 26 tokens)"
    assert len(warnings) == 2  # and the summary


def test_resolve_data_path(tmp_path: Path) -> None:
    for name in ("synthetic-chat", "synthetic-text"):
        path = resolve_data_path(f"builtin:{name}")
        assert path.name == f"{name}.jsonl" and path.is_file()
    with pytest.raises(DataError, match=r"^data\.path: .*missing\.jsonl"):
        resolve_data_path(str(tmp_path / "missing.jsonl"))
    with pytest.raises(DataError, match="builtin:synthetic-chat"):
        resolve_data_path("builtin:nope")
    real = write_jsonl(tmp_path / "x.jsonl", [{"text": "a b"}])
    assert resolve_data_path(str(real)) == real


@pytest.mark.parametrize(
    ("name", "count"), [("builtin:synthetic-chat", 1500), ("builtin:synthetic-text", 200)]
)
def test_shipped_datasets_load_cleanly(
    name: str, count: int, tiny_tokenizer: PreTrainedTokenizerFast
) -> None:
    samples, report, warnings = load(resolve_data_path(name), tiny_tokenizer)
    assert warnings == [] and report.skipped == 0 and report.truncated == 0
    assert report.samples == report.lines == count
    assert all(tiny_tokenizer.unk_token_id not in s.input_ids for s in samples)
    assert all(sum(s.loss_mask) >= 20 for s in samples)
    assert max(len(s.input_ids) for s in samples) <= 128


def test_pick_bucket() -> None:
    assert pick_bucket(1, [16, 64, 32]) == 16
    assert pick_bucket(16, [16, 32, 64]) == 16
    assert pick_bucket(17, [16, 32, 64]) == 32
    assert pick_bucket(65, [16, 32, 64]) == 64


def fake_samples(lengths: list[int]) -> list[Sample]:
    return [Sample(list(range(1, n + 1)), [0] + [1] * (n - 1)) for n in lengths]


def test_epoch_batches_are_bucketed_and_static() -> None:
    lengths = [5] * 7 + [20] * 8 + [30] * 2  # 7 in bucket 16, 10 in 32, none in 64
    samples = fake_samples(lengths)
    buckets = [16, 32, 64]
    batches = epoch_batches(samples, buckets, batch_size=4, seed=1, epoch=0)
    assert len(batches) == batches_per_epoch(samples, buckets, 4) == 2 + 3
    assert all(len(b) == 4 for b in batches)
    per_bucket = Counter(pick_bucket(lengths[b[0]], buckets) for b in batches)
    assert per_bucket == {16: 2, 32: 3}
    for b in batches:
        assert len({pick_bucket(lengths[i], buckets) for i in b}) == 1
    # Every sample is seen; top-ups only repeat samples of the same bucket.
    seen = Counter(i for b in batches for i in b)
    assert set(seen) == set(range(len(samples)))
    assert sum(seen.values()) - len(samples) == 1 + 2


def test_small_bucket_wraps_around() -> None:
    batches = epoch_batches(fake_samples([3, 4]), [8], batch_size=5, seed=0, epoch=0)
    assert len(batches) == 1 and sorted(Counter(batches[0]).values()) == [2, 3]


def test_epoch_batches_determinism() -> None:
    samples = fake_samples([(i * 7) % 60 + 2 for i in range(200)])
    buckets = [16, 32, 64]

    def order(seed: int, epoch: int) -> list[list[int]]:
        return epoch_batches(samples, buckets, batch_size=8, seed=seed, epoch=epoch)

    assert order(3, 0) == order(3, 0)
    assert order(3, 0) != order(3, 1)
    assert order(3, 0) != order(4, 0)
    assert sorted(map(sorted, order(3, 0))) != sorted(map(sorted, order(3, 1)))
    ordered = epoch_batches(samples, buckets, batch_size=8, seed=3, epoch=0, shuffle=False)
    assert ordered == epoch_batches(samples, buckets, batch_size=8, seed=9, epoch=5, shuffle=False)
    assert ordered[0] == [i for i, s in enumerate(samples) if len(s.input_ids) <= 16][:8]


def test_collate_pads_right() -> None:
    samples = fake_samples([3, 5, 2])
    batch = collate(samples, [1, 0, 2], bucket_len=6, pad_id=9, index=4)
    assert batch.index == 4
    assert batch.input_ids.dtype == torch.int64 and batch.loss_mask.dtype == torch.float32
    assert batch.input_ids.tolist() == [[1, 2, 3, 4, 5, 9], [1, 2, 3, 9, 9, 9], [1, 2, 9, 9, 9, 9]]
    assert batch.loss_mask.tolist() == [[0, 1, 1, 1, 1, 0], [0, 1, 1, 0, 0, 0], [0, 1, 0, 0, 0, 0]]
    assert batch.lengths.tolist() == [5, 3, 2] and batch.lengths.dtype == torch.int64
    with pytest.raises(ValueError, match="exceeds bucket 4"):
        collate(samples, [1], bucket_len=4, pad_id=0, index=0)

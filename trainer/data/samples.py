"""Training data: JSONL → tokenized samples with a loss mask → fixed-shape padded batches.

Loading never stops at a bad line, however pathological (invalid UTF-8 or JSON, NUL bytes,
nesting 100,000 deep, a 5,000-digit number, the wrong types, text the tokenizer refuses,
token ids outside the target's vocabulary): it is skipped, counted and warned about as
`data: FILE:LINE: skipped (why)` (the first MAX_WARNINGS), with one summary line, and only a
file with no usable sample at all is an error. Batching is bucketed
and every batch has exactly `batch_size` rows so compiled kernels see static shapes.
Everything here is pure and thread-safe, for the prefetch workers.
"""

from __future__ import annotations

import bisect
import json
import math
import random
import sys
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

BUILTIN_DATASETS = {
    "synthetic-chat": "synthetic-chat.jsonl",
    "synthetic-text": "synthetic-text.jsonl",
    # Not shipped: generated into the cache on first use (trainer/data/sharegpt.py).
    "synthetic-sharegpt": "",
    # Not shipped: builtin:tiny-qwen3-chat's answers (trainer/builtins/tiny_chat.py).
    "tiny-chat-answers": "",
}
DATASETS_DIR = Path(__file__).parents[1] / "datasets"
MAX_WARNINGS = 20
ROLE_ALIASES = {
    "system": "system",
    "user": "user",
    "assistant": "assistant",
    "human": "user",
    "gpt": "assistant",
}


class DataError(ValueError):
    """No usable data; the message is one line and names data.path."""


@dataclass
class Sample:
    input_ids: list[int]
    # 1 where the token is a training target (assistant content + its end-of-turn token).
    loss_mask: list[int]


@dataclass
class LoadReport:
    lines: int  # non-blank lines read; lines == samples + skipped
    samples: int
    skipped: int
    truncated: int  # kept samples cut to max_len
    truncated_tokens: int = 0  # the tokens those cuts removed
    skip_reasons: dict[str, int] = field(default_factory=dict)


@dataclass
class Batch:
    input_ids: torch.Tensor  # int64 [B, S], right-padded with the pad id
    loss_mask: torch.Tensor  # float32 [B, S], 0 on padding
    lengths: torch.Tensor  # int64 [B], unpadded lengths (a packed row: its documents' sum)
    index: int  # position of this batch in the epoch's order
    # Packed rows only (trainer.data.packing); None = one document per row.
    doc_ids: torch.Tensor | None = None  # int64 [B, S]: the token's document in its row, -1 pad
    position_ids: torch.Tensor | None = None  # int64 [B, S]: restarting at 0 per document


class SkipLine(Exception):
    """A line is unusable; the message is the reason shown to the user."""


def _reason(text: str) -> str:
    """A skip reason as one bounded line: reasons are counted by their text."""
    lines = text.strip().splitlines()
    first = lines[0] if lines else "?"
    return first if len(first) <= 120 else first[:117] + "..."


def _shown(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def warn_stderr(message: str) -> None:
    """The default `warn` of the loaders: a warning line on stderr."""
    print(message, file=sys.stderr)


def _messages(record: dict[str, Any]) -> list[dict[str, str]]:
    """ShareGPT turns ({role, content} or {from, value}) → chat-template messages."""
    turns = record["conversations"]
    if not isinstance(turns, list) or not turns:
        raise SkipLine("'conversations' is not a non-empty list")
    messages = []
    for turn in turns:
        if not isinstance(turn, dict):
            raise SkipLine("a turn is not an object")
        raw_role = turn.get("role", turn.get("from"))
        content = turn.get("content", turn.get("value"))
        if not isinstance(raw_role, str) or raw_role.lower() not in ROLE_ALIASES:
            raise SkipLine(f"unknown role {_shown(raw_role)}")
        if not isinstance(content, str) or not content.strip():
            raise SkipLine("empty content")
        messages.append({"role": ROLE_ALIASES[raw_role.lower()], "content": content})
    if not any(m["role"] == "assistant" for m in messages):
        raise SkipLine("no assistant turn")
    return messages


def _assistant_spans(text: str, messages: list[dict[str, str]]) -> list[tuple[int, int]]:
    """Character spans of the assistant contents inside the rendered chat.

    Every message is searched in order from a moving cursor, so an assistant answer that also
    appears in an earlier user turn is not matched there, and any template layout (system
    preambles, Qwen3's think tags) works as long as the content itself is copied verbatim.
    """
    spans = []
    cursor = 0
    for m in messages:
        content = m["content"]
        start = text.find(content, cursor)
        if start < 0 and content.strip() != content:
            # Some templates trim the content.
            content = content.strip()
            start = text.find(content, cursor)
        if start < 0:
            if m["role"] == "assistant":
                raise SkipLine("assistant content not found in the rendered chat template")
            continue  # a template that rewrites system/user text: keep the cursor
        cursor = start + len(content)
        if m["role"] == "assistant":
            spans.append((start, cursor))
    return spans


def _chat_sample(record: dict[str, Any], tokenizer: PreTrainedTokenizerBase) -> Sample:
    messages = _messages(record)
    try:
        text = tokenizer.apply_chat_template(messages, tokenize=False)
    except Exception as e:  # templates raise anything (role order checks, missing vars)
        raise SkipLine(f"chat template failed: {str(e).splitlines()[0] if str(e) else e!r}") from e
    if not isinstance(text, str):
        raise SkipLine("chat template did not render text")
    spans = _assistant_spans(text, messages)
    # The template already wrote any BOS into the text, so add no specials again.
    enc = _tokenize(tokenizer, text, add_special_tokens=False, return_offsets_mapping=True)
    ids: list[int] = enc["input_ids"]
    offsets: list[tuple[int, int]] = enc["offset_mapping"]
    mask = [0] * len(ids)
    ends = [e for _, e in offsets]  # non-decreasing, so each span is found by bisection
    for span_start, span_end in spans:
        i = bisect.bisect_right(ends, span_start)  # the first token ending inside the span
        last = -1
        while i < len(ids) and offsets[i][0] < span_end:
            mask[i] = 1
            last = i
            i += 1
        # The token right after the answer (end of turn) is a target too: the drafter must
        # learn to stop.
        if 0 <= last < len(ids) - 1:
            mask[last + 1] = 1
    return Sample(input_ids=ids, loss_mask=mask)


def _text_sample(record: dict[str, Any], tokenizer: PreTrainedTokenizerBase) -> Sample:
    text = record["text"]
    if not isinstance(text, str) or not text.strip():
        raise SkipLine("empty text")
    ids: list[int] = _tokenize(tokenizer, text)["input_ids"]
    return Sample(input_ids=ids, loss_mask=[1] * len(ids))


def _tokens_sample(record: dict[str, Any]) -> Sample:
    """Already tokenized (`python -m trainer regenerate` writes these): `input_ids` and a
    `loss_mask` of 0/1 of the same length, with at least one token trained on."""
    ids, mask = record["input_ids"], record.get("loss_mask")
    if not isinstance(ids, list) or not ids:
        raise SkipLine("'input_ids' is not a non-empty list")
    if not all(type(i) is int for i in ids):
        raise SkipLine("'input_ids' holds something other than integers")
    if not isinstance(mask, list) or len(mask) != len(ids):
        raise SkipLine("'loss_mask' is not a list as long as 'input_ids'")
    if not all(type(m) is int and m in (0, 1) for m in mask):
        raise SkipLine("'loss_mask' holds something other than 0 and 1")
    return Sample(input_ids=ids, loss_mask=mask)


def _tokenize(tokenizer: PreTrainedTokenizerBase, text: str, **kwargs: Any) -> Any:
    try:
        return tokenizer(text, **kwargs)
    except Exception as e:  # lone surrogates and the like: the tokenizer's own errors
        raise SkipLine(f"the tokenizer refused the text ({type(e).__name__})") from e


def _decode_json(raw: bytes) -> Any:
    try:
        # Decoded here: json.loads(bytes) would guess UTF-16/32 from NUL bytes.
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError:
        raise SkipLine("invalid UTF-8") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        raise SkipLine("invalid JSON") from None
    except ValueError:  # CPython refuses to convert an integer of over 4300 digits
        raise SkipLine("invalid JSON (a number too long)") from None
    except RecursionError:
        raise SkipLine("invalid JSON (nested too deep)") from None


def _check_ids(sample: Sample, vocab_size: int | None) -> None:
    bad = [i for i in sample.input_ids if not isinstance(i, int) or i < 0]
    if vocab_size is not None:
        bad += [i for i in sample.input_ids if isinstance(i, int) and i >= vocab_size]
    if bad:
        raise SkipLine(f"token id {_shown(bad[0])} outside the target's vocabulary ({vocab_size})")


def parse_sample(raw: bytes, tokenizer: PreTrainedTokenizerBase, fmt: str) -> Sample:
    """One JSONL line as a Sample by `fmt` (auto: by its keys); SkipLine says why not. The
    one parser: the tokenization cache's worker processes run it too (data/tokenized.py)."""
    record = _decode_json(raw)
    if not isinstance(record, dict):
        raise SkipLine("not a JSON object")
    kind = fmt
    if fmt == "auto":
        if "conversations" in record:
            kind = "sharegpt"
        elif "text" in record:
            kind = "text"
        elif "input_ids" in record:
            kind = "tokens"
        else:
            raise SkipLine("no 'conversations', 'text' or 'input_ids' key")
    if kind == "tokens":
        if "input_ids" not in record:
            raise SkipLine("no 'input_ids' key (data.format = tokens)")
        return _tokens_sample(record)
    if kind == "sharegpt":
        if "conversations" not in record:
            raise SkipLine("no 'conversations' key (data.format = sharegpt)")
        return _chat_sample(record, tokenizer)
    if "text" not in record:
        raise SkipLine("no 'text' key (data.format = text)")
    return _text_sample(record, tokenizer)


def load_samples(
    path: Path,
    tokenizer: PreTrainedTokenizerBase,
    fmt: str = "auto",
    max_len: int = 2048,
    warn: Callable[[str], None] = warn_stderr,
    vocab_size: int | None = None,
    *,
    parse_line: Callable[[int, bytes], Sample] | None = None,
) -> tuple[list[Sample], LoadReport]:
    """Tokenize every usable line of a JSONL file; bad lines are skipped and reported.

    `vocab_size`: the target's embedding rows; a sample with a token id beyond is skipped.
    `parse_line(line_no, raw)` stands in for `parse_sample` (trainer/data/tokenized.py passes the
    results of worker processes through it); it raises `SkipLine` the same way."""
    if fmt not in ("auto", "sharegpt", "text"):
        raise ValueError(f"data.format: expected auto, sharegpt or text, got {fmt!r}")
    if fmt != "text" and not getattr(tokenizer, "is_fast", False):
        # The loss mask is placed through offset mappings, which only fast tokenizers give.
        raise ValueError(
            "target.path: the tokenizer is not a fast tokenizer (chat data needs offsets)"
        )
    samples: list[Sample] = []
    reasons: Counter[str] = Counter()
    lines = truncated = truncated_tokens = 0
    try:
        with open(path, "rb") as f:
            # Bytes, so that one line of bad UTF-8 is a skipped line, not a crash.
            raw_lines = f.read().split(b"\n")
    except OSError as e:
        raise DataError(f"data.path: cannot read {str(path)!r}: {e.strerror or e}") from None
    for line_no, raw in enumerate(raw_lines, start=1):
        if not raw.strip():
            continue
        lines += 1
        try:
            if parse_line is not None:
                sample = parse_line(line_no, raw)
            else:
                sample = parse_sample(raw, tokenizer, fmt)
            _check_ids(sample, vocab_size)
            cut = max(0, len(sample.input_ids) - max_len)
            if cut:
                sample = Sample(sample.input_ids[:max_len], sample.loss_mask[:max_len])
            if len(sample.input_ids) < 2:
                raise SkipLine("fewer than 2 tokens")
            if not any(sample.loss_mask):
                raise SkipLine(f"no loss token within the first {max_len} tokens")
        except SkipLine as skip:
            reason = _reason(str(skip))
            reasons[reason] += 1
            if sum(reasons.values()) <= MAX_WARNINGS:
                warn(f"data: {path}:{line_no}: skipped ({reason})")
            continue
        truncated += cut > 0
        truncated_tokens += cut
        samples.append(sample)
    skipped = sum(reasons.values())
    if skipped > MAX_WARNINGS:
        warn(f"data: {path}: {skipped - MAX_WARNINGS} more lines skipped (warnings stop at 20)")
    if skipped:
        most = ", ".join(f"{why}: {n}" for why, n in reasons.most_common(3))
        more = f", {len(reasons) - 3} other reasons" if len(reasons) > 3 else ""
        warn(f"data: {path}: skipped {skipped} of {lines} lines ({most}{more})")
    report = LoadReport(
        lines=lines,
        samples=len(samples),
        skipped=skipped,
        truncated=truncated,
        truncated_tokens=truncated_tokens,
        skip_reasons=dict(reasons),
    )
    if not samples:
        why = f"most often: {reasons.most_common(1)[0][0]}" if reasons else "no non-blank line"
        raise DataError(
            f"data.path: no usable sample in {str(path)!r}: {lines} lines, {skipped} skipped"
            f" ({why})"
        )
    return samples, report


def pick_bucket(length: int, buckets: list[int]) -> int:
    """The smallest bucket that holds `length`, else the largest (the sample was truncated)."""
    ordered = sorted(buckets)
    for bucket in ordered:
        if bucket >= length:
            return bucket
    return ordered[-1]


def _bucket_members(samples: list[Sample], buckets: list[int]) -> dict[int, list[int]]:
    members: dict[int, list[int]] = {b: [] for b in sorted(buckets)}
    for i, sample in enumerate(samples):
        members[pick_bucket(len(sample.input_ids), buckets)].append(i)
    return members


def batches_per_epoch(samples: list[Sample], buckets: list[int], batch_size: int) -> int:
    members = _bucket_members(samples, buckets)
    return sum(math.ceil(len(idx) / batch_size) for idx in members.values())


def epoch_batches(
    samples: list[Sample],
    buckets: list[int],
    batch_size: int,
    seed: int,
    epoch: int,
    *,
    shuffle: bool = True,
) -> list[list[int]]:
    """The epoch's batches as lists of sample indices, each batch from a single bucket.

    Deterministic for (seed, epoch). A bucket's last partial batch is topped up by wrapping
    around that bucket's (shuffled) order, so every batch has exactly `batch_size` rows.
    """
    if batch_size < 1:
        raise ValueError(f"train.batch_size: must be at least 1, got {batch_size}")
    # A string seed hashes the same in every process (unlike hash() of a tuple).
    rng = random.Random(f"dflash-data:{seed}:{epoch}")
    batches: list[list[int]] = []
    for members in _bucket_members(samples, buckets).values():
        if not members:
            continue
        if shuffle:
            rng.shuffle(members)
        n_batches = math.ceil(len(members) / batch_size)
        for b in range(n_batches):
            start = b * batch_size
            batches.append([members[(start + j) % len(members)] for j in range(batch_size)])
    if shuffle:
        rng.shuffle(batches)
    return batches


def collate(
    samples: list[Sample], indices: list[int], bucket_len: int, pad_id: int, index: int
) -> Batch:
    rows = [samples[i] for i in indices]
    too_long = [len(r.input_ids) for r in rows if len(r.input_ids) > bucket_len]
    if too_long:
        raise ValueError(f"collate: a sample of {max(too_long)} tokens exceeds bucket {bucket_len}")
    input_ids = torch.full((len(rows), bucket_len), pad_id, dtype=torch.int64)
    loss_mask = torch.zeros((len(rows), bucket_len), dtype=torch.float32)
    for r, sample in enumerate(rows):
        n = len(sample.input_ids)
        input_ids[r, :n] = torch.tensor(sample.input_ids, dtype=torch.int64)
        loss_mask[r, :n] = torch.tensor(sample.loss_mask, dtype=torch.float32)
    lengths = torch.tensor([len(r.input_ids) for r in rows], dtype=torch.int64)
    return Batch(input_ids=input_ids, loss_mask=loss_mask, lengths=lengths, index=index)

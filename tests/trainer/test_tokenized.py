"""The tokenization cache and the worker processes: same samples, report and warnings as a
fresh single-process `load_samples`, whatever the cache holds."""

from __future__ import annotations

import json
import struct
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from transformers import PreTrainedTokenizerFast

from trainer.data import tokenized
from trainer.data.samples import LoadReport, Sample, load_samples
from trainer.data.sharegpt import generate_lines
from trainer.data.tokenized import MAGIC, Tokenized, encode_entry, load_tokenized
from trainer.targets.tiny import build_tokenizer

MAX_LEN = 512


@pytest.fixture(scope="module")
def data_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Real multi-turn chats (some over MAX_LEN: truncated, a few skipped) and bad lines."""
    lines = generate_lines(n=120, seed=5)
    lines[3:3] = ["{not json", "", '{"conversations": []}', '{"text": "apple river moon"}']
    path = tmp_path_factory.mktemp("data") / "chats.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.fixture(scope="module")
def fresh(
    data_file: Path, tiny_tokenizer: PreTrainedTokenizerFast
) -> tuple[list[Sample], LoadReport, list[str]]:
    warnings: list[str] = []
    samples, report = load_samples(data_file, tiny_tokenizer, "auto", MAX_LEN, warnings.append)
    assert report.skipped >= 2 and report.truncated >= 1  # the test data exercises both
    return samples, report, warnings


def load(path: Path, tok: Any, root: Path, **kwargs: Any) -> tuple[Tokenized, list[str]]:
    warnings: list[str] = []
    kwargs.setdefault("max_len", MAX_LEN)
    out = load_tokenized(path, tok, warn=warnings.append, cache_root=root, **kwargs)
    return out, warnings


def test_a_cache_hit_equals_a_fresh_tokenization(
    tmp_path: Path, data_file: Path, tiny_tokenizer: PreTrainedTokenizerFast, fresh: Any
) -> None:
    samples, report, warnings = fresh
    cold, cold_warnings = load(data_file, tiny_tokenizer, tmp_path, workers=1)
    warm, warm_warnings = load(data_file, tiny_tokenizer, tmp_path, workers=1)
    assert (cold.info.cache, warm.info.cache) == ("miss", "hit")
    for got, got_warnings in ((cold, cold_warnings), (warm, warm_warnings)):
        assert got.samples == samples  # ids and masks, sample by sample
        assert got.report == report  # lines, samples, skipped, truncated, skip_reasons
        assert got_warnings == warnings  # a warm start still names the skipped lines
    assert warm.info.tokens == sum(len(s.input_ids) for s in samples)
    assert len(list(tmp_path.iterdir())) == 1


def _corruptions() -> dict[str, Callable[[bytes, Any], bytes]]:
    def reencoded(blob: bytes, mutate: Callable[[dict[str, Any]], None]) -> bytes:
        # A well-formed file with a valid checksum whose content is wrong: only the
        # structural checks can catch it.
        (hlen,) = struct.unpack_from("<Q", blob, len(MAGIC))
        start = len(MAGIC) + 8
        header = json.loads(blob[start : start + hlen])
        mutate(header)
        return header_and_arrays(header, blob[start + hlen : -32])

    def header_and_arrays(header: dict[str, Any], arrays: bytes) -> bytes:
        import hashlib

        raw = json.dumps(header).encode()
        raw += b" " * (-len(raw) % 8)
        body = MAGIC + struct.pack("<Q", len(raw)) + raw + arrays
        return body + hashlib.blake2b(body, digest_size=32).digest()

    def bad_id(blob: bytes, ctx: Any) -> bytes:
        samples, report, key, vocab = ctx
        bad = [Sample([*samples[0].input_ids[:-1], vocab + 5], samples[0].loss_mask)]
        return encode_entry(key, bad + samples[1:], report, [], vocab)

    def report_off(header: dict[str, Any]) -> None:
        header["report"]["samples"] -= 1

    return {
        "truncated": lambda blob, _: blob[: len(blob) // 2],
        "empty": lambda blob, _: b"",
        "bad magic": lambda blob, _: b"NOTCACHE" + blob[8:],
        "flipped byte": lambda blob, _: blob[:-100] + bytes([blob[-100] ^ 1]) + blob[-99:],
        "trailing bytes": lambda blob, _: blob + b"\0" * 8,
        "header not JSON": lambda blob, _: blob[:16] + b"}" + blob[17:],
        "report does not add up": lambda blob, _: reencoded(blob, report_off),
        "id outside the vocabulary": bad_id,
    }


@pytest.mark.parametrize("corruption", sorted(_corruptions()))
def test_a_corrupt_entry_is_rebuilt_with_one_warning(
    corruption: str,
    tmp_path: Path,
    data_file: Path,
    tiny_tokenizer: PreTrainedTokenizerFast,
    fresh: Any,
) -> None:
    samples, report, warnings = fresh
    load(data_file, tiny_tokenizer, tmp_path, workers=1)
    (entry,) = tmp_path.iterdir()
    key_prefix = entry.name.removesuffix(tokenized.SUFFIX)
    # The full key, for the re-encoded corruptions: read it from the good file.
    (hlen,) = struct.unpack_from("<Q", entry.read_bytes(), len(MAGIC))
    key = json.loads(entry.read_bytes()[16 : 16 + hlen])["key"]
    assert key.startswith(key_prefix)
    ctx = (samples, report, key, len(tiny_tokenizer))
    entry.write_bytes(_corruptions()[corruption](entry.read_bytes(), ctx))

    got, got_warnings = load(data_file, tiny_tokenizer, tmp_path, workers=1)
    extra = [w for w in got_warnings if w not in warnings]
    assert len(extra) == 1 and "tokenization cache" in extra[0] and "rebuilding" in extra[0]
    assert got.info.cache == "rebuilt"
    assert (got.samples, got.report) == (samples, report)
    again, again_warnings = load(data_file, tiny_tokenizer, tmp_path, workers=1)
    assert again.info.cache == "hit" and again_warnings == warnings
    assert again.samples == samples


def test_an_unwritable_cache_is_one_warning_and_no_crash(
    tmp_path: Path, data_file: Path, tiny_tokenizer: PreTrainedTokenizerFast, fresh: Any
) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    got, got_warnings = load(data_file, tiny_tokenizer, blocker / "cache", workers=1)
    assert got.samples == fresh[0] and got.report == fresh[1]
    extra = [w for w in got_warnings if w not in fresh[2]]
    assert len(extra) == 1 and "cannot write the tokenization cache" in extra[0]


def test_what_decides_the_tokens_is_in_the_key(
    tmp_path: Path, data_file: Path, tiny_tokenizer: PreTrainedTokenizerFast
) -> None:
    first, _ = load(data_file, tiny_tokenizer, tmp_path, workers=1)
    assert first.info.cache == "miss"
    assert load(data_file, tiny_tokenizer, tmp_path, workers=1)[0].info.cache == "hit"

    # The max length.
    assert load(data_file, tiny_tokenizer, tmp_path, max_len=256)[0].info.cache == "miss"
    # The format.
    assert load(data_file, tiny_tokenizer, tmp_path, fmt="sharegpt")[0].info.cache == "miss"
    # The tokenizer: another chat template, another special token.
    other = build_tokenizer()
    assert other.chat_template is not None
    other.chat_template = other.chat_template.replace("'\\n'", "' \\n'")
    assert load(data_file, other, tmp_path)[0].info.cache == "miss"
    masked = build_tokenizer()
    masked.add_special_tokens({"additional_special_tokens": ["<|MASK|>"]})
    assert load(data_file, masked, tmp_path)[0].info.cache == "miss"
    # The data: one line edited, same size.
    edited = tmp_path / "edited.jsonl"
    text = data_file.read_text()
    edited.write_text(text.replace("apple", "river", 1))
    assert edited.read_text() != text
    assert load(edited, tiny_tokenizer, tmp_path)[0].info.cache == "miss"
    # And the original is still served.
    assert load(data_file, tiny_tokenizer, tmp_path)[0].info.cache == "hit"


def test_several_processes_equal_one(
    tmp_path: Path, data_file: Path, tiny_tokenizer: PreTrainedTokenizerFast, fresh: Any
) -> None:
    done: list[int] = []
    totals: list[int] = []
    got, got_warnings = load(
        data_file,
        tiny_tokenizer,
        tmp_path,
        workers=3,
        use_cache=False,
        progress=done.append,
        on_total=totals.append,
    )
    assert got.info.workers == 3 and got.info.cache == "off"
    assert (got.samples, got.report, got_warnings) == fresh
    assert totals == [fresh[1].lines]
    assert done == sorted(done) and done[-1] == fresh[1].lines and len(done) > 2

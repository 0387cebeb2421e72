"""Tokenized training data: built by several processes, cached on disk, checked on read.

`load_tokenized` returns what `trainer.data.samples.load_samples` returns (the samples and the
LoadReport, and the same warnings, in the same order), plus how it got them:

- **Cache.** One file per key under `cache_root` (default `<cache dir>/tokenized`, see
  `trainer.targets.tiny.cache_dir`). The key is a sha256 over the data file's content, the
  tokenizer (class, length, backend JSON or vocabulary, specials, chat template, library
  versions), the format, the max length, and the code that tokenizes (CODE_VERSION and the
  source of trainer/data/samples.py: an edit there can never serve stale ids). The file:

      MAGIC (8 bytes) | header length (u64 LE) | header JSON, space-padded to 8 bytes
      | offsets int64[n + 1] | input ids int32[T] | loss mask uint8[T] | blake2b-256 of it all

  The header holds the key, n, T, the vocabulary size, the LoadReport and the warnings. A
  file that fails any check (magic, header, key, exact size, checksum, offsets monotone from
  0 to T with >= 2 tokens a sample, ids inside the vocabulary, mask 0/1 with a loss token in
  every sample, a report that adds up) is rebuilt with one warning line; a cache that
  cannot be written is one warning line too. Written atomically (temp file + rename); the
  newest MAX_ENTRIES files are kept.
- **Several processes.** A cold cache is tokenized by forked worker processes, each taking
  contiguous chunks of lines through `trainer.data.samples.parse_sample`; their results go back
  through `load_samples(parse_line=...)`, so skipping, truncation and the report are the
  same code as a single process, and the result is identical (tests/trainer/test_tokenized.py).
  Fork (as torch's DataLoader does on Linux): the children inherit the tokenizer and the
  lines instead of importing torch again (5 s here), and touch nothing but the tokenizer.
"""

from __future__ import annotations

import contextlib
import faulthandler
import hashlib
import itertools
import json
import math
import multiprocessing
import os
import signal
import struct
import time
from array import array
from collections.abc import Callable, Iterator
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

import trainer.data.samples as data_module
from trainer.contract.heartbeat import DataInfo
from trainer.data.samples import DataError, LoadReport, Sample, SkipLine, load_samples, parse_sample
from trainer.fsutil import atomic_write

CODE_VERSION = 1  # bump with any change to this file's format or to what a sample holds
MAGIC = b"DFTOKv1\n"
DIGEST = 32
MAX_ENTRIES = 8
PARALLEL_MIN_LINES = 256  # below this a pool costs more than it saves
MAX_WORKERS = 16
SUFFIX = ".tokens"


class _Corrupt(Exception):
    """A cache file that must not be used; the message says why, in a few words."""


# -- the key -----------------------------------------------------------------------------
def tokenizer_fingerprint(tokenizer: Any) -> str:
    """sha256 over everything that decides the ids and the loss mask."""
    import tokenizers
    import transformers

    cls = type(tokenizer)
    h = hashlib.sha256()
    parts: list[str] = [
        f"{cls.__module__}.{cls.__qualname__}",
        str(len(tokenizer)),
        json.dumps(getattr(tokenizer, "chat_template", None), sort_keys=True, default=str),
        json.dumps(tokenizer.special_tokens_map, sort_keys=True, default=str),
        json.dumps(tokenizer.get_added_vocab(), sort_keys=True),
        f"transformers {transformers.__version__}, tokenizers {tokenizers.__version__}",
    ]
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None:
        parts.append(backend.to_str())  # vocab, merges, normalizer, pre-tokenizer, specials
    else:
        parts.append(json.dumps(sorted(tokenizer.get_vocab().items())))
    for part in parts:
        h.update(part.encode())
        h.update(b"\0")
    return h.hexdigest()


def code_fingerprint() -> str:
    source = Path(data_module.__file__).read_bytes()
    return f"{CODE_VERSION}:{hashlib.sha256(source).hexdigest()}"


def cache_key(
    data_sha256: str, tokenizer_sha256: str, fmt: str, max_len: int, vocab_size: int | None = None
) -> str:
    fields = {
        "code": code_fingerprint(),
        "data": data_sha256,
        "tokenizer": tokenizer_sha256,
        "format": fmt,
        "max_len": max_len,
        "vocab_size": vocab_size,  # lines with ids beyond the target's embedding are skipped
    }
    return hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()


def default_cache_root() -> Path:
    from trainer.host_cache import cache_dir

    return cache_dir() / "tokenized"


# -- the file ----------------------------------------------------------------------------
def encode_entry(
    key: str, samples: list[Sample], report: LoadReport, warnings: list[str], vocab: int
) -> bytes:
    n = len(samples)
    total = sum(len(s.input_ids) for s in samples)
    offsets = np.zeros(n + 1, dtype=np.int64)
    np.cumsum([len(s.input_ids) for s in samples], out=offsets[1:])
    ids = np.fromiter(
        itertools.chain.from_iterable(s.input_ids for s in samples), dtype=np.int32, count=total
    )
    mask = np.fromiter(
        itertools.chain.from_iterable(s.loss_mask for s in samples), dtype=np.uint8, count=total
    )
    header = json.dumps(
        {
            "key": key,
            "samples": n,
            "tokens": total,
            "vocab": vocab,
            "report": {
                "lines": report.lines,
                "samples": report.samples,
                "skipped": report.skipped,
                "truncated": report.truncated,
                "truncated_tokens": report.truncated_tokens,
                "skip_reasons": report.skip_reasons,
            },
            "warnings": warnings,
        },
        sort_keys=True,
    ).encode()
    header += b" " * (-len(header) % 8)  # the arrays start 8-byte aligned
    body = b"".join(
        [
            MAGIC,
            struct.pack("<Q", len(header)),
            header,
            offsets.tobytes(),
            ids.tobytes(),
            mask.tobytes(),
        ]
    )
    return body + hashlib.blake2b(body, digest_size=DIGEST).digest()


def _int(header: dict[str, Any], name: str) -> int:
    value = header.get(name)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise _Corrupt(f"header field {name!r} is not a count")
    return value


def _report(raw: Any) -> LoadReport:
    if not isinstance(raw, dict):
        raise _Corrupt("no report in the header")
    reasons = raw.get("skip_reasons")
    if not isinstance(reasons, dict) or not all(
        isinstance(k, str) and isinstance(v, int) and not isinstance(v, bool) and v > 0
        for k, v in reasons.items()
    ):
        raise _Corrupt("bad skip reasons in the header")
    report = LoadReport(
        lines=_int(raw, "lines"),
        samples=_int(raw, "samples"),
        skipped=_int(raw, "skipped"),
        truncated=_int(raw, "truncated"),
        truncated_tokens=_int(raw, "truncated_tokens"),
        skip_reasons=dict(reasons),
    )
    if report.lines != report.samples + report.skipped or report.skipped != sum(reasons.values()):
        raise _Corrupt("the report does not add up")
    return report


def decode_entry(
    blob: bytes, key: str, vocab: int, max_len: int
) -> tuple[list[Sample], LoadReport, list[str]]:
    """The samples, report and warnings in `blob`; raises _Corrupt on any inconsistency."""
    start = len(MAGIC) + 8
    if len(blob) < start + DIGEST or blob[: len(MAGIC)] != MAGIC:
        raise _Corrupt("bad header")
    body, digest = memoryview(blob)[:-DIGEST], blob[-DIGEST:]  # no 14 MB copy
    (header_len,) = struct.unpack_from("<Q", blob, len(MAGIC))
    if start + header_len > len(body):
        raise _Corrupt("truncated header")
    try:
        header = json.loads(blob[start : start + header_len])
    except ValueError:
        raise _Corrupt("header is not JSON") from None
    if not isinstance(header, dict) or header.get("key") != key:
        raise _Corrupt("header names another key")
    n, total = _int(header, "samples"), _int(header, "tokens")
    base = start + header_len
    expected = base + 8 * (n + 1) + 4 * total + total
    if len(body) != expected:
        raise _Corrupt(f"wrong lengths ({len(body)} bytes, expected {expected})")
    if hashlib.blake2b(body, digest_size=DIGEST).digest() != digest:
        raise _Corrupt("checksum mismatch")
    report = _report(header.get("report"))
    warnings = header.get("warnings")
    if not isinstance(warnings, list) or not all(isinstance(w, str) for w in warnings):
        raise _Corrupt("bad warnings in the header")
    if header.get("vocab") != vocab or report.samples != n or n < 1:
        raise _Corrupt("header does not match the tokenizer or the report")
    offsets = np.frombuffer(body, dtype=np.int64, count=n + 1, offset=base)
    ids = np.frombuffer(body, dtype=np.int32, count=total, offset=base + 8 * (n + 1))
    mask = np.frombuffer(body, dtype=np.uint8, count=total, offset=base + 8 * (n + 1) + 4 * total)
    lengths = np.diff(offsets)
    if offsets[0] != 0 or offsets[-1] != total or lengths.min() < 2 or lengths.max() > max_len:
        raise _Corrupt("bad offsets")
    if total and (ids.min() < 0 or ids.max() >= vocab):
        raise _Corrupt("token id outside the vocabulary")
    if total and mask.max() > 1:
        raise _Corrupt("loss mask is not 0/1")
    if (np.add.reduceat(mask, offsets[:-1]) == 0).any():
        raise _Corrupt("a sample without a loss token")
    # Slices of the arrays straight to lists: the lists are most of a warm start's time.
    samples = [
        Sample(ids[a:b].tolist(), mask[a:b].tolist())
        for a, b in itertools.pairwise(offsets.tolist())
    ]
    return samples, report, warnings


# -- several processes -------------------------------------------------------------------
# Set in the parent just before the fork; the children inherit it (nothing is pickled).
_WORK: tuple[Any, str, list[bytes]] | None = None
Parsed = tuple[bytes, bytes] | str  # (int32 ids, uint8 mask) or the skip reason


def _worker_init() -> None:
    # A forked child inherits the trainer's handlers: on SIGTERM it would only ask itself to
    # "finish the current step" and never exit. A worker ignores the stop and dump signals
    # that reach the whole process group (`dflash-tui kill`): its chunks are short, the
    # parent finishes loading and then stops; SIGKILL still ends everything.
    with contextlib.suppress(AttributeError, ValueError):
        faulthandler.unregister(signal.SIGUSR2)
    faulthandler.disable()
    for name in ("SIGTERM", "SIGINT", "SIGUSR1", "SIGUSR2"):
        if hasattr(signal, name):
            signal.signal(getattr(signal, name), signal.SIG_IGN)


def _parse_range(bounds: tuple[int, int]) -> list[tuple[int, Parsed]]:
    assert _WORK is not None
    tokenizer, fmt, raw_lines = _WORK
    out: list[tuple[int, Parsed]] = []
    for index in range(*bounds):
        raw = raw_lines[index]
        if not raw.strip():
            continue
        try:
            s = parse_sample(raw, tokenizer, fmt)
        except SkipLine as skip:
            out.append((index + 1, str(skip)))
            continue
        out.append((index + 1, (array("i", s.input_ids).tobytes(), bytes(s.loss_mask))))
    return out


@contextlib.contextmanager
def _tokenizers_quiet() -> Iterator[None]:
    # A forked child of a process that used the tokenizers thread pool prints a warning
    # unless TOKENIZERS_PARALLELISM is set; the children encode one text at a time anyway.
    old = os.environ.get("TOKENIZERS_PARALLELISM")
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("TOKENIZERS_PARALLELISM", None)
        else:
            os.environ["TOKENIZERS_PARALLELISM"] = old


def parse_in_workers(
    raw_lines: list[bytes],
    tokenizer: Any,
    fmt: str,
    workers: int,
    progress: Callable[[int], None] = lambda _d: None,
) -> dict[int, Parsed]:
    """{line number: parsed} for every non-blank line, from `workers` forked processes."""
    global _WORK
    chunk = max(8, math.ceil(len(raw_lines) / (workers * 16)))
    ranges = [(i, min(i + chunk, len(raw_lines))) for i in range(0, len(raw_lines), chunk)]
    results: dict[int, Parsed] = {}
    _WORK = (tokenizer, fmt, raw_lines)
    try:
        # Forked from this (the main) thread before the executor starts its own thread.
        ctx = multiprocessing.get_context("fork")
        pool = ProcessPoolExecutor(workers, mp_context=ctx, initializer=_worker_init)
        # A dead worker raises BrokenProcessPool here instead of hanging the load.
        with _tokenizers_quiet(), pool:
            for part in pool.map(_parse_range, ranges):
                results.update(part)
                progress(len(results))
    finally:
        _WORK = None
    return results


def auto_workers(requested: int, lines: int) -> int:
    if requested > 0:
        return requested
    if lines < PARALLEL_MIN_LINES or "fork" not in multiprocessing.get_all_start_methods():
        return 1
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cores = os.cpu_count() or 1
    return max(1, min(cores, MAX_WORKERS))


def tokenize(
    path: Path,
    raw_lines: list[bytes],
    tokenizer: Any,
    fmt: str,
    max_len: int,
    warn: Callable[[str], None],
    workers: int,
    progress: Callable[[int], None] = lambda _d: None,
    vocab_size: int | None = None,
) -> tuple[list[Sample], LoadReport, bool]:
    """`load_samples` over `raw_lines` (the content of `path`, already read), with `workers`
    processes; the bool says the file still held those lines when load_samples read it."""
    unchanged = True
    if fmt not in ("auto", "sharegpt", "text") or (
        fmt != "text" and not getattr(tokenizer, "is_fast", False)
    ):
        workers = 1  # load_samples refuses these with its own message, before any line
    if workers > 1:
        parsed = parse_in_workers(raw_lines, tokenizer, fmt, workers, progress)

        def parse_line(line_no: int, raw: bytes) -> Sample:
            nonlocal unchanged
            got = parsed.get(line_no)
            if got is None or raw != raw_lines[line_no - 1]:
                unchanged = False  # the file changed since it was read: parse what is there
                return parse_sample(raw, tokenizer, fmt)
            if isinstance(got, str):
                raise SkipLine(got)
            ids = array("i")
            ids.frombytes(got[0])
            return Sample(ids.tolist(), list(got[1]))

    else:
        done = 0

        def parse_line(line_no: int, raw: bytes) -> Sample:
            nonlocal done, unchanged
            if line_no > len(raw_lines) or raw != raw_lines[line_no - 1]:
                unchanged = False
            done += 1
            if done % 64 == 0:
                progress(done)
            return parse_sample(raw, tokenizer, fmt)

    samples, report = load_samples(
        path, tokenizer, fmt, max_len, warn, vocab_size, parse_line=parse_line
    )
    return samples, report, unchanged


# -- the whole load ----------------------------------------------------------------------
@dataclass
class Tokenized:
    samples: list[Sample]
    report: LoadReport
    info: DataInfo


def count_lines(raw_lines: list[bytes]) -> int:
    return sum(1 for raw in raw_lines if raw.strip())


def _prune(root: Path, keep: Path) -> None:
    entries = []
    for p in root.glob(f"*{SUFFIX}"):
        with contextlib.suppress(OSError):
            entries.append((p.stat().st_mtime, p))
    entries.sort(reverse=True)
    for _, p in entries[MAX_ENTRIES:]:
        if p != keep:
            with contextlib.suppress(OSError):
                p.unlink()


def load_tokenized(
    path: Path,
    tokenizer: Any,
    fmt: str = "auto",
    max_len: int = 2048,
    warn: Callable[[str], None] = data_module.warn_stderr,
    *,
    cache_root: Path | None = None,
    use_cache: bool = True,
    workers: int = 0,
    on_total: Callable[[int], None] = lambda _n: None,
    progress: Callable[[int], None] = lambda _d: None,
    vocab_size: int | None = None,
) -> Tokenized:
    """The samples of `path`, from the cache when its entry is good, else tokenized (and
    cached). `on_total(lines)` is called once the lines are counted, `progress(done)` as
    they are tokenized."""
    t0 = time.monotonic()
    try:
        content = path.read_bytes()
    except OSError as e:
        raise DataError(f"data.path: cannot read {str(path)!r}: {e.strerror or e}") from None
    raw_lines = content.split(b"\n")
    total_lines = count_lines(raw_lines)
    on_total(total_lines)
    vocab = len(tokenizer)
    entry: Path | None = None
    key = ""
    state = "off"
    if use_cache:
        root = cache_root if cache_root is not None else default_cache_root()
        data_sha = hashlib.sha256(content).hexdigest()
        key = cache_key(data_sha, tokenizer_fingerprint(tokenizer), fmt, max_len, vocab_size)
        entry = root / f"{key[:40]}{SUFFIX}"
        state = "miss"
        blob: bytes | None = None
        try:
            blob = entry.read_bytes()
        except (FileNotFoundError, NotADirectoryError):
            pass  # a miss
        except OSError as e:
            warn(f"data: tokenization cache {entry} unreadable ({e.strerror or e}); rebuilding")
            state = "rebuilt"
        if blob is not None:
            try:
                samples, report, warnings = decode_entry(blob, key, vocab, max_len)
            except _Corrupt as e:
                warn(f"data: tokenization cache {entry} is corrupt ({e}); rebuilding it")
                state = "rebuilt"
            else:
                for w in warnings:
                    warn(w)
                progress(total_lines)
                with contextlib.suppress(OSError):
                    os.utime(entry)  # recently used: kept by _prune
                return Tokenized(samples, report, _info("hit", t0, samples, report, 0, entry))
    n_workers = auto_workers(workers, total_lines)
    warnings = []

    def record(message: str) -> None:
        warnings.append(message)
        warn(message)

    samples, report, unchanged = tokenize(
        path, raw_lines, tokenizer, fmt, max_len, record, n_workers, progress, vocab_size
    )
    progress(total_lines)
    if entry is not None and unchanged:
        try:
            entry.parent.mkdir(parents=True, exist_ok=True)
            blob = encode_entry(key, samples, report, warnings, vocab)
            atomic_write(entry, lambda f: f.write(blob), durable=False)
            _prune(entry.parent, entry)
        except (OSError, OverflowError, ValueError) as e:
            warn(f"data: cannot write the tokenization cache {entry}: {e}")
    return Tokenized(samples, report, _info(state, t0, samples, report, n_workers, entry))


def _info(
    cache: str, t0: float, samples: list[Sample], report: LoadReport, workers: int, entry: Any
) -> DataInfo:
    return DataInfo(
        cache=cache,
        seconds=round(time.monotonic() - t0, 3),
        lines=report.lines,
        samples=report.samples,
        skipped=report.skipped,
        truncated=report.truncated,
        tokens=sum(len(s.input_ids) for s in samples),
        workers=workers,
        entry=str(entry) if entry is not None else "",
    )


def summary(info: DataInfo) -> str:
    """The train.log line: what was loaded, and whether the cache served it."""
    how = {
        "hit": "from the tokenization cache",
        "miss": f"tokenized ({info.workers} process(es)), cached",
        "rebuilt": f"tokenized ({info.workers} process(es)), cache entry rebuilt",
        "off": f"tokenized ({info.workers} process(es)), cache off",
    }.get(info.cache, info.cache)
    return (
        f"data: {info.samples} samples, {info.tokens} tokens from {info.lines} lines"
        f" ({info.skipped} skipped, {info.truncated} truncated), {how} in {info.seconds:.2f}s"
    )

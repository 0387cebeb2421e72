"""Typed records <-> JSON: one decoder for every file and event of the contract.

A record is a dataclass whose fields are annotated with JSON-shaped types: bool, int, float,
str, None, `X | None`, `list[X]`, `dict[str, X]`, `Literal[...]`, `Any` and other records.
`decode(Record, data)` checks every field against its annotation and raises `Invalid` with
the path of the first bad value ("queues.q_pre[0].depth: expected int, got str"); readers turn
that into an `Unreadable` value, never a half-filled dict. `encode(record)` is the inverse.

Two rules keep old and new run dirs readable (ARCHITECTURE.md, "Versioning"):
- keys a record does not know are ignored (a newer writer may add fields);
- a field missing from the data takes its default (an older writer had no such field);
  fields without a default are required.
`lenient=True` (for data of a newer schema) resets a bad optional field to its default
instead of failing, so an older monitor still shows what it knows.

Standard library only, Python >= 3.10: the agent carries this module to the training host.
"""

from __future__ import annotations

import dataclasses
import errno
import json
import math
import os
import stat
import types
import typing
from pathlib import Path
from typing import Any, Literal, TypeVar, Union

from trainer.contract.textfile import file_kind

T = TypeVar("T")

# Bounds on what one record may hold: a hostile or corrupt file costs bounded memory and time.
MAX_STR = 1 << 20  # characters in one string (tracebacks are the longest legitimate ones)
MAX_ITEMS = 100_000  # entries in one list or dict


class Invalid(ValueError):
    """Data that does not match a record's annotations; the message names the path."""


@dataclasses.dataclass(frozen=True)
class Unreadable:
    """What a reader returns for a torn, foreign or hostile file: a value, not an exception."""

    what: str  # the file or event, e.g. "heartbeat.json"
    why: str  # one line: "not JSON (Expecting value: line 1 column 1)"

    def __str__(self) -> str:
        return f"{self.what} unreadable: {self.why}"


def _type_name(value: Any) -> str:
    return "null" if value is None else type(value).__name__


_HINTS: dict[type, list[tuple[str, Any, bool, Any]]] = {}


def _fields(cls: type) -> list[tuple[str, Any, bool, Any]]:
    """(name, annotation, required, default factory) per field, resolved once per class."""
    cached = _HINTS.get(cls)
    if cached is None:
        hints = typing.get_type_hints(cls)
        cached = []
        for f in dataclasses.fields(cls):
            if f.default is not dataclasses.MISSING:
                cached.append((f.name, hints[f.name], False, lambda d=f.default: d))
            elif f.default_factory is not dataclasses.MISSING:
                cached.append((f.name, hints[f.name], False, f.default_factory))
            else:
                cached.append((f.name, hints[f.name], True, None))
        _HINTS[cls] = cached
    return cached


def decode(cls: type[T], data: Any, where: str = "", lenient: bool = False) -> T:
    """`data` (parsed JSON) as a `cls` record; raises Invalid naming the bad path."""
    return typing.cast(T, _decode(cls, data, where, lenient))


def _decode(tp: Any, value: Any, where: str, lenient: bool) -> Any:
    if tp is Any:
        return value
    if dataclasses.is_dataclass(tp) and isinstance(tp, type):
        return _decode_record(tp, value, where, lenient)
    origin = typing.get_origin(tp)
    if origin in (Union, types.UnionType):
        options = typing.get_args(tp)
        if value is None and type(None) in options:
            return None
        errors = []
        for option in options:
            if option is type(None):
                continue
            try:
                return _decode(option, value, where, lenient)
            except Invalid as e:
                errors.append(str(e))
        raise Invalid(errors[0] if len(errors) == 1 else f"{where or 'value'}: {errors}")
    if origin is Literal:
        if value not in typing.get_args(tp):
            raise Invalid(f"{where or 'value'}: {value!r} is not one of {typing.get_args(tp)}")
        return value
    if origin is list:
        if not isinstance(value, list):
            raise Invalid(f"{where or 'value'}: expected a list, got {_type_name(value)}")
        if len(value) > MAX_ITEMS:
            raise Invalid(f"{where or 'value'}: {len(value)} items (at most {MAX_ITEMS})")
        (item,) = typing.get_args(tp)
        return [_decode(item, v, f"{where}[{i}]", lenient) for i, v in enumerate(value)]
    if origin is dict:
        if not isinstance(value, dict):
            raise Invalid(f"{where or 'value'}: expected an object, got {_type_name(value)}")
        if len(value) > MAX_ITEMS:
            raise Invalid(f"{where or 'value'}: {len(value)} keys (at most {MAX_ITEMS})")
        _key, item = typing.get_args(tp)
        return {
            str(k): _decode(item, v, f"{where}.{k}" if where else str(k), lenient)
            for k, v in value.items()
        }
    return _decode_scalar(tp, value, where)


def _decode_scalar(tp: Any, value: Any, where: str) -> Any:
    name = where or "value"
    if tp is type(None):
        if value is not None:
            raise Invalid(f"{name}: expected null, got {_type_name(value)}")
        return None
    if tp is bool:
        if not isinstance(value, bool):
            raise Invalid(f"{name}: expected true/false, got {_type_name(value)}")
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise Invalid(f"{name}: expected int, got {_type_name(value)}")
        return value
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise Invalid(f"{name}: expected a number, got {_type_name(value)}")
        try:
            return float(value)
        except OverflowError:  # an integer of 309 digits or more: no float holds it
            raise Invalid(
                f"{name}: an integer of {int(value).bit_length()} bits: too large"
            ) from None
    if tp is str:
        if not isinstance(value, str):
            raise Invalid(f"{name}: expected a string, got {_type_name(value)}")
        if len(value) > MAX_STR:
            raise Invalid(f"{name}: string of {len(value)} characters (at most {MAX_STR})")
        return value
    raise TypeError(f"{name}: the contract has no decoder for {tp!r}")  # a bug in a record


def _decode_record(cls: type, value: Any, where: str, lenient: bool) -> Any:
    if not isinstance(value, dict):
        raise Invalid(f"{where or cls.__name__}: expected an object, got {_type_name(value)}")
    kwargs = {}
    for name, tp, required, default in _fields(cls):
        path = f"{where}.{name}" if where else name
        if name not in value:
            if required:
                raise Invalid(f"{path}: missing")
            continue
        try:
            kwargs[name] = _decode(tp, value[name], path, lenient)
        except Invalid:
            if required or not lenient:
                raise
            kwargs[name] = default()
    return cls(**kwargs)


# A record is read only from a regular file at its own name: a symlink there is refused, not
# followed (a planted `heartbeat.json -> /etc/shadow`), and a FIFO is never waited on.
_OPEN_FLAGS = (
    os.O_RDONLY
    | getattr(os, "O_NOFOLLOW", 0)
    | getattr(os, "O_NONBLOCK", 0)
    | getattr(os, "O_CLOEXEC", 0)
)


def read_bounded(path: str | Path, limit: int) -> bytes | Unreadable | None:
    """A file's bytes, or why not; None when it does not exist. Reads at most limit + 1 bytes:
    a huge or endless file costs bounded memory, and `parse_json` names it too large. Only a
    regular file is read: a symlink at `path` is refused, not followed, and a FIFO or device
    is refused without blocking."""
    name = Path(path).name
    try:
        fd = os.open(path, _OPEN_FLAGS)
    except FileNotFoundError:
        return None
    except OSError as e:
        if e.errno == errno.ELOOP:
            return Unreadable(name, "a symlink: refused, not followed")
        return Unreadable(name, e.strerror or str(e))
    try:
        # Checked before fdopen, which raises on a folder's descriptor (IsADirectoryError).
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            return Unreadable(name, f"{file_kind(mode)}, not a regular file: refused")
        return _read_upto(fd, limit + 1)
    except OSError as e:
        return Unreadable(name, e.strerror or str(e))
    finally:
        os.close(fd)


def _read_upto(fd: int, n: int) -> bytes:
    """At most `n` bytes of `fd` (a regular file: os.read may return less than asked)."""
    chunks: list[bytes] = []
    while n > 0:
        chunk = os.read(fd, min(n, 1 << 20))
        if not chunk:
            break
        chunks.append(chunk)
        n -= len(chunk)
    return b"".join(chunks)


def parse_json(raw: bytes | str, what: str, limit: int) -> Any:
    """Parsed JSON, or an `Unreadable` (too large, empty, not JSON, nested too deep)."""
    if len(raw) > limit:
        return Unreadable(what, f"{len(raw)} bytes: too large (at most {limit})")
    if not raw.strip():
        return Unreadable(what, "empty")
    try:
        return json.loads(raw)
    except (ValueError, RecursionError) as e:
        return Unreadable(what, f"not JSON ({str(e)[:200]})")


def encode(record: Any) -> Any:
    """A record (or list/dict of records) as JSON-ready data; the inverse of decode."""
    if dataclasses.is_dataclass(record) and not isinstance(record, type):
        return {f.name: encode(getattr(record, f.name)) for f in dataclasses.fields(record)}
    if isinstance(record, list | tuple):
        return [encode(v) for v in record]
    if isinstance(record, dict):
        return {str(k): encode(v) for k, v in record.items()}
    return record


def finite(x: float | None) -> float | None:
    """`x` when it is a finite number, else None (NaN losses are real; ages of NaN are not)."""
    return x if x is not None and math.isfinite(x) else None

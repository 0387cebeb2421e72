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


# A decoder per annotation, built once: which checks apply is settled per type, not per
# value (a heartbeat holds hundreds of values, and the agent and the monitor decode one every
# second; deciding per value what each annotation meant took ~1 ms of the line latency).
Decoder = typing.Callable[[Any, str, bool], Any]
_DECODERS: dict[Any, Decoder] = {}


def _decoder(tp: Any) -> Decoder:
    found = _DECODERS.get(tp)
    if found is None:
        found = _DECODERS[tp] = _build(tp)
    return found


def _decode(tp: Any, value: Any, where: str, lenient: bool) -> Any:
    return _decoder(tp)(value, where, lenient)


def _build(tp: Any) -> Decoder:
    if tp is Any:
        return lambda value, _where, _lenient: value
    if dataclasses.is_dataclass(tp) and isinstance(tp, type):
        return _record_decoder(tp)
    origin = typing.get_origin(tp)
    if origin in (Union, types.UnionType):
        return _union_decoder(typing.get_args(tp))
    if origin is Literal:
        return _literal_decoder(typing.get_args(tp))
    if origin is list:
        return _list_decoder(typing.get_args(tp)[0])
    if origin is dict:
        return _dict_decoder(typing.get_args(tp)[1])
    return _scalar_decoder(tp)


def _union_decoder(options: tuple[Any, ...]) -> Decoder:
    nullable = type(None) in options
    others = [o for o in options if o is not type(None)]

    def union(value: Any, where: str, lenient: bool) -> Any:
        if value is None and nullable:
            return None
        errors = []
        for option in others:
            try:
                return _decoder(option)(value, where, lenient)
            except Invalid as e:
                errors.append(str(e))
        raise Invalid(errors[0] if len(errors) == 1 else f"{where or 'value'}: {errors}")

    return union


def _literal_decoder(allowed: tuple[Any, ...]) -> Decoder:
    def literal(value: Any, where: str, _lenient: bool) -> Any:
        if value not in allowed:
            raise Invalid(f"{where or 'value'}: {value!r} is not one of {allowed}")
        return value

    return literal


def _list_decoder(item_tp: Any) -> Decoder:
    def a_list(value: Any, where: str, lenient: bool) -> Any:
        if not isinstance(value, list):
            raise Invalid(f"{where or 'value'}: expected a list, got {_type_name(value)}")
        if len(value) > MAX_ITEMS:
            raise Invalid(f"{where or 'value'}: {len(value)} items (at most {MAX_ITEMS})")
        item = _decoder(item_tp)
        return [item(v, f"{where}[{i}]", lenient) for i, v in enumerate(value)]

    return a_list


def _dict_decoder(item_tp: Any) -> Decoder:
    def a_dict(value: Any, where: str, lenient: bool) -> Any:
        if not isinstance(value, dict):
            raise Invalid(f"{where or 'value'}: expected an object, got {_type_name(value)}")
        if len(value) > MAX_ITEMS:
            raise Invalid(f"{where or 'value'}: {len(value)} keys (at most {MAX_ITEMS})")
        item = _decoder(item_tp)
        return {
            str(k): item(v, f"{where}.{k}" if where else str(k), lenient) for k, v in value.items()
        }

    return a_dict


def _expected(value: Any, where: str, what: str) -> Invalid:
    return Invalid(f"{where or 'value'}: expected {what}, got {_type_name(value)}")


def _null(value: Any, where: str, _lenient: bool) -> Any:
    if value is not None:
        raise _expected(value, where, "null")
    return None


def _bool(value: Any, where: str, _lenient: bool) -> Any:
    if not isinstance(value, bool):
        raise _expected(value, where, "true/false")
    return value


def _int(value: Any, where: str, _lenient: bool) -> Any:
    if isinstance(value, bool) or not isinstance(value, int):
        raise _expected(value, where, "int")
    return value


def _float(value: Any, where: str, _lenient: bool) -> Any:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise _expected(value, where, "a number")
    try:
        return float(value)
    except OverflowError:  # an integer of 309 digits or more: no float holds it
        raise Invalid(
            f"{where or 'value'}: an integer of {int(value).bit_length()} bits: too large"
        ) from None


def _str(value: Any, where: str, _lenient: bool) -> Any:
    if not isinstance(value, str):
        raise _expected(value, where, "a string")
    if len(value) > MAX_STR:
        raise Invalid(f"{where or 'value'}: string of {len(value)} characters (at most {MAX_STR})")
    return value


_SCALARS: dict[Any, Decoder] = {type(None): _null, bool: _bool, int: _int, float: _float, str: _str}


def _scalar_decoder(tp: Any) -> Decoder:
    def unknown(_value: Any, where: str, _lenient: bool) -> Any:
        name = where or "value"
        raise TypeError(f"{name}: the contract has no decoder for {tp!r}")  # a bug in a record

    return _SCALARS.get(tp, unknown)


def _record_decoder(cls: type) -> Decoder:
    # Its fields' decoders are looked up at its first use, not now: a record may hold
    # itself (a tree), and its own decoder is stored before that first use. Built whole,
    # then set: a thread decoding beside the first never sees half a list.
    compiled: list[list[tuple[str, Decoder, bool, Any]]] = []

    def record(value: Any, where: str, lenient: bool) -> Any:
        if not isinstance(value, dict):
            raise Invalid(f"{where or cls.__name__}: expected an object, got {_type_name(value)}")
        if not compiled:
            compiled.append([(n, _decoder(tp), req, dflt) for n, tp, req, dflt in _fields(cls)])
        kwargs = {}
        for name, field, required, default in compiled[0]:
            if name not in value:
                if required:
                    raise Invalid(f"{f'{where}.{name}' if where else name}: missing")
                continue
            try:
                kwargs[name] = field(value[name], f"{where}.{name}" if where else name, lenient)
            except Invalid:
                if required or not lenient:
                    raise
                kwargs[name] = default()
        return cls(**kwargs)

    return record


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

"""Command lines from stdin: read in bounded chunks, decoded at the boundary, never fatal.

Whatever arrives (a 20 MB line, 100,000 nested brackets, a command with a wrong type), the
reader answers it with an error and goes on to the next line: a bad line never kills the
thread that every later command depends on.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator
from typing import Any, BinaryIO

from trainer.contract.protocol import MAX_LINE_BYTES, Command, decode_command
from trainer.contract.typed import Unreadable

CHUNK = 1 << 16  # bytes one readline() may return: the most a line costs before it is judged


@dataclasses.dataclass(frozen=True)
class Rejected:
    """A line that is no command, answered with a failed result."""

    id: int | None  # the command's id when one could be read
    error: str


def read_lines(stream: BinaryIO, limit: int = MAX_LINE_BYTES) -> Iterator[bytes | int]:
    """Each line of `stream` (with its newline), or, for a line over `limit` bytes, its
    length: such a line is skipped chunk by chunk and never held whole."""
    while True:
        parts: list[bytes] = []
        size = 0
        while True:
            chunk = stream.readline(CHUNK)
            size += len(chunk)
            if size <= limit:
                parts.append(chunk)
            else:
                parts.clear()
            if not chunk or chunk.endswith(b"\n"):
                break
        if size == 0:
            return  # end of input
        yield b"".join(parts) if size <= limit else size


def _id_of(data: Any) -> int | None:
    cid = data.get("id") if isinstance(data, dict) else None
    return cid if isinstance(cid, int) and not isinstance(cid, bool) else None


def parse_command(line: bytes | int) -> Command | Rejected | None:
    """A command, why the line is not one, or None for a blank line."""
    if isinstance(line, int):
        return Rejected(
            None, f"a command line of {line} bytes: too long (at most {MAX_LINE_BYTES})"
        )
    line = line.strip()
    if not line:
        return None
    try:
        data = json.loads(line)
    except (ValueError, RecursionError) as e:
        return Rejected(None, str(Unreadable("command", f"not JSON ({str(e)[:200]})")))
    cmd = decode_command(data)
    if isinstance(cmd, Unreadable):
        return Rejected(_id_of(data), str(cmd))
    return cmd

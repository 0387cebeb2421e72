"""A page of one run's file by byte range: the complete lines of [start, end), so the monitor
pages a long train.log back to its first line without ever holding the whole file.

Read through `open_in` like every other read of a run's files (no symlink, no FIFO); at most
`max_bytes` are read, whatever the range asked for.
"""

from __future__ import annotations

import os
from typing import Any

from dflash_tui.agent.files import open_in

# The most one page reads, whatever was asked: its answer, JSON-escaped, must stay well under
# the contract's MAX_LINE_BYTES (a train.log of tracebacks escapes to ~1.3x its size).
PAGE_MAX_BYTES = 4 << 20


def read_page(
    folder: str, name: str, start: int | None, end: int | None, max_bytes: int
) -> dict[str, Any]:
    """{"text", "start", "end", "size"}: the whole lines within [start, end) of
    `folder/name`, at most `max_bytes` of them: those nearest `end` when only `end` is given
    (paging back), else those from `start` on. `start` in the answer is the offset of the
    first line given, `end` the byte after the last one; an empty page has start == end."""
    max_bytes = max(1, min(max_bytes, PAGE_MAX_BYTES))
    with os.fdopen(open_in(folder, name), "rb") as f:
        size = os.fstat(f.fileno()).st_size
        hi = size if end is None else max(0, min(end, size))
        if start is None:
            lo = max(0, hi - max_bytes)
        else:
            lo = max(0, min(start, hi))
            hi = min(hi, lo + max_bytes)
        f.seek(lo)
        data = f.read(hi - lo)
        first = 0
        if lo > 0:  # the range starts inside a line unless the byte before it ends one
            f.seek(lo - 1)
            if f.read(1) != b"\n":
                nl = data.find(b"\n")
                first = len(data) if nl < 0 else nl + 1
        # The end of the last whole line (0: none): an unfinished one is not a line yet.
        last = data.rfind(b"\n") + 1
        body = data[first:last] if last > first else b""
        page_start = lo + first if body else hi
        return {
            "text": body.decode("utf-8", "replace"),
            "start": page_start,
            "end": page_start + len(body),
            "size": size,
        }

"""telemetry.jsonl: the run's heartbeat history, bounded, kept in the run dir.

The trainer's heartbeat thread appends one heartbeat every TELEMETRY_INTERVAL_S. As entries
age they are thinned (every one for the last 10 minutes, one a minute for the last 6 hours,
one per 10 minutes before that; phase changes always kept), so a ten-day run keeps a few
thousand lines. It is the one source of history: the live monitor's look-back (GIL,
recompiles, allocator retries over the last minutes), offline diagnosis of a finished run,
and replay.

Thinning rewrites the file (temp file + rename): a follower sees it replaced and reads it
again from the start; readers keep entries in `now` order and drop ones they have.
"""

from __future__ import annotations

import dataclasses
import json
import os
import secrets
from pathlib import Path
from typing import Any

from trainer.contract.heartbeat import Heartbeat, parse_heartbeat_text
from trainer.contract.typed import Unreadable

TELEMETRY_INTERVAL_S = 5.0
# (age in seconds up to which, keep one entry per this many seconds)
TIERS = ((600.0, 0.0), (6 * 3600.0, 60.0), (float("inf"), 600.0))
COMPACT_EVERY = 240  # appends between two thinning passes


@dataclasses.dataclass(frozen=True)
class Entry:
    now: float
    phase: str
    text: str  # the heartbeat's JSON, one line


def thin(entries: list[Entry], now: float) -> list[Entry]:
    """The entries to keep at `now`, oldest first (pure: tested on its own)."""
    kept: list[Entry] = []
    last_kept_at: dict[int, float] = {}
    last_phase = None
    for e in entries:
        age = now - e.now
        tier = next(i for i, (upto, _) in enumerate(TIERS) if age <= upto)
        spacing = TIERS[tier][1]
        changed = e.phase != last_phase
        last_phase = e.phase
        prev = last_kept_at.get(tier)
        if changed or spacing == 0 or prev is None or e.now - prev >= spacing:
            kept.append(e)
            last_kept_at[tier] = e.now
    return kept


class TelemetryWriter:
    """Appends heartbeats; thins and rewrites the file every COMPACT_EVERY appends. Used by
    one thread (the heartbeat thread)."""

    def __init__(self, path: Path, interval_s: float = TELEMETRY_INTERVAL_S) -> None:
        self.path, self.interval_s = path, interval_s
        self.entries: list[Entry] = []
        self.last_at: float | None = None
        self._since_compact = 0

    def due(self, now: float) -> bool:
        return self.last_at is None or now - self.last_at >= self.interval_s

    def append(self, beat: dict[str, Any], force: bool = False) -> None:
        now = float(beat["now"])
        if not force and not self.due(now):
            return
        entry = Entry(now, str(beat.get("phase")), json.dumps(beat, sort_keys=True))
        self.entries.append(entry)
        self.last_at = now
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(entry.text + "\n")
        self._since_compact += 1
        if self._since_compact >= COMPACT_EVERY:
            self.compact(now)

    def compact(self, now: float) -> None:
        self.entries = thin(self.entries, now)
        tmp = self.path.with_name(f".{self.path.name}.{secrets.token_hex(4)}.tmp")
        with open(tmp, "w", encoding="utf-8") as f:
            f.writelines(e.text + "\n" for e in self.entries)
        os.replace(tmp, self.path)
        self._since_compact = 0


def parse_telemetry_line(text: str) -> Heartbeat | Unreadable:
    return parse_heartbeat_text(text, "telemetry.jsonl")


def read_telemetry(path: str | Path) -> tuple[list[Heartbeat], int]:
    """(heartbeats oldest first, lines skipped as unreadable)."""
    beats: dict[float, Heartbeat] = {}
    skipped = 0
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            for line in f:
                got = parse_telemetry_line(line)
                if isinstance(got, Unreadable):
                    skipped += 1
                else:
                    beats[got.now] = got
    except FileNotFoundError:
        return [], 0
    return [beats[t] for t in sorted(beats)], skipped

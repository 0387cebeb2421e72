"""Replay: a run's store as it was at one telemetry.jsonl entry (the pure part).

telemetry.jsonl (trainer/contract/telemetry.py) is the run's heartbeat history: one every
5 s, thinned as it ages. A `Recording` is that file with the run's metrics.jsonl, train.log
and its row in the runs list, each line decoded through the contract; a line that does not
decode (or names another run, or a time that is no time) is skipped and counted, never
fatal. `Recording.store_at(i)` builds a fresh `Store` whose clock is pinned to entry i's
`now` and gives it what had happened by then: the heartbeat history of the hour before (as
decoded), entry i as the heartbeat event, the metrics rows and log lines written by then,
and the process as alive (an entry before the last is a moment the run was running) or, at
the last entry, as the runs list says it ended. Every pane and every diagnosis rule then
reads it unchanged: the alerts are the rules evaluated at that moment.

What the run dir does not hold is not invented: the agent's NVML samples (utilisation,
power, clocks) are not recorded there, so a replay has no GPU samples; the trainer's own
memory per device is in each heartbeat (`memory_line`).
"""

from __future__ import annotations

import bisect
import dataclasses
import json
import math
import re
import time

from dflash_tui.fmt import duration
from dflash_tui.link.events import LinkStatus
from dflash_tui.state import HISTORY_MAX, HISTORY_WINDOW_S, Store
from trainer.contract.heartbeat import Heartbeat
from trainer.contract.protocol import (
    Follow,
    HeartbeatEvent,
    Hello,
    Liveness,
    RunInfo,
    RunsEvent,
)
from trainer.contract.records import MetricsRow, parse_metrics_line
from trainer.contract.steplines import parse_step_line
from trainer.contract.telemetry import parse_telemetry_line
from trainer.contract.typed import Unreadable

# How much of each file's end a replay reads (replay_source.py pages back through it): a
# heartbeat is 4-10 KB, so 16 MiB of telemetry is thousands of entries, a ten-day run's
# thinned history; train.log's last MiB is the step log's 5000 lines and the traceback.
TAIL_BYTES = {"telemetry.jsonl": 16 << 20, "metrics.jsonl": 4 << 20, "train.log": 1 << 20}
# A heartbeat's `now` outside this is no time this run could have written (1e400 is inf).
SANE_TIME = (0.0, 1e11)
REPLAY_STATE = "replay"  # the link state a replayed store shows: nothing here is live


class ReplayError(Exception):
    """One line: why there is nothing to replay (no such run, no telemetry, a bad --at)."""


@dataclasses.dataclass(frozen=True)
class Entry:
    beat: Heartbeat
    text: str  # the line as the trainer wrote it: the store decodes it again, as live


@dataclasses.dataclass
class Recording:
    run_id: str
    entries: list[Entry]  # oldest first, one per `now`
    metrics: list[MetricsRow]  # in file order
    log: list[str]  # train.log lines
    run: RunInfo | None = None  # the runs list's row: how it ended, for the last entry
    others: list[RunInfo] = dataclasses.field(default_factory=list)  # the other runs
    hello: Hello | None = None  # the agent the files came through
    run_dir: str | None = None
    skipped: int = 0  # lines of the three files that did not decode
    skipped_last: str | None = None  # why the last one did not
    cut: list[str] = dataclasses.field(default_factory=list)  # files only their end was read of
    target: str = "local"

    def __post_init__(self) -> None:
        self._times = [e.beat.now for e in self.entries]
        # The step each train.log line had reached: a line belongs to a moment once the
        # step line before it is at or below the moment's step.
        self._log_steps: list[int] = []
        step = -1
        for text in self.log:
            parsed = parse_step_line(text)
            if parsed is not None:
                step = parsed.step
            self._log_steps.append(step)

    # -- where -------------------------------------------------------------------------
    @property
    def end(self) -> float:
        return self._times[-1]

    def index_at(self, t: float) -> int:
        """The newest entry written at or before `t` (the first one for an earlier `t`)."""
        return max(0, bisect.bisect_right(self._times, t) - 1)

    def step_minutes(self, index: int, minutes: float) -> int:
        """The entry `minutes` (negative: back) from entry `index`, within the recording."""
        t = self._times[index] + minutes * 60.0
        if minutes < 0:
            return self.index_at(t)
        i = bisect.bisect_left(self._times, t)
        return min(i, len(self._times) - 1)

    # -- the store at a moment ---------------------------------------------------------
    def store_at(self, index: int) -> Store:
        entry = self.entries[index]
        now = entry.beat.now
        s = Store(self.target, clock=lambda: now)
        s.apply(LinkStatus(REPLAY_STATE, f"telemetry.jsonl entry {index + 1}", t=now))
        if self.hello is not None:
            s.hello = self.hello
        s.apply(Follow(run_id=self.run_id, run_dir=self.run_dir, t=now))
        last = index == len(self.entries) - 1
        for event in self._process_at(last, now):
            s.apply(event)
        # The look-back the rules read (GIL, recompiles, eval history): the hour before, as
        # the live store keeps it. Decoded once, when read: decoding ~700 entries again on
        # every key would take a second.
        window = self.entries[self.index_at(now - HISTORY_WINDOW_S) : index]
        s.heartbeats = [e.beat for e in window[-HISTORY_MAX:]]
        s.apply(HeartbeatEvent(run_id=self.run_id, data=json.loads(entry.text), t=now))
        # Filled directly, not line by line: a week's metrics would make every key slow.
        rows = [r for r in self.metrics if r.time <= now]
        s.metrics.extend(rows[-(s.metrics.maxlen or len(rows)) :])
        upto = len(self.log) if last else bisect.bisect_right(self._log_steps, entry.beat.step)
        for text in self.log[max(0, upto - (s.log_lines.maxlen or upto)) : upto]:
            s.log_lines.append(text)
            line = parse_step_line(text)
            if line is not None:
                s.step_lines.append(line)
        s.log_total = upto
        s.last_step_line_at = entry.beat.last_step_at if s.step_lines else None
        s.malformed += self.skipped
        s.malformed_last = s.malformed_last or self.skipped_last
        return s

    def _process_at(self, last: bool, now: float) -> list[RunsEvent | Liveness]:
        """The process and the runs list as they were: at the last entry as the agent says
        they are now (how it ended); at an earlier one the run was running (its heartbeat
        thread wrote that entry), so its row says nothing of how it ended."""
        run = self.run
        if not last and run is not None:
            run = dataclasses.replace(run, alive=True, exit=None, outcome=None)
        runs = [*self.others, *([run] if run is not None else [])]
        if run is None and last:  # no word from the agent: the heartbeat says what it can
            return [RunsEvent(runs=runs, t=now)]
        alive = run.alive if run is not None and last else True
        exit_record = run.exit if run is not None and last else None
        return [
            RunsEvent(runs=runs, alive_run=self.run_id if alive else None, t=now),
            Liveness(run_id=self.run_id, alive=alive, exit=exit_record, t=now),
        ]

    # -- what the replay bar says --------------------------------------------------------
    def when(self, index: int) -> str:
        """`12:03:00 (-5m12s before the end)`, the end being the last entry."""
        t = self._times[index]
        before = self.end - t
        clock = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t))
        return clock + (" (the end)" if before <= 0 else f" (-{duration(before)} before the end)")


def memory_line(beat: Heartbeat) -> str:
    """The trainer's own memory per device at that entry (`cuda:0 41.2G (peak 44.0G)`):
    the run dir's only memory record; NVML's samples are not kept there."""
    parts = []
    for device, m in sorted(beat.memory.items()):
        parts.append(f"{device} {m.allocated / 2**30:.1f}G (peak {m.peak / 2**30:.1f}G)")
    return " · ".join(parts) if parts else "no memory recorded"


# -- reading the files -----------------------------------------------------------------------
def _sane_time(t: float) -> bool:
    return math.isfinite(t) and SANE_TIME[0] < t < SANE_TIME[1]


def _lines(text: str) -> list[str]:
    return text.splitlines()


def recording(
    run_id: str,
    telemetry: str,
    metrics: str = "",
    log: str = "",
    cut: tuple[str, ...] = (),
    run: RunInfo | None = None,
    others: list[RunInfo] | None = None,
    hello: Hello | None = None,
    run_dir: str | None = None,
    target: str = "local",
) -> Recording:
    """The three files' texts (whole lines) decoded through the contract; `cut`: files whose
    oldest lines were not read. Raises ReplayError when no telemetry line of this run
    decodes."""
    skipped, why = 0, None
    by_time: dict[float, Entry] = {}
    for text in _lines(telemetry):
        if not text.strip():
            continue
        got = parse_telemetry_line(text)
        if isinstance(got, Unreadable):
            skipped, why = skipped + 1, str(got)
        elif got.run_id != run_id:
            skipped, why = skipped + 1, f"telemetry.jsonl: a heartbeat of run {got.run_id!r}"
        elif not _sane_time(got.now):
            skipped, why = skipped + 1, f"telemetry.jsonl: now = {got.now!r} is no time"
        else:
            by_time[got.now] = Entry(got, text)  # a rewrite repeats entries: one per `now`
    if not by_time:
        raise ReplayError(
            f"run {run_id}: no telemetry to replay"
            + (f" ({skipped} lines unreadable; the last: {why})" if skipped else "")
        )
    rows = []
    for text in _lines(metrics):
        if not text.strip():
            continue
        row = parse_metrics_line(text)
        if isinstance(row, Unreadable):
            skipped, why = skipped + 1, str(row)
        else:
            rows.append(row)
    return Recording(
        run_id=run_id,
        entries=[by_time[t] for t in sorted(by_time)],
        metrics=rows,
        log=_lines(log),
        skipped=skipped,
        skipped_last=why,
        cut=list(cut),
        run=run,
        others=list(others or []),
        hello=hello,
        run_dir=run_dir,
        target=target,
    )


# -- --at ------------------------------------------------------------------------------------
_RELATIVE = re.compile(r"-(?:(\d+)h)?(?:(\d+)m)?(?:(\d+(?:\.\d+)?)s?)?")
_CLOCK = re.compile(r"(\d{1,2}):(\d{2})(?::(\d{2}))?")


def parse_at(text: str, end: float) -> float:
    """The time `--at` names: `end`, `-5m`, `-1h30m`, `-90s`/`-90` before the last entry, or
    a clock time `12:03[:00]` (local) on the last entry's day, the day before when that is
    after the end. ReplayError names a text that is none of these."""
    text = text.strip()
    if text in ("end", "e", ""):
        return end
    m = _RELATIVE.fullmatch(text)
    if m and any(m.groups()):
        h, mi, s = (float(g) if g else 0.0 for g in m.groups())
        return end - (h * 3600 + mi * 60 + s)
    m = _CLOCK.fullmatch(text)
    if m:
        hh, mm, ss = int(m.group(1)), int(m.group(2)), int(m.group(3) or 0)
        if hh < 24 and mm < 60 and ss < 60:
            day = time.localtime(end)
            t = time.mktime((day.tm_year, day.tm_mon, day.tm_mday, hh, mm, ss, 0, 0, -1))
            return t - 86400 if t > end + 1 else t
    raise ReplayError(
        f"--at {text!r}: not a time (give -5m, -1h30m, -90s before the end, a clock time "
        "12:03:00, or end)"
    )

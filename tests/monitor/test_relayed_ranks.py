"""Every rank of a job over two hosts, on the job's host: the writer's heartbeat.json relays
the other host's ranks (`ranks`), recorded from a real 2-host run on loopback
(tests/fixtures/ranks/two-hosts, tests/infra/record_relayed_ranks.py). The monitor on host a
holds ranks 0-2 from their own files and 3-5 from the relay; a rank's own file wins; a bad
relayed entry spoils only its own rank, said once; the ranks pane marks the relayed rows."""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import io
import math
import time
import typing
from typing import Any

from monitor_helpers import typed_event
from rank_fixtures import events, now_of, rank_store, recorded
from rich.console import Console

from dflash_tui import ranks_view
from dflash_tui.app import DFlashApp
from dflash_tui.diagnosis import diagnose
from dflash_tui.state import Store
from dflash_tui.targets import Target
from dflash_tui.widgets.ranks import RanksPane
from trainer.contract.heartbeat import Heartbeat, parse_heartbeat
from trainer.contract.typed import decode

NAME = "two-hosts"
HOST_A, HOST_B = [0, 1, 2], [3, 4, 5]


def test_the_job_host_holds_every_rank_those_of_the_other_host_relayed() -> None:
    s = rank_store(NAME)
    assert sorted(s.ranks) == HOST_A + HOST_B
    assert [r for r, seen in sorted(s.ranks.items()) if seen.relayed] == HOST_B
    assert s.malformed == 0, s.malformed_last
    job, _ = recorded(NAME)
    for r in HOST_B:
        beat = s.ranks[r].beat
        assert beat is not None and beat.rank == r and beat.phase == "training"
        assert beat.stages_ms and beat.tok_s > 0
        assert s.ranks[r].received == job["ranks"][str(r)]["received"]
    # One clock: the relayed ranks' lag counts from when they reached the writer, so none
    # of them looks behind (the recording caught every rank beating).
    assert max(ranks_view.lags(s.ranks).values()) < 1.0, ranks_view.lags(s.ranks)
    lines = ranks_view.lines(s.ranks)
    assert [ln.split(" (")[0] for ln in lines] == [f"rank {r}" for r in HOST_A + HOST_B]
    for r, line in zip(HOST_A + HOST_B, lines, strict=True):
        assert line.endswith(", relayed by the writer") == (r in HOST_B), line
        assert "ms compute" in line, line
    as_json = ranks_view.to_json(s.ranks)
    assert [x["relayed"] for x in as_json] == [False] * 3 + [True] * 3
    assert as_json[5]["heartbeat"]["role"] == "drafter" and as_json[5]["heartbeat"]["index"] == 1
    # No rule reads a relayed rank as silent or failed.
    findings = diagnose(s, now=now_of(NAME))
    assert not [f for f in findings if "silent" in f.title or "failed" in f.title], findings


def _heartbeat_event(job: dict[str, Any]) -> Any:
    return typed_event({"type": "heartbeat", "t": job["now"], "run_id": job["run_id"], "data": job})


def test_a_ranks_own_file_wins_over_its_relay() -> None:
    job, ranks = recorded(NAME)
    s = rank_store(NAME)
    # Host a's rank 0 relayed too (as a writer that relayed every rank would): its own
    # file is what the monitor keeps.
    other = copy.deepcopy(job)
    relayed0 = {**ranks[0], "step": 99999}
    other["ranks"]["0"] = {"received": job["now"], "beat": relayed0}
    s.apply(_heartbeat_event(other))
    seen = s.ranks[0]
    assert not seen.relayed and seen.beat is not None and seen.beat.step == ranks[0]["step"]


def test_a_bad_relayed_entry_spoils_only_its_rank_and_is_counted_once() -> None:
    job, _ = recorded(NAME)
    s = Store("cpu-box", clock=lambda: job["now"])
    for e in events(NAME):
        s.apply(typed_event(e))
    bad = copy.deepcopy(job)
    bad["now"] += 1
    bad["ranks"]["3"]["beat"]["rank"] = 4  # claims another rank's place
    bad["ranks"]["4"]["beat"]["tok_s"] = math.nan  # not a rate (json.dumps writes NaN)
    bad["ranks"]["5"]["received"] = "soon"
    bad["ranks"]["../x"] = {"received": 1.0, "beat": {}}  # not a rank: ignored
    before = s.malformed
    s.apply(_heartbeat_event(bad))
    assert s.malformed == before + 3, s.malformed_last
    assert s.ranks[3].error == "says it is rank 4"
    assert "tok_s nan: not a rate" in (s.ranks[4].error or "")
    assert s.ranks[5].error == "no time it was received"
    # The last good beat of each stays beside the reason; the heartbeat itself is read.
    assert all(s.ranks[r].beat is not None for r in HOST_B)
    assert s.heartbeat is not None and s.heartbeat.now == bad["now"]
    again = copy.deepcopy(bad)
    again["now"] += 1
    s.apply(_heartbeat_event(again))
    assert s.malformed == before + 3  # the same reasons: not counted again
    said = ranks_view.lines(s.ranks)
    assert said[3].endswith("relayed by the writer (its relay now: says it is rank 4)"), said


def test_a_heartbeat_without_ranks_reads_as_before() -> None:
    job, _ = recorded(NAME)
    without = {k: v for k, v in job.items() if k != "ranks"}
    hb = parse_heartbeat(without)
    assert isinstance(hb, Heartbeat) and hb.ranks == {}
    with_ranks = parse_heartbeat(job)
    assert isinstance(with_ranks, Heartbeat) and sorted(with_ranks.ranks) == ["3", "4", "5"]


def test_a_reader_from_before_ranks_reads_the_writers_heartbeat() -> None:
    """Optional under schema 2: a reader whose Heartbeat has no `ranks` reads the recorded
    writer's heartbeat.json as it read any other (typed.decode ignores a key it lacks)."""
    hints = typing.get_type_hints(Heartbeat)
    fields = [
        (f.name, hints[f.name],
         dataclasses.field(default=f.default, default_factory=f.default_factory))
        for f in dataclasses.fields(Heartbeat)
        if f.name != "ranks"
    ]  # fmt: skip
    old_heartbeat = dataclasses.make_dataclass("OldHeartbeat", fields)
    job, _ = recorded(NAME)
    old = decode(old_heartbeat, job)
    assert not hasattr(old, "ranks") and old.step == job["step"]
    new = dataclasses.asdict(decode(Heartbeat, job))
    assert dataclasses.asdict(old) == {k: v for k, v in new.items() if k != "ranks"}


def _plain(widget: Any) -> str:
    console = Console(width=158, record=True, file=io.StringIO(), color_system=None)
    console.print(widget.content)
    return console.export_text()


def test_the_ranks_pane_shows_six_rows_the_other_hosts_marked_relayed() -> None:
    target = Target(name="cpu-box", kind="ssh", host="cpu-box")
    connected = {"type": "link", "state": "connected", "target": "cpu-box", "version": 3}

    async def go() -> str:
        app = DFlashApp(target, connect=False, clock=lambda: now_of(NAME))
        async with app.run_test(size=(160, 48)) as pilot:
            app.feed(typed_event({**connected, "t": now_of(NAME)}))
            for e in events(NAME):
                app.feed(typed_event(e))
            pane = app.query_one(RanksPane)
            deadline = time.monotonic() + 5
            while "drafter 1" not in _plain(pane) and time.monotonic() < deadline:
                await pilot.pause(0.1)
            return _plain(pane)

    text = asyncio.run(go())
    rows = {int(ln.split()[0]): ln for ln in text.splitlines() if ln.strip()[:1].isdigit()}
    assert sorted(rows) == HOST_A + HOST_B, text
    for r, row in rows.items():
        assert row.rstrip().endswith("relayed") == (r in HOST_B), row

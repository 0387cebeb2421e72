"""Hostile and broken input, end to end: generated step lines, heartbeats, metrics rows and
exit/launch/config records written into a real run dir, followed by the real agent (a local
one), through the real link into a store, and rendered by every view. The link must never
die or reconnect, and no view may raise.

The run dir starts as a real one (recorded on an H200: tests/fixtures/rundirs/h200-schema2);
each example mutates one of its files the way a torn write, a foreign writer or a hostile
one could. Examples per class: HYPOTHESIS_PROFILE=dev runs 10,000 (the figures in README's
reliability section); CI runs the `ci` profile (tests/conftest.py), with a fixed seed.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from monitor_helpers import Remote

from dflash_tui.commands.runs import format_runs
from dflash_tui.diagnosis import diagnose
from dflash_tui.headless import status_line
from dflash_tui.targets import resolve_target
from trainer.contract.protocol import Kill, ListRuns

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "rundirs" / "h200-schema2"
RUN_ID = "20261201-052645-tiny-gpu-2735"
SEED_LINE = (
    "[479m] step=876 loss=1.3377 acc=0.120 streak=1.5 lr=4.40e-04 noise=0.0366 | "
    "tgt=0.35b/s dft=0.35b/s (14.2Ktok/s) | q_pre=[50, 16, 2, 1, 10] q_hs=[60] | "
    "epoch~0.17 ETA=11.4d"
)
NASTY = [
    "..", "nan", "-inf", "1e999", "9" * 5000, "", " ", "[", "]", "\x00", "\x1b[2J", "\r",
    "\u202e", "ü", "[" * 1000, "{}", "null", "true", "-0", "0x10", "1_000",
]  # fmt: skip


class Rig:
    """A real agent following one run dir, a real link and store on a thread of their own."""

    def __init__(self, root: Path) -> None:
        self.run_dir = root / "runs" / RUN_ID
        shutil.copytree(FIXTURE / RUN_ID, self.run_dir)
        target = resolve_target(
            "local",
            run_root=str(root / "runs"),
            remote_dir=str(root / "remote"),
            python=sys.executable,
        )
        self.remote = Remote(target)
        self.remote.wait(lambda s: s.heartbeat is not None and s.runs_received, 60, "settled")

    def received(self, kinds: tuple[str, ...], file: str | None = None) -> int:
        with self.remote._lock:
            return sum(
                1
                for e in self.remote.events
                if e.get("type") in kinds and (file is None or e.get("file") == file)
            )

    def append(self, name: str, text: str) -> None:
        """Append one line, then wait until the agent has streamed it back."""
        before = self.received(("line",), name)
        with open(self.run_dir / name, "a", encoding="utf-8", errors="surrogatepass") as f:
            f.write(text + "\n")
        self.remote.wait(lambda s: self.received(("line",), name) > before, 30, f"a {name} line")

    def replace(self, name: str, raw: bytes) -> None:
        """Replace a file atomically, as a writer does."""
        tmp = self.run_dir / f".{name}.tmp"
        tmp.write_bytes(raw)
        os.replace(tmp, self.run_dir / name)

    def views(self) -> None:
        """Every view over the store as it is now; none may raise."""
        s = self.remote.store
        with self.remote._lock:
            findings = diagnose(s)
            status_line(s, findings, unicode=True)
            status_line(s, findings, unicode=False, width=80)
            json.dumps(s.to_json(), default=str)
            format_runs(list(s.runs))

    def alive(self) -> None:
        link = self.remote.link
        assert link.state == "connected", link.state
        assert link.sessions == 1, "the link reconnected"


@pytest.fixture(scope="module")
def rig(tmp_path_factory: pytest.TempPathFactory) -> Any:
    r = Rig(tmp_path_factory.mktemp("hostile"))
    yield r
    r.alive()
    r.remote.close()


# -- generators ------------------------------------------------------------------------------
json_leaf = st.one_of(
    st.none(), st.booleans(), st.integers(), st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=40), st.sampled_from(NASTY),
)  # fmt: skip
json_value = st.recursive(
    json_leaf,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=10), inner, max_size=4)
    ),
    max_leaves=12,
)


def paths(data: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every path into a JSON value: the places a mutation may hit."""
    out = [prefix]
    if isinstance(data, dict):
        for k, v in data.items():
            out += paths(v, (*prefix, k))
    elif isinstance(data, list):
        for i, v in enumerate(data):
            out += paths(v, (*prefix, i))
    return out


@st.composite
def mutated(draw: st.DrawFn, seed: Any) -> Any:
    """`seed` with 1-4 places replaced by any JSON value, deleted, or given a new key."""
    data = json.loads(json.dumps(seed))
    for _ in range(draw(st.integers(1, 4))):
        where = draw(st.sampled_from(paths(data)))
        if not where:
            return draw(json_value)  # the whole document replaced
        *parent_path, key = where
        parent = data
        for p in parent_path:
            parent = parent[p]
        action = draw(st.sampled_from(["replace", "delete", "add"]))
        if action == "delete" and isinstance(parent, dict):
            del parent[key]
        elif action == "add" and isinstance(parent, dict):
            parent[draw(st.text(max_size=12))] = draw(json_value)
        else:
            parent[key] = draw(json_value)
    return data


@st.composite
def step_lines(draw: st.DrawFn) -> str:
    """The operators' step line with 1-5 edits: a field's value replaced, characters cut,
    inserted or changed; or any text at all."""
    if draw(st.integers(0, 9)) == 0:
        return draw(st.text(max_size=300).map(lambda t: t.replace("\n", " ")))
    line = SEED_LINE
    for _ in range(draw(st.integers(1, 5))):
        i = draw(st.integers(0, len(line)))
        kind = draw(st.sampled_from(["value", "cut", "insert", "change"]))
        if kind == "value":
            eq = line.find("=", i)
            if eq >= 0:
                end = min([j for j in (line.find(" ", eq), len(line)) if j >= 0])
                line = line[: eq + 1] + draw(st.sampled_from(NASTY)) + line[end:]
        elif kind == "cut":
            line = line[:i] + line[i + draw(st.integers(1, 20)) :]
        elif kind == "insert":
            line = line[:i] + draw(st.sampled_from([*NASTY, "x", "0", "."])) + line[i:]
        else:
            line = line[:i] + draw(st.characters()) + line[i + 1 :]
    return line.replace("\n", " ")


def file_bytes(data: Any) -> st.SearchStrategy[bytes]:
    """A record file: the mutated JSON, or torn, or not JSON at all."""
    text = json.dumps(data, default=str)
    return st.one_of(
        st.just(text.encode()),
        st.integers(0, len(text)).map(lambda n: text[:n].encode()),  # a torn write
        st.binary(max_size=200),
        st.just(b"[" * 100_000),
    )


def seed_json(name: str) -> Any:
    return json.loads((FIXTURE / RUN_ID / name).read_text())


def seed_metrics_row() -> Any:
    return json.loads((FIXTURE / RUN_ID / "metrics.jsonl").read_text().splitlines()[-1])


SETTINGS = {"deadline": None, "suppress_health_check": list(HealthCheck)}


# -- the classes -----------------------------------------------------------------------------
@settings(**SETTINGS)
@given(line=step_lines())
def test_step_lines(rig: Rig, line: str) -> None:
    rig.append("train.log", line)
    rig.views()
    rig.alive()


@settings(**SETTINGS)
@given(row=mutated(seed_metrics_row()))
def test_metrics_rows(rig: Rig, row: Any) -> None:
    rig.append("metrics.jsonl", json.dumps(row, default=str))
    rig.views()
    rig.alive()


@settings(**SETTINGS)
@given(raw=mutated(seed_json("heartbeat.json")).flatmap(file_bytes))
def test_heartbeats(rig: Rig, raw: bytes) -> None:
    kinds = ("heartbeat", "heartbeat_error")
    before = rig.received(kinds)
    rig.replace("heartbeat.json", raw)
    # A file equal to the last one in size and time may not be seen as a change: give it the
    # time the agent needs, then go on.
    deadline = time.monotonic() + 2.0
    while rig.received(kinds) == before and time.monotonic() < deadline:
        time.sleep(0.005)
    rig.views()
    rig.alive()


@settings(**SETTINGS)
@given(
    name=st.sampled_from(["exit.json", "launch.json", "config.json"]),
    data=st.data(),
)
def test_exit_launch_and_config_records(rig: Rig, name: str, data: st.DataObject) -> None:
    raw = data.draw(mutated(seed_json(name)).flatmap(file_bytes))
    rig.replace(name, raw)
    rig.remote.request(ListRuns())  # the runs list reads them again, through the contract
    rig.views()
    rig.alive()


def test_a_20_mb_line_and_control_bytes_cost_one_cut_line(rig: Rig) -> None:
    """One 20 MB line (and one of 11 MB of control bytes, JSON-escaped six-fold: the line
    that used to kill the link) arrive cut, marked, and the next line after them as usual."""
    rig.append("train.log", "x" * (20 << 20))
    rig.append("train.log", "\x01" * (11 << 20))
    rig.append("train.log", SEED_LINE)
    s = rig.remote.store
    with rig.remote._lock:
        cut = [ln for ln in s.log_lines if "cut at" in ln]
        last = s.log_lines[-1]
    assert len(cut) >= 2 and all(len(ln) < 100_000 for ln in cut)
    assert "[line of 20,971,520 bytes cut at 65,536]" in cut[-2]
    assert last == SEED_LINE and s.step_lines[-1].step == 876
    rig.views()
    rig.alive()


def test_the_tui_renders_everything_the_agent_sent(rig: Rig) -> None:
    """Every event of the classes above, fed in order to the TUI (Pilot), every pane redrawn
    every 50 events, and the runs screen opened on the last runs list: nothing raises."""
    import asyncio

    from monitor_helpers import typed_event

    from dflash_tui.app import DFlashApp
    from dflash_tui.targets import Target

    with rig.remote._lock:
        events = list(rig.remote.events)

    async def go() -> None:
        app = DFlashApp(Target(name="local", kind="local"), theme_name="dark", connect=False)
        async with app.run_test(size=(120, 40)) as pilot:
            for i, e in enumerate(events):
                app.feed(typed_event(e))
                if i % 50 == 0:
                    app.redraw(force=True)
                    await pilot.pause()
            app.redraw(force=True)
            await pilot.press("l")
            await pilot.pause(0.2)
            await pilot.press("escape")
            await pilot.pause(0.1)
            assert app.is_running

    asyncio.run(go())


def test_the_bad_inputs_were_counted_not_fatal(rig: Rig) -> None:
    """After every class above: the malformed rows and heartbeats were counted, the last
    good heartbeat kept, and the link never reconnected."""
    s = rig.remote.store
    assert s.malformed > 0 and s.malformed_last
    assert s.heartbeat is not None  # the last good one
    rig.alive()


def test_a_live_run_streams_on_past_malformed_and_huge_lines(remote_factory, local_target):
    """A real trainer, launched through the agent: malformed step lines, metrics rows that
    are not rows, and a 20 MB line appended to its files while it trains. The monitor keeps
    streaming its good lines, shows the skip count, and the link never reconnects."""
    from test_control_local import deploy, launch

    r = remote_factory(local_target)
    deploy(r)
    run_id = launch(r, "train.max_steps=100000", "train.log_every=2")["run_id"]
    r.wait(lambda s: len(s.step_lines) >= 2, 90, "step lines")
    run_dir = Path(local_target.remote_dir) / "runs" / run_id
    with open(run_dir / "train.log", "a") as f:
        f.write(SEED_LINE.replace("loss=1.3377", "loss=..") + "\n")
        f.write("\x1b[2J" * 10 + "\n")
        f.write("y" * (20 << 20) + "\n")
    with open(run_dir / "metrics.jsonl", "a") as f:
        f.write('{"step": "seven"}\n[1]\n' + "[" * 100_000 + "\n")
    step = r.store.step_lines[-1].step
    r.wait(lambda s: s.step_lines[-1].step >= step + 6, 90, "good step lines after the bad")
    r.wait(lambda s: s.malformed >= 3, 30, "the bad rows counted")
    s = r.store
    assert any("[line of 20,971,520 bytes cut at 65,536]" in ln for ln in s.log_lines)
    assert r.link.sessions == 1 and r.link.state == "connected"
    line = status_line(s, diagnose(s), unicode=False)
    assert "malformed lines skipped" in line and "training" in line
    r.request(Kill(timeout_s=30, drain_timeout_s=5))


def test_a_link_that_breaks_restarts_and_says_so(tmp_path, monkeypatch):
    """Whatever ends a session (here: an answer longer than the stream's line limit, which
    asyncio raises as ValueError), the link reconnects, the store hears why, and the next
    request is answered."""
    from dflash_tui.link.link import LinkError
    from dflash_tui.link.transport import LocalTransport
    from trainer.contract.protocol import Ping, ReadFile

    monkeypatch.setattr(LocalTransport, "READ_LIMIT", 64 << 10)
    r = Rig(tmp_path)
    try:
        (r.run_dir / "big.txt").write_text("b" * (256 << 10))
        with pytest.raises(LinkError, match=r"connection lost|link error"):
            r.remote.request(ReadFile(run_id=RUN_ID, name="big.txt"), timeout=30)
        r.remote.wait(lambda s: s.link.sessions >= 2 and s.link.state == "connected", 60, "back")
        states = [e for e in r.remote.events if e.get("type") == "link"]
        assert any("link error: ValueError" in str(e.get("detail")) for e in states), states
        assert r.remote.request(Ping(), timeout=10)["pong"] > 0
    finally:
        r.remote.close()

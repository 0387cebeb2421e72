"""The typed boundary: what the link decodes, what a malformed line costs (a count, never the
link or a view), and the one command path the CLI and the TUI share."""

from __future__ import annotations

import asyncio
import copy
import io
import json
from typing import Any

from app_scenarios import NOW, RUN, healthy
from monitor_helpers import typed_event
from rich.console import Console
from test_diagnosis import Clock, events, hb, of_type

from dflash_tui import cli
from dflash_tui.app import DFlashApp
from dflash_tui.commands import actions
from dflash_tui.diagnosis import diagnose
from dflash_tui.headless import status_line
from dflash_tui.link.events import LinkStatus, SinkEvent, event_json
from dflash_tui.link.link import Link
from dflash_tui.state import Store
from dflash_tui.targets import Target
from dflash_tui.widgets.alerts import AlertsPane
from dflash_tui.widgets.gpus import GpuPane
from dflash_tui.widgets.header import StatusBar
from dflash_tui.widgets.heartbeat import HeartbeatPane
from dflash_tui.widgets.queues import QueuePane
from trainer.contract.protocol import (
    COMMANDS,
    Command,
    Hello,
    Kill,
    Restart,
    decode_command,
    decode_event,
    decode_event_line,
)
from trainer.contract.typed import Unreadable

TARGET = Target(name="gpu-box", kind="ssh", host="gpu-box")
SIZE = (160, 48)


def plain(widget: Any) -> str:
    console = Console(width=158, record=True, file=io.StringIO(), color_system=None)
    console.print(widget.content)
    return console.export_text()


# -- malformed input -------------------------------------------------------------------------
def malformed(evs: list[dict[str, Any]]) -> list[SinkEvent]:
    """Five bad things after a healthy stream: a heartbeat whose queues are a list, a line
    that is not JSON, an unknown event type, a metrics row with a string step, a torn
    telemetry line."""
    bad_hb = copy.deepcopy(of_type(evs, "heartbeat")[-1])
    bad_hb["data"]["queues"] = [1]
    bad_hb["data"]["step"] += 100

    def line(file: str, text: str) -> SinkEvent:
        run = bad_hb["run_id"]
        e = {"type": "line", "t": NOW, "run_id": run, "file": file, "offset": 0, "end": 0}
        return typed_event({**e, "text": text})

    return [
        typed_event(bad_hb),
        decode_event_line(b"Welcome to Ubuntu 24.04 {"),
        decode_event({"type": "gpu_v2", "t": NOW}),
        line("metrics.jsonl", '{"step": "x"}'),
        line("telemetry.jsonl", '{"schema": 2, "run_id": "r'),
    ]


def test_malformed_lines_are_counted_and_the_last_good_heartbeat_kept() -> None:
    evs = events("healthy_gpu.jsonl")
    s = Store("gpu-box", clock=Clock(NOW))
    for e in evs:
        s.apply(typed_event(e))
    good = s.heartbeat
    assert good is not None and s.malformed == 0
    before = diagnose(s, NOW)
    bad = malformed(evs)
    assert sum(isinstance(e, Unreadable) for e in bad) == 2  # at the link: not JSON, unknown
    for e in bad:
        s.apply(e)
    assert s.malformed == 5
    assert (s.malformed_last or "").startswith("telemetry.jsonl unreadable: not JSON")
    assert s.heartbeat is good and s.heartbeat.step == hb(evs)["step"]  # the last good one
    assert s.heartbeat_error == "heartbeat unreadable: queues: expected an object, got list"
    assert len(s.metrics) == 3 and len(s.heartbeats) == 1
    # every view still works, and the unreadable heartbeat is named (issue 33), nothing else
    assert before == []
    assert [(f.code, f.title) for f in diagnose(s, NOW)] == [
        (
            "heartbeat_unreadable",
            f"heartbeat.json of {s.run_id} is unreadable: queues: expected an object, got list",
        )
    ]
    line = status_line(s, [], now=NOW)
    assert "step 20482" in line and "[idle] | 5 malformed lines skipped | step" in line
    snap = s.to_json(NOW)
    assert snap["malformed"] == 5 and snap["heartbeat_error"].startswith("heartbeat unreadable")
    json.dumps(snap)
    assert [event_json(e)["type"] for e in bad[1:3]] == ["unreadable", "unreadable"]


def test_malformed_lines_in_the_tui() -> None:
    async def go() -> None:
        app = DFlashApp(TARGET, theme_name="dark", connect=False, clock=lambda: NOW)
        async with app.run_test(size=SIZE) as pilot:
            evs = healthy()
            for e in evs:
                app.feed(typed_event(e))
            bad = copy.deepcopy(of_type(evs, "heartbeat")[-1])
            bad["data"]["queues"] = [1]
            app.feed(typed_event(bad))
            app.feed(decode_event_line(b"not json"))
            app.feed(decode_event({"type": "bogus"}))
            app.redraw(force=True)  # not the coalescing timer's 0.25 s, late on a busy machine
            await pilot.pause(0.4)
            assert "3 malformed lines skipped" in plain(app.query_one(StatusBar))
            pane = plain(app.query_one(HeartbeatPane))
            assert "training for 7h49m" in pane and "step 876" in pane  # the last good one
            assert "heartbeat unreadable: queues: expected an object" in pane
            assert "50/64" in plain(app.query_one(QueuePane))
            assert "/140G" in plain(app.query_one(GpuPane))
            alerts = plain(app.query_one(AlertsPane))  # named, the only finding (issue 33)
            assert alerts.startswith("● warning: heartbeat.json of ") and alerts.count("●") == 1
            assert "is unreadable: queues: expected an object, got list" in alerts

    asyncio.run(go())


class FakeAgent:
    """An agent channel that says these lines, then closes."""

    def __init__(self, lines: list[bytes]) -> None:
        self.lines = list(lines)
        self.written: list[dict[str, Any]] = []

    async def readline(self) -> bytes:
        await asyncio.sleep(0)
        return self.lines.pop(0) if self.lines else b""

    async def write(self, data: bytes) -> None:
        self.written.append(json.loads(data))

    async def stderr_tail(self) -> str:
        return ""


class NoTransport:
    def describe(self) -> str:
        return "fake"


def test_the_link_survives_bad_lines_and_a_sink_that_trips() -> None:
    hello = {"type": "hello", "t": NOW, "version": 2, "pid": 1, "host": "h"}
    follow = {"type": "follow", "t": NOW, "run_id": RUN}
    log = {"type": "log", "t": NOW, "level": "info", "message": "the sink trips on this"}
    lines = [
        b"Last login: Mon Dec  1 on pts/0\n",  # shell noise before the agent speaks
        json.dumps(hello).encode(),
        b"{not json",
        json.dumps({"type": "nope", "t": NOW}).encode(),
        json.dumps({"type": "follow", "t": NOW, "run_id": 5}).encode(),  # a bad field
        json.dumps(log).encode(),
        json.dumps(follow).encode(),
    ]
    got: list[SinkEvent] = []

    def sink(event: SinkEvent) -> None:
        if getattr(event, "message", None) == log["message"]:
            raise RuntimeError("a bug in a view")
        got.append(event)

    link = Link(TARGET, sink, transport=NoTransport())
    agent = FakeAgent(lines)
    reason = asyncio.run(link._session(agent))
    assert reason == "agent channel closed"  # it read to the end
    kinds = [type(e).__name__ for e in got]
    assert kinds == [
        "Hello",
        "LinkStatus",
        "Unreadable",
        "Unreadable",
        "Unreadable",
        "Unreadable",  # the event the sink tripped on, as what it could not apply
        "Follow",
    ]
    unreadable = [str(e) for e in got if isinstance(e, Unreadable)]
    assert unreadable[0].startswith("event unreadable: not JSON")
    assert unreadable[1] == "event unreadable: unknown event 'nope'"
    assert unreadable[2] == "follow event unreadable: follow.run_id: expected a string, got int"
    assert unreadable[3] == "Log unreadable: could not be applied: RuntimeError: a bug in a view"
    assert isinstance(got[0], Hello) and isinstance(got[1], LinkStatus)
    assert got[1].state == "connected" and got[1].version == 2
    assert link.run_id == RUN
    assert agent.written[0]["cmd"] == "follow" and agent.written[0]["run_id"] == "latest"


# -- commands --------------------------------------------------------------------------------
def test_every_command_says_its_own_name() -> None:
    """`cmd` is the registry's name, even for commands with a `name` field (Launch: the run's,
    ReadFile: the file's), and every command survives the agent's decoder."""
    from trainer.contract.protocol import (
        Deploy,
        GpuReset,
        Launch,
        PushArtifacts,
        ReadFile,
        SignalProcess,
    )

    samples: list[Command] = [
        cls()
        for cls in COMMANDS.values()
        # fields without defaults
        if cls not in (Launch, ReadFile, Deploy, PushArtifacts, SignalProcess, GpuReset)
    ]
    samples += [
        Launch(config_toml="x = 1", name="tiny-cpu"),
        ReadFile(name="train.log"),
        Deploy(tar_b64="", sha256="0" * 64),
        PushArtifacts(name="a.bin", offset=0, size=1, sha256="0" * 64, chunk_b64="AA=="),
        SignalProcess(pid=123, start=456, signal="SIGTERM"),
        GpuReset(index=0),
    ]
    assert {c.cmd for c in samples} == set(COMMANDS)
    for c in samples:
        data = c.to_json()
        assert data["cmd"] == c.cmd
        assert decode_command(data) == c


class FakeLink:
    """Records the commands control sends; answers as the agent does."""

    def __init__(self) -> None:
        self.sent: list[Command] = []

    async def request(
        self, cmd: Command, timeout: float | None = None, on_progress: Any = None
    ) -> dict[str, Any]:
        self.sent.append(cmd)
        assert timeout is None  # the command's own client timeout, always
        killed = {"run_id": RUN, "signal": "SIGTERM", "stop_s": 1.5, "orphans": []}
        return {"killed": killed, "launched": {"run_id": "new"}} if cmd.cmd == "restart" else killed


def test_the_cli_and_the_tui_send_the_same_kill_and_restart() -> None:
    cli_link = FakeLink()
    for argv in (["kill", "box"], ["restart", "box", "--run", RUN]):
        args = cli.build_command_parser(argv[0]).parse_args(argv[1:])
        code = asyncio.run(actions.work(argv[0], args)(cli_link, Store()))
        assert code == 0

    tui_link = FakeLink()

    async def go() -> None:
        app = DFlashApp(TARGET, theme_name="dark", link=tui_link, connect=False, clock=lambda: NOW)
        async with app.run_test(size=SIZE) as pilot:
            # Connected, with the run alive: control keys are refused without (test_offline).
            app.feed(typed_event({"type": "link", "t": NOW, "state": "connected"}))
            app.feed(typed_event({"type": "follow", "t": NOW, "run_id": RUN}))
            app.feed(typed_event({"type": "runs", "t": NOW, "runs": [], "alive_run": RUN}))
            # K asks for the word kill typed; r asks which, Enter on the focused resume
            for keys in (["K", *"kill", "enter"], ["r", "enter"]):
                for key in keys:
                    await pilot.press(key)
                    await pilot.pause(0.05)
                for _ in range(50):
                    await pilot.pause(0.05)
                    if app.controls.busy is None:
                        break

    asyncio.run(go())
    assert [type(c) for c in cli_link.sent] == [Kill, Restart]
    assert [c.to_json() for c in tui_link.sent] == [c.to_json() for c in cli_link.sent]
    assert [c.client_timeout() for c in tui_link.sent] == [
        c.client_timeout() for c in cli_link.sent
    ]
    assert [c.client_timeout() for c in cli_link.sent] == [210.0, 360.0]

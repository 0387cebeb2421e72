"""The agent protocol as records: events and commands round-trip; bad ones are values."""

from __future__ import annotations

import json

import pytest

from trainer.contract.protocol import (
    COMMANDS,
    EVENTS,
    RELEASE_CHECK_S,
    DumpStacks,
    FollowRun,
    Kill,
    Line,
    Restart,
    decode_command,
    decode_event,
    decode_event_line,
)
from trainer.contract.typed import Unreadable


def test_every_command_round_trips_and_has_a_client_timeout():
    for name, cls in COMMANDS.items():
        required = {"config_toml": "x", "tar_b64": "", "sha256": "0" * 64, "name": "train.log",
                    "offset": 0, "size": 1, "chunk_b64": "AA==", "pid": 2, "start": 0,
                    "signal": "SIGTERM"}  # fmt: skip
        fields = {k: v for k, v in required.items() if k in cls.__dataclass_fields__}
        cmd = cls(id=7, **fields)
        data = json.loads(json.dumps(cmd.to_json()))
        assert data["cmd"] == name
        assert decode_command(data) == cmd
        assert cmd.client_timeout() > 0


def test_stop_timeouts_follow_their_arguments():
    assert Kill().client_timeout() == 60 + 120 + 30
    assert Kill(timeout_s=5, drain_timeout_s=10).client_timeout() == 45
    assert Restart().client_timeout() > Kill().client_timeout()  # it also waits for a start
    # restart --deploy also waits for the new release's import check on the host
    redeploy = Restart(release="0" * 64)
    assert redeploy.client_timeout() == Restart().client_timeout() + RELEASE_CHECK_S
    assert DumpStacks().client_timeout() >= 60


@pytest.mark.parametrize(
    ("data", "why"),
    [
        ([1], "not a JSON object"),
        ({"cmd": "format_disk"}, "unknown command 'format_disk'"),
        ({"cmd": "kill", "timeout_s": "soon"}, "kill.timeout_s: expected a number, got str"),
        ({"cmd": "follow", "offsets": {"train.log": "x"}}, "follow.offsets.train.log"),
    ],
)
def test_bad_commands_are_unreadable_values(data, why):
    got = decode_command(data)
    assert isinstance(got, Unreadable) and why in got.why


def test_events_round_trip():
    line = Line(t=1.5, run_id="r", file="train.log", offset=0, end=4, text="abc")
    assert line.to_json()["type"] == "line"
    assert decode_event(json.loads(json.dumps(line.to_json()))) == line
    assert decode_command(FollowRun(offsets={"train.log": 3}).to_json()) == FollowRun(
        offsets={"train.log": 3}
    )
    assert set(EVENTS) >= {"hello", "gpu", "runs", "heartbeat", "line", "liveness", "result"}


@pytest.mark.parametrize(
    "raw",
    [b"not json", b"[" * 100_000, b'{"type": "line", "run_id": 3}', b'{"type": "warp"}', b"7"],
)
def test_bad_event_lines_are_unreadable_values(raw):
    assert isinstance(decode_event_line(raw), Unreadable)

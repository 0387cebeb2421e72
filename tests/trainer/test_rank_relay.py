"""The rank relay's two boundaries (trainer/distributed/rank_relay.py, trainer/contract/ranks.py
`relay_form`): what a rank puts on the wire is small and bounded, and what the writer takes
off it is checked like a file, on real rank heartbeats recorded from a job."""

from __future__ import annotations

import json
from pathlib import Path

from trainer.contract.ranks import RELAY_MAX_BYTES, relay_form
from trainer.distributed.layout import RankLayout
from trainer.distributed.rank_relay import MESSAGE, pack, senders, unpack

RECORDED = Path(__file__).resolve().parents[1] / "fixtures" / "ranks" / "slow-drafter"


def recorded(rank: int) -> dict:
    return json.loads((RECORDED / f"heartbeat-rank{rank}.json").read_text())


def test_a_beat_crosses_the_wire_whole_but_for_its_queues_and_traceback() -> None:
    beat = recorded(3)
    beat["error"] = {"thread": "drafter-1", "message": "boom " * 400, "traceback": "x" * 50_000}
    raw = relay_form(beat)
    assert raw is not None and len(raw) <= RELAY_MAX_BYTES
    got = unpack(pack(raw), 3)
    assert isinstance(got, dict), got
    assert got["error"]["traceback"] == "" and len(got["error"]["message"]) == 500
    assert "queues" not in got
    assert {k: v for k, v in got.items() if k not in ("error",)} == {
        k: v for k, v in beat.items() if k not in ("error", "queues")
    }


def test_too_many_stages_are_dropped_before_the_beat_is() -> None:
    beat = recorded(3)
    beat["stages_ms"] = {f"stage {i:03d} " + "s" * 40: 1.0 for i in range(80)}
    raw = relay_form(beat)
    assert raw is not None and "stages_ms" not in json.loads(raw)
    beat["host"] = "h" * 5000  # nothing left to drop: not sent
    assert relay_form(beat) is None


def test_the_writer_refuses_what_is_not_the_senders_heartbeat() -> None:
    good = relay_form(recorded(3))
    assert good is not None
    assert unpack(pack(good), 1) == "rank 1 sent a heartbeat that says it is rank 3"
    assert str(unpack(pack(b"{not json"), 3)).startswith("not JSON")
    assert "not a rate" in str(unpack(pack(good.replace(b'"tok_s":', b'"tok_s":-')), 3))
    msg = pack(good)
    msg[:4] = 255  # a length past the message
    assert unpack(msg, 3) == f"a message of {2**32 - 1} bytes (at most {RELAY_MAX_BYTES})"
    assert msg.numel() == MESSAGE


def test_only_the_other_nodes_ranks_relay() -> None:
    two = RankLayout(0, 6, 0, 4, 2, "cpu", 2)  # 2 targets + 1 drafter a node
    assert senders(two) == [3, 4, 5]
    assert two.writer_rank == 2

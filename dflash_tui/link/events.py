"""What the link hands its sink: the agent's events (trainer/contract/protocol.py), decoded at
the boundary, plus two events of its own and the lines it could not read.

`SinkEvent` is every value a sink receives; the store dispatches on the class.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

from trainer.contract.protocol import Event
from trainer.contract.typed import Unreadable, encode


@dataclasses.dataclass(frozen=True)
class LinkStatus:
    """The link's own state: idle connecting connected reconnecting refused closed."""

    state: str
    detail: str = ""
    target: str = ""
    attempt: int = 0
    retry_in: float | None = None  # reconnecting: seconds until the next try
    version: int | None = None  # connected: the agent's protocol version
    t: float = dataclasses.field(default_factory=time.time)

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = encode(self)
        data["type"] = "link"
        return data


@dataclasses.dataclass(frozen=True)
class Rtt:
    """One ping's round trip."""

    rtt_ms: float
    t: float = dataclasses.field(default_factory=time.time)

    def to_json(self) -> dict[str, Any]:
        return {"type": "rtt", "t": self.t, "rtt_ms": self.rtt_ms}


SinkEvent = Event | LinkStatus | Rtt | Unreadable


def event_json(event: SinkEvent) -> dict[str, Any]:
    """Any sink event as JSON (headless --json); an unreadable line as {type: unreadable}."""
    if isinstance(event, Unreadable):
        return {"type": "unreadable", "what": event.what, "why": event.why}
    return event.to_json()

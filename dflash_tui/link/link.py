"""The link: keeps one agent session alive over a transport, and reconnects when it drops.

- Reconnects with exponential backoff and jitter, saying what it is doing in `link` events.
- Remembers, per run and file, the byte offset after the last line it delivered. A new
  session resumes from there, and any line before it is dropped: no loss, no duplicates.
  A fresh follow (the agent's `follow` event not `resumed`: another run chosen) forgets
  that run's offsets, since the agent sends its lines again from the tail.
- Decodes every agent line at the boundary (trainer/contract/protocol.py) and hands the sink
  typed events; a line that is not one goes to the sink as `Unreadable`. Nothing that one
  event does (decoding it, or the sink folding it) can end the session.
- `request()` sends a contract `Command` and waits for its result (progress events pass
  through); its timeout is the command's `client_timeout()` unless given.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import random
import time
from collections.abc import Callable
from typing import Any

from dflash_tui.link.events import LinkStatus, Rtt, SinkEvent
from dflash_tui.link.transport import ConnectError, agent_source, make_transport
from dflash_tui.targets import Target
from trainer.contract.protocol import (
    FROM_START_FILES,
    Command,
    Event,
    Follow,
    FollowRun,
    Hello,
    Line,
    Ping,
    Progress,
    Result,
    Truncated,
    decode_event_line,
)
from trainer.contract.typed import Unreadable

EventSink = Callable[[SinkEvent], None]
ProgressSink = Callable[[Progress], None]


class LinkError(Exception):
    pass


class BadInput(LinkError):
    """The agent refused a command for what it named (no such run, step, checkpoint)."""


class Link:
    BACKOFF_START_S = 0.5
    BACKOFF_MAX_S = 30.0
    PING_EVERY_S = 5.0

    def __init__(
        self,
        target: Target,
        sink: EventSink,
        follow: str | None = "latest",
        agent_extra: list[str] | None = None,
        transport: Any = None,
        one_shot: bool = False,
        connect_timeout: float | None = None,
    ) -> None:
        """`one_shot`: a command that answers once (status, kill, runs…): if the first try
        gets no session, that is the answer (state `refused`), not a retry with backoff.
        `connect_timeout`: seconds an SSH host has to answer (the transport's default)."""
        self.target = target
        self.sink = sink
        self.follow_target = follow  # None: no file following (one-shot control commands)
        self.one_shot = one_shot
        self.transport = transport or make_transport(target, agent_extra, connect_timeout)
        self.offsets: dict[str, dict[str, int]] = {}  # run_id -> file -> next byte
        self.run_id: str | None = None
        self._agent: Any = None
        self._connected = asyncio.Event()
        self._fatal: str | None = None
        self._ids = 0
        self._pending: dict[int, asyncio.Future[Result]] = {}
        self._progress: dict[int, ProgressSink] = {}
        self._closing = False
        self._task: asyncio.Task[None] | None = None
        self._write_lock = asyncio.Lock()
        self.state = "idle"
        self.sessions = 0

    # -- status ------------------------------------------------------------------------
    def _status(
        self,
        state: str,
        detail: str = "",
        attempt: int = 0,
        retry_in: float | None = None,
        version: int | None = None,
    ) -> None:
        self.state = state
        self._deliver(
            LinkStatus(state, detail, self.target.name, attempt, retry_in, version, time.time())
        )

    def _deliver(self, event: SinkEvent) -> None:
        """Hand one event to the sink; a sink that trips on it costs that event only."""
        try:
            self.sink(event)
        except Exception as e:
            what = event.what if isinstance(event, Unreadable) else type(event).__name__
            with contextlib.suppress(Exception):
                self.sink(Unreadable(what, f"could not be applied: {type(e).__name__}: {e}"))

    # -- lifecycle ---------------------------------------------------------------------
    def start(self) -> asyncio.Task[None]:
        self._task = asyncio.get_running_loop().create_task(self._run())
        return self._task

    async def close(self) -> None:
        self._closing = True
        if self._agent is not None:
            await self._agent.aclose()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
        await self.transport.close()
        self._fail_pending("link closed")
        self._status("closed")

    async def wait_connected(self, timeout: float) -> None:
        """Wait for a live session; raise LinkError with the reason if none comes."""
        deadline = time.monotonic() + timeout
        while not self._connected.is_set():
            if self._fatal:
                raise LinkError(self._fatal)
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise LinkError(self._last_detail or f"could not reach {self.target.name}")
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._connected.wait(), min(remaining, 0.2))

    _last_detail = ""

    async def _run(self) -> None:
        attempt = 0  # consecutive failures to get a session
        while not self._closing:
            self._status("connecting", self.transport.describe(), attempt=attempt)
            sessions_before = self.sessions
            try:
                await self.transport.connect()
                agent = await self.transport.start_agent()
                self._agent = agent
                await agent.write(self._boot_payload())
                reason = await self._session(agent)
            except ConnectError as e:
                reason = str(e)
                # One-shot and never connected: the cause is the answer (a TUI keeps trying).
                if e.fatal or (self.one_shot and self.sessions == 0):
                    self._fatal = reason
                    self._last_detail = reason
                    self._status("refused", reason)
                    self._fail_pending(reason)
                    return
            except (OSError, EOFError, ConnectionError) as e:
                reason = f"connection lost: {e or type(e).__name__}"
            except Exception as e:  # anything else: the link restarts and says why
                reason = f"link error: {type(e).__name__}: {str(e)[:200]}"
                if self._agent is not None:  # a fresh agent, not a stream left mid-line
                    with contextlib.suppress(Exception):
                        await self._agent.aclose()
            finally:
                self._connected.clear()
                self._agent = None
            if self._closing:
                return
            self._last_detail = reason
            self._fail_pending(f"connection lost before the answer came: {reason}")
            if hasattr(self.transport, "drop") and "connection lost" in reason:
                self.transport.drop()
            # A session that got going resets the backoff: the next try is quick.
            attempt = 1 if self.sessions > sessions_before else attempt + 1
            delay = min(self.BACKOFF_MAX_S, self.BACKOFF_START_S * 2 ** max(0, attempt - 1))
            delay *= random.uniform(0.8, 1.2)
            self._status("reconnecting", reason, attempt=attempt, retry_in=round(delay, 2))
            await asyncio.sleep(delay)

    def _boot_payload(self) -> bytes:
        src = agent_source()
        return str(len(src)).encode() + b"\n" + src

    async def _session(self, agent: Any) -> str:
        """Run one agent session until it ends; returns why it ended."""
        hello = await self._read_hello(agent)
        if hello is None:
            tail = (await agent.stderr_tail()).strip()
            status = await agent.exit_status()
            last = tail.splitlines()[-1] if tail else "no output"
            raise ConnectError(f"agent did not start (exit {status}): {last}")
        self.sessions += 1
        self._deliver(hello)
        self._connected.set()
        self._status("connected", self.transport.describe(), version=hello.version)
        if self.follow_target is not None:
            await self._send_follow(agent)
        pinger = asyncio.get_running_loop().create_task(self._pinger())
        try:
            while True:
                event = await self._read_event(agent)
                if event is None:
                    tail = (await agent.stderr_tail()).strip()
                    last = tail.splitlines()[-1] if tail else ""
                    return "agent channel closed" + (f": {last}" if last else "")
                self._dispatch(event)
        finally:
            pinger.cancel()

    async def _read_line(self, agent: Any) -> bytes | None:
        try:
            raw: bytes = await agent.readline()
        except (asyncio.IncompleteReadError, ConnectionError, OSError):
            return None
        except Exception as e:  # asyncssh raises its own on a dropped connection
            if type(e).__module__.startswith("asyncssh"):
                return None
            raise
        return raw or None

    async def _read_hello(self, agent: Any) -> Hello | None:
        """The agent's first event. Lines before it that are not events are a login banner
        or shell noise: skipped. Events before it are delivered as they come."""
        while (raw := await self._read_line(agent)) is not None:
            event = decode_event_line(raw)
            if isinstance(event, Hello):
                return event
            if isinstance(event, Event):
                self._dispatch(event)
        return None

    async def _read_event(self, agent: Any) -> Event | Unreadable | None:
        """The next line as an event, or as why it is not one; None when the channel closed."""
        raw = await self._read_line(agent)
        return None if raw is None else decode_event_line(raw)

    async def _send_follow(self, agent: Any) -> None:
        cmd = FollowRun(
            id=self._next_id(),
            run_id=self.follow_target or "latest",
            from_start=list(FROM_START_FILES),
        )
        if self.run_id is not None:
            cmd.offsets_run_id = self.run_id
            cmd.offsets = dict(self.offsets.get(self.run_id, {}))
        await self._write(agent, cmd)

    async def _pinger(self) -> None:
        while True:
            await asyncio.sleep(self.PING_EVERY_S)
            t0 = time.monotonic()
            with contextlib.suppress(Exception):
                await self.request(Ping(), timeout=self.PING_EVERY_S)
                self._deliver(Rtt((time.monotonic() - t0) * 1e3))

    # -- events ------------------------------------------------------------------------
    def _dispatch(self, event: Event | Unreadable) -> None:
        try:
            if not self._route(event):
                return
        except Exception as e:  # a bug in routing one event must not end the session
            event = Unreadable(type(event).__name__, f"{type(e).__name__}: {e}")
        self._deliver(event)

    def _route(self, event: Event | Unreadable) -> bool:
        """The link's own bookkeeping for one event; False to drop it (already delivered)."""
        if isinstance(event, Line):
            known = self.offsets.setdefault(event.run_id, {})
            if event.offset < known.get(event.file, -1):
                return False  # already delivered in an earlier session
            known[event.file] = event.end
        elif isinstance(event, Truncated):
            known = self.offsets.setdefault(event.run_id, {})
            known[event.file] = 0 if event.reason == "replaced" else event.size
        elif isinstance(event, Follow):
            self.run_id = event.run_id
            if not event.resumed and event.run_id is not None:
                # A fresh follow (another run chosen, or this one again): the agent reads
                # each file from its tail or start, so what was delivered of it before is
                # not what these lines repeat; forget it, or they would all be dropped.
                self.offsets[event.run_id] = {}
        elif isinstance(event, Result) and event.id is not None:
            fut = self._pending.pop(event.id, None)
            self._progress.pop(event.id, None)
            if fut is not None and not fut.done():
                fut.set_result(event)
        elif isinstance(event, Progress) and event.id is not None:
            cb = self._progress.get(event.id)
            if cb is not None:
                with contextlib.suppress(Exception):  # a view's callback, not the link's
                    cb(event)
        return True

    # -- commands ----------------------------------------------------------------------
    def _next_id(self) -> int:
        self._ids += 1
        return self._ids

    async def _write(self, agent: Any, cmd: Command) -> None:
        async with self._write_lock:
            await agent.write((json.dumps(cmd.to_json()) + "\n").encode())

    async def request(
        self,
        cmd: Command,
        timeout: float | None = None,
        on_progress: ProgressSink | None = None,
        connect_timeout: float = 30.0,
    ) -> dict[str, Any]:
        """Send a command; return its `data`, or raise LinkError with the agent's error.
        `timeout`: seconds to wait for the result, by default the command's own."""
        timeout = cmd.client_timeout() if timeout is None else timeout
        await self.wait_connected(connect_timeout)
        cid = self._next_id()
        fut: asyncio.Future[Result] = asyncio.get_running_loop().create_future()
        self._pending[cid] = fut
        if on_progress is not None:
            self._progress[cid] = on_progress
        agent = self._agent
        if agent is None:
            raise LinkError("not connected")
        await self._write(agent, dataclasses.replace(cmd, id=cid))
        try:
            result = await asyncio.wait_for(fut, timeout)
        except TimeoutError:
            self._pending.pop(cid, None)
            self._progress.pop(cid, None)
            raise LinkError(f"{cmd.cmd}: no answer within {timeout:.0f}s") from None
        if not result.ok:
            error = str(result.error or "failed")
            raise BadInput(error) if result.bad_input else LinkError(error)
        data = result.data if isinstance(result.data, dict) else {}
        return data

    def _fail_pending(self, reason: str) -> None:
        for fut in self._pending.values():
            if not fut.done():
                fut.set_exception(LinkError(reason))
        self._pending.clear()
        self._progress.clear()

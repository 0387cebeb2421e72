"""The link: keeps one agent session alive over a transport, and reconnects when it drops.

- Reconnects with exponential backoff and jitter, saying what it is doing in `link` events.
- Remembers, per run and file, the byte offset after the last line it delivered. A new
  session resumes from there, and any line before it is dropped: no loss, no duplicates.
- `request()` sends a command and waits for its result (progress events pass through).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import time
from collections.abc import Callable
from typing import Any

from dflash_tui.link.transport import ConnectError, agent_source, make_transport
from dflash_tui.targets import Target

EventSink = Callable[[dict[str, Any]], None]


class LinkError(Exception):
    pass


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
    ) -> None:
        self.target = target
        self.sink = sink
        self.follow_target = follow  # None: no file following (one-shot control commands)
        self.transport = transport or make_transport(target, agent_extra)
        self.offsets: dict[str, dict[str, int]] = {}  # run_id -> file -> next byte
        self.run_id: str | None = None
        self._agent: Any = None
        self._connected = asyncio.Event()
        self._fatal: str | None = None
        self._ids = 0
        self._pending: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self._progress: dict[int, Callable[[dict[str, Any]], None]] = {}
        self._closing = False
        self._task: asyncio.Task[None] | None = None
        self._write_lock = asyncio.Lock()
        self.state = "idle"
        self.sessions = 0

    # -- status ------------------------------------------------------------------------
    def _status(self, state: str, detail: str = "", **extra: Any) -> None:
        self.state = state
        self.sink(
            {
                "type": "link",
                "t": time.time(),
                "state": state,
                "detail": detail,
                "target": self.target.name,
                **extra,
            }
        )

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
                if e.fatal:
                    self._fatal = reason
                    self._last_detail = reason
                    self._status("refused", reason)
                    self._fail_pending(reason)
                    return
            except (OSError, EOFError, ConnectionError) as e:
                reason = f"connection lost: {e or type(e).__name__}"
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
        hello = await self._read_event(agent, first=True)
        if hello is None:
            tail = (await agent.stderr_tail()).strip()
            status = await agent.exit_status()
            last = tail.splitlines()[-1] if tail else "no output"
            raise ConnectError(f"agent did not start (exit {status}): {last}")
        self.sessions += 1
        self.sink(hello)
        self._connected.set()
        self._status("connected", self.transport.describe(), version=hello.get("version"))
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

    async def _read_event(self, agent: Any, first: bool = False) -> dict[str, Any] | None:
        while True:
            try:
                raw = await agent.readline()
            except (asyncio.IncompleteReadError, ConnectionError, OSError):
                return None
            except Exception as e:  # asyncssh raises its own on a dropped connection
                if type(e).__module__.startswith("asyncssh"):
                    return None
                raise
            if not raw:
                return None
            try:
                event = json.loads(raw)
            except ValueError:
                if first:
                    continue  # a login banner or shell noise before the agent speaks
                self.sink(
                    {
                        "type": "log",
                        "t": time.time(),
                        "level": "warning",
                        "message": f"agent: unreadable line {raw[:200]!r}",
                    }
                )
                continue
            if isinstance(event, dict) and "type" in event:
                return event

    async def _send_follow(self, agent: Any) -> None:
        cmd: dict[str, Any] = {"cmd": "follow", "id": self._next_id(), "run_id": self.follow_target}
        if self.run_id is not None:
            cmd["offsets_run_id"] = self.run_id
            cmd["offsets"] = dict(self.offsets.get(self.run_id, {}))
        await self._write(agent, cmd)

    async def _pinger(self) -> None:
        while True:
            await asyncio.sleep(self.PING_EVERY_S)
            t0 = time.monotonic()
            with contextlib.suppress(Exception):
                await self.request({"cmd": "ping"}, timeout=self.PING_EVERY_S)
                self.sink(
                    {"type": "rtt", "t": time.time(), "rtt_ms": (time.monotonic() - t0) * 1e3}
                )

    # -- events ------------------------------------------------------------------------
    def _dispatch(self, event: dict[str, Any]) -> None:
        kind = event.get("type")
        if kind == "line":
            run, name = event.get("run_id"), event.get("file")
            known = self.offsets.setdefault(str(run), {})
            if event.get("offset", 0) < known.get(str(name), -1):
                return  # already delivered in an earlier session
            known[str(name)] = int(event.get("end", 0))
        elif kind == "truncated":
            known = self.offsets.setdefault(str(event.get("run_id")), {})
            known[str(event.get("file"))] = (
                0 if event.get("reason") == "replaced" else int(event.get("size", 0))
            )
        elif kind == "follow":
            self.run_id = event.get("run_id")
        elif kind == "result":
            fut = self._pending.pop(int(event.get("id", -1)), None)
            self._progress.pop(int(event.get("id", -1)), None)
            if fut is not None and not fut.done():
                fut.set_result(event)
        elif kind == "progress":
            cb = self._progress.get(int(event.get("id", -1)))
            if cb is not None:
                cb(event)
        self.sink(event)

    # -- commands ----------------------------------------------------------------------
    def _next_id(self) -> int:
        self._ids += 1
        return self._ids

    async def _write(self, agent: Any, cmd: dict[str, Any]) -> None:
        async with self._write_lock:
            await agent.write((json.dumps(cmd) + "\n").encode())

    async def request(
        self,
        cmd: dict[str, Any],
        timeout: float | None = 60.0,
        on_progress: Callable[[dict[str, Any]], None] | None = None,
        connect_timeout: float = 30.0,
    ) -> dict[str, Any]:
        """Send a command; return its `data`, or raise LinkError with the agent's error."""
        await self.wait_connected(connect_timeout)
        cid = self._next_id()
        fut: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._pending[cid] = fut
        if on_progress is not None:
            self._progress[cid] = on_progress
        agent = self._agent
        if agent is None:
            raise LinkError("not connected")
        await self._write(agent, {**cmd, "id": cid})
        try:
            result = await asyncio.wait_for(fut, timeout)
        except TimeoutError:
            self._pending.pop(cid, None)
            raise LinkError(f"{cmd.get('cmd')}: no answer within {timeout:.0f}s") from None
        if not result.get("ok"):
            raise LinkError(str(result.get("error") or "failed"))
        data: dict[str, Any] = result.get("data") or {}
        return data

    def _fail_pending(self, reason: str) -> None:
        for fut in self._pending.values():
            if not fut.done():
                fut.set_exception(LinkError(reason))
        self._pending.clear()
        self._progress.clear()

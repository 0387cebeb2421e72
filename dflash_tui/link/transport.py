"""Starting the agent: as a local subprocess, or over one SSH connection.

Either way the agent is `python -u -c <BOOTSTRAP> ARGS` behind the exec prefix (`pct exec
CTID --`, `docker exec -i NAME`), and its source follows on stdin. Every remote argument is
quoted with shlex; no shell string is ever built from unchecked input.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import shlex
from dataclasses import dataclass
from typing import Any, Protocol

from dflash_tui.link.bundle import agent_blob
from dflash_tui.link.hostkeys import (
    OPT_OUT,
    config_paths,
    host_key_policy,
    known_hosts,
    make_client,
    matched,
    record_host_key,
)
from dflash_tui.targets import Target, TargetError
from trainer.contract.textfile import TextFileError, read_text_file

# Reads the agent's length-prefixed source from stdin and runs it as __main__; the same
# stdin then carries the commands.
MAX_IDENTITY_BYTES = 64 << 10  # an OpenSSH private key is a few KiB
BOOTSTRAP = (
    "import sys;n=int(sys.stdin.buffer.readline());"
    "exec(compile(sys.stdin.buffer.read(n),'dflash_agent','exec'))"
)


def agent_source() -> bytes:
    """The agent with the contract it speaks, as one script (dflash_tui/link/bundle.py)."""
    return agent_blob()


def agent_argv(target: Target, extra: list[str] | None = None) -> list[str]:
    return [
        *target.exec_prefix,
        target.effective_python,
        "-u",
        "-c",
        BOOTSTRAP,
        "--run-root",
        target.effective_run_root,
        "--remote-dir",
        target.remote_dir,
        "--python",
        target.effective_python,
        *(extra or []),
    ]


class AgentProcess(Protocol):
    """What a transport hands back: the agent's pipes."""

    async def write(self, data: bytes) -> None: ...
    async def readline(self) -> bytes: ...
    async def stderr_tail(self) -> str: ...
    async def exit_status(self) -> int | None: ...
    def terminate(self) -> None: ...
    async def aclose(self) -> None: ...


class ConnectError(Exception):
    """The transport could not connect. `fatal`: retrying cannot help (host key, auth)."""

    def __init__(self, message: str, fatal: bool = False) -> None:
        super().__init__(message)
        self.fatal = fatal


# -- local ----------------------------------------------------------------------------------
@dataclass
class _LocalAgent:
    proc: asyncio.subprocess.Process

    async def write(self, data: bytes) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(data)
        await self.proc.stdin.drain()

    async def readline(self) -> bytes:
        assert self.proc.stdout is not None
        return await self.proc.stdout.readline()

    async def stderr_tail(self) -> str:
        if self.proc.stderr is None:
            return ""
        with contextlib.suppress(asyncio.TimeoutError):
            data = await asyncio.wait_for(self.proc.stderr.read(65536), 1.0)
            return data.decode(errors="replace")
        return ""

    async def exit_status(self) -> int | None:
        with contextlib.suppress(asyncio.TimeoutError):
            return await asyncio.wait_for(self.proc.wait(), 2.0)
        return None

    def terminate(self) -> None:
        if self.proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.kill()

    async def aclose(self) -> None:
        self.terminate()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self.proc.wait(), 5)


class LocalTransport:
    # A deploy reply or a big stack dump is one long line; the agent never sends one over
    # MAX_LINE_BYTES (trainer/contract/protocol.py).
    READ_LIMIT = 1 << 26

    def __init__(self, target: Target, agent_extra: list[str] | None = None) -> None:
        self.target = target
        self.agent_extra = agent_extra or []

    async def connect(self) -> None:
        return None

    async def start_agent(self) -> AgentProcess:
        argv = agent_argv(self.target, self.agent_extra)
        try:
            proc = await asyncio.create_subprocess_exec(
                *argv,
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                limit=self.READ_LIMIT,
            )
        except OSError as e:
            raise ConnectError(f"could not start {argv[0]}: {e}") from None
        return _LocalAgent(proc)

    async def close(self) -> None:
        return None

    def describe(self) -> str:
        return self.target.describe()


# -- ssh ----------------------------------------------------------------------------------
@dataclass
class _SshAgent:
    proc: Any  # asyncssh.SSHClientProcess

    async def write(self, data: bytes) -> None:
        self.proc.stdin.write(data)
        await self.proc.stdin.drain()

    async def readline(self) -> bytes:
        data: bytes = await self.proc.stdout.readline()
        return data

    async def stderr_tail(self) -> str:
        with contextlib.suppress(Exception):
            data = await asyncio.wait_for(self.proc.stderr.read(65536), 1.0)
            return data.decode(errors="replace") if isinstance(data, bytes) else str(data)
        return ""

    async def exit_status(self) -> int | None:
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self.proc.wait_closed(), 2.0)
            status = self.proc.exit_status
            return int(status) if status is not None else None
        return None

    def terminate(self) -> None:
        with contextlib.suppress(Exception):
            self.proc.close()

    async def aclose(self) -> None:
        self.terminate()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self.proc.wait_closed(), 5)


def identity_path(target: Target) -> str | None:
    """The target's private key file (None: it names none), checked before asyncssh reads it
    whole: a FIFO there would block the connection, /dev/zero never end. Not a regular text
    file within the cap: one TargetError line naming it."""
    if not target.identity:
        return None
    path = os.path.expanduser(target.identity)
    try:
        read_text_file(path, f"identity {path}", MAX_IDENTITY_BYTES)
    except TextFileError as e:
        raise TargetError(str(e)) from None
    return path


class SshTransport:
    """One asyncssh connection; the agent runs in one channel of it.

    ~/.ssh/config aliases, identity files and ProxyJump come from asyncssh's OpenSSH config
    support. Host-key checking stays on whatever the config says (hostkeys.py): a mismatch is
    refused, never retried; `StrictHostKeyChecking accept-new` trusts a new host once."""

    KEEPALIVE_S = 15
    KEEPALIVE_COUNT = 3
    CONNECT_TIMEOUT_S = 10.0

    def __init__(
        self,
        target: Target,
        agent_extra: list[str] | None = None,
        connect_timeout: float | None = None,
    ) -> None:
        self.target = target
        self.agent_extra = agent_extra or []
        # One-shot commands pass a short one: an unroutable host answers in seconds, not 10.
        self.connect_timeout = connect_timeout or self.CONNECT_TIMEOUT_S
        self.conn: Any = None
        self.recorded: str | None = None  # the known_hosts line accept-new added

    async def connect(self) -> None:
        import asyncssh

        if self.conn is not None and not self.conn.is_closed():
            return
        t = self.target
        options: dict[str, Any] = {
            "keepalive_interval": self.KEEPALIVE_S,
            "keepalive_count_max": self.KEEPALIVE_COUNT,
            "connect_timeout": self.connect_timeout,
        }
        if t.port:
            options["port"] = t.port
        if t.user:
            options["username"] = t.user
        where = self.describe()
        try:
            identity = identity_path(t)
        except TargetError as e:
            raise ConnectError(str(e), fatal=True) from None
        if identity is not None:
            options["client_keys"] = [identity]
        try:  # given, not left to asyncssh's default: read only once checked (a FIFO blocks)
            options["config"] = config_paths()
        except TargetError as e:
            raise ConnectError(str(e), fatal=True) from None
        made: list[Any] = []
        files = ""  # the known_hosts files, named when a key is not accepted
        if t.check_host_key:
            try:
                policy = host_key_policy(t)
                known = known_hosts(policy)
                files = ", ".join(policy.files)
            except (TargetError, ValueError, OSError) as e:  # ValueError: a bad known_hosts line
                raise ConnectError(str(e), fatal=True) from None
            # Always given here: asyncssh would take `UserKnownHostsFile none` as "no checking".
            # A function, not the set: asyncssh's own lookup forgets `[host]:port`'s revoked keys.
            options["known_hosts"] = functools.partial(matched, known)

            def client() -> Any:
                made.append(make_client(policy, known))
                return made[-1]

            options["client_factory"] = client
        else:  # --insecure-no-host-key-check: asked for on the command line, in those words
            options["known_hosts"] = None

        try:
            self.conn = await asyncssh.connect(t.host or "", **options)
        except asyncssh.HostKeyNotVerifiable as e:
            advice = (
                "a @revoked key is never trusted"
                if "revoked" in str(e.reason).lower()
                else "if the host was reinstalled, remove its old entry"
            )
            raise ConnectError(
                f"host key of {where} not accepted ({e.reason}): check "
                f"{files}; {advice} ({OPT_OUT} connects without checking)",
                fatal=True,
            ) from None
        except asyncssh.PermissionDenied:
            raise ConnectError(
                f"{where}: authentication refused (keys tried: "
                f"{t.identity or 'ssh-agent and ~/.ssh defaults'})",
                fatal=True,
            ) from None
        except asyncssh.Error as e:
            raise ConnectError(f"{where}: {e.reason or type(e).__name__}") from None
        except (TimeoutError, OSError) as e:
            text = str(e) or type(e).__name__
            if isinstance(e, asyncio.TimeoutError):
                text = f"no answer within {self.connect_timeout:g}s"
            raise ConnectError(f"{where} unreachable: {text}") from None
        learned = next((c.learned for c in made if c.learned is not None), None)
        if learned is not None:  # accept-new: trusted on first use, kept as OpenSSH keeps it
            host, port, key = learned
            try:
                self.recorded = record_host_key(policy.record_to, host, port, key)
            except OSError as e:
                self.conn.close()
                self.conn = None
                raise ConnectError(
                    f"{where}: could not record its host key in {policy.record_to} ({e}); "
                    "not connecting to a host whose key is not kept",
                    fatal=True,
                ) from None

    async def start_agent(self) -> AgentProcess:
        import asyncssh

        await self.connect()
        command = shlex.join(agent_argv(self.target, self.agent_extra))
        try:
            proc = await self.conn.create_process(command, encoding=None)
        except (asyncssh.Error, OSError) as e:
            self.conn = None
            raise ConnectError(f"{self.describe()}: could not open a channel: {e}") from None
        return _SshAgent(proc)

    async def close(self) -> None:
        if self.conn is not None:
            self.conn.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self.conn.wait_closed(), 2.0)
            self.conn = None

    def drop(self) -> None:
        """Forget the connection (it died); the next start reconnects."""
        if self.conn is not None:
            self.conn.abort()
            self.conn = None

    def describe(self) -> str:
        return self.target.describe()


def make_transport(
    target: Target, agent_extra: list[str] | None = None, connect_timeout: float | None = None
) -> Any:
    if target.kind == "local":
        return LocalTransport(target, agent_extra)
    return SshTransport(target, agent_extra, connect_timeout)

"""Control operations over the link: deploy, launch, kill, restart, dump stacks, clear cache,
list runs, follow, read a file.

The one command path: every agent command the CLI and the TUI send is built here, as a
contract record (trainer/contract/protocol.py) whose `client_timeout()` the link waits, so
the two cannot disagree on names, defaults or timeouts. The agent does the work next to the
trainer (its own process group, locks, signals), so nothing here builds a remote shell string.
Answers come back as the small records below.
"""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import io
import os
import re
import tarfile
import time
import tomllib
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol, TypeVar

import trainer
from dflash_tui.agent.deploy import name_clash
from dflash_tui.link.bundle import agent_blob
from dflash_tui.state import Store
from trainer.contract.checkpoints import ResumePoint
from trainer.contract.codehash import code_hash
from trainer.contract.nodes import NodePlace
from trainer.contract.outcomes import CRASH, FINISHED, KILLED, STOPPED_EARLY, Outcome
from trainer.contract.protocol import (
    ARTIFACT_CHUNK,
    FROM_START_FILES,
    ClearCompileCache,
    Command,
    Deploy,
    DumpStacks,
    ExportDrafter,
    FollowRun,
    Kill,
    Launch,
    ListRuns,
    PullArtifacts,
    PushArtifacts,
    ReadFile,
    Restart,
    RunInfo,
    SignalProcess,
)
from trainer.contract.protocol import Progress as ProgressEvent
from trainer.contract.records import ExitRecord
from trainer.contract.textfile import TextFileError, read_text_file
from trainer.contract.typed import Invalid, decode

TRAINER_DIR = Path(trainer.__file__).resolve().parent
ARTIFACT_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}\.bin$")
Progress = Callable[[ProgressEvent], None]
A = TypeVar("A")
# What a restart reads back of the shipped config (agent/commands.py reads 1 MiB of it).
MAX_LAUNCH_CONFIG_BYTES = 1 << 20


class Requester(Protocol):
    """What control needs of a link (dflash_tui/link/link.py: Link)."""

    async def request(
        self, cmd: Command, timeout: float | None = None, on_progress: Progress | None = None
    ) -> dict[str, Any]: ...


class ControlError(Exception):
    pass


def _trainer_files() -> list[Path]:
    keep = {".py", ".toml", ".jsonl"}
    return sorted(
        p
        for p in TRAINER_DIR.rglob("*")
        if p.is_file() and p.suffix in keep and "__pycache__" not in p.parts
    )


def build_bundle() -> tuple[bytes, str, int]:
    """(tar.gz bytes, code sha256, file count): trainer/, the agent, and pynvml if we have it."""
    buf = io.BytesIO()
    count = 0
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for path in _trainer_files():
            tar.add(path, arcname=f"trainer/{path.relative_to(TRAINER_DIR).as_posix()}")
            count += 1
        # The same script the link runs, so a launched run's wrapper speaks this contract.
        agent = agent_blob()
        info = tarfile.TarInfo("dflash_agent.py")
        info.size, info.mode, info.mtime = len(agent), 0o644, int(time.time())
        tar.addfile(info, io.BytesIO(agent))
        count += 1
        try:
            import pynvml  # the pure-Python NVML binding: the container needs nothing else

            tar.add(Path(pynvml.__file__), arcname="_vendor/pynvml.py")
            count += 1
        except ImportError:
            pass
    blob = buf.getvalue()
    # The agent refuses an archive whose names clash (agent/deploy.py); say so here first,
    # naming the local file, rather than after shipping it.
    with tarfile.open(fileobj=io.BytesIO(blob), mode="r:gz") as tar:
        clash = name_clash(tar.getmembers())
    if clash is not None:
        raise ControlError(f"deploy: {TRAINER_DIR}: names clash in what would ship: {clash}")
    return blob, code_hash(TRAINER_DIR), count


async def deploy(
    link: Requester,
    on_progress: Progress | None = None,
    ship_artifacts: bool = True,
    make_current: bool = True,
) -> dict[str, Any]:
    """Ship the trainer and the agent; then the compile-cache artifacts pulled from GPU runs
    (`pull_artifacts`), so the host's first run starts warm. `make_current` False: the
    release only lands beside the current one (`restart(release=...)` switches to it)."""
    blob, sha, count = build_bundle()
    cmd = Deploy(tar_b64=base64.b64encode(blob).decode(), sha256=sha, make_current=make_current)
    data = await link.request(cmd, on_progress=on_progress)
    data["files"] = count
    data["artifacts"] = await push_artifacts(link, local_artifacts_dir()) if ship_artifacts else []
    return data


# -- compile-cache artifacts (trainer/runtime/compile/artifacts.py)
def local_artifacts_dir() -> Path:
    """Where the monitor keeps the artifacts it pulled, to ship with deploy."""
    base = os.environ.get("DFLASH_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "dflash-tui"
    )
    return Path(base) / "pulled-artifacts"


@dataclasses.dataclass
class Artifact:
    name: str
    size: int
    sha256: str


async def pull_artifacts(link: Requester, dest: Path | None = None) -> list[tuple[Path, int]]:
    """Copy every artifact the host's GPU runs saved into `dest` (whole and hash-checked, or
    not at all); [(path, bytes)]."""
    dest = dest or local_artifacts_dir()
    listed = await link.request(PullArtifacts())
    found = _answer_list(listed)
    got = []
    for art in found:
        h, parts, offset = hashlib.sha256(), [], 0
        while offset < art.size:
            part = await link.request(PullArtifacts(name=art.name, offset=offset))
            chunk = base64.b64decode(str(part.get("chunk_b64", "")), validate=True)
            if not chunk:
                raise ControlError(f"pull-cache: {art.name} ended at {offset} of {art.size} bytes")
            h.update(chunk)
            parts.append(chunk)
            offset += len(chunk)
        if h.hexdigest() != art.sha256:
            raise ControlError(f"pull-cache: {art.name} arrived hashing to another sha256")
        dest.mkdir(parents=True, exist_ok=True)
        path = dest / art.name
        tmp = path.with_name(f".{art.name}.tmp")
        tmp.write_bytes(b"".join(parts))
        tmp.replace(path)
        got.append((path, art.size))
    return got


def _answer_list(data: dict[str, Any]) -> list[Artifact]:
    raw = data.get("artifacts")
    if not isinstance(raw, list):
        raise ControlError("pull_artifacts: unexpected answer from the agent (no list)")
    try:
        arts = [decode(Artifact, x, "pull_artifacts") for x in raw]
    except Invalid as e:
        raise ControlError(f"pull_artifacts: unexpected answer from the agent ({e})") from None
    for a in arts:  # a name from the host becomes a local file name: one plain .bin name
        if not ARTIFACT_NAME.match(a.name):
            raise ControlError(f"pull_artifacts: refused the artifact name {a.name!r}")
    return arts


async def push_artifacts(link: Requester, src: Path) -> list[str]:
    """Send each `src/*.bin` in chunks; the agent moves it into place once it hashes right."""
    if not src.is_dir():
        return []
    sent = []
    for path in sorted(p for p in src.iterdir() if p.is_file() and ARTIFACT_NAME.match(p.name)):
        data = path.read_bytes()
        sha = hashlib.sha256(data).hexdigest()
        for offset in range(0, len(data), ARTIFACT_CHUNK):
            chunk = data[offset : offset + ARTIFACT_CHUNK]
            await link.request(
                PushArtifacts(
                    name=path.name,
                    offset=offset,
                    size=len(data),
                    sha256=sha,
                    chunk_b64=base64.b64encode(chunk).decode(),
                )
            )
        sent.append(f"{path.name} ({len(data) / 1e6:.1f} MB)")
    return sent


def read_config(path: Path) -> tuple[str, str]:
    """(TOML text, run name), checked here so a typo fails before anything is shipped."""
    try:
        text = read_text_file(path, f"--config {path}", MAX_LAUNCH_CONFIG_BYTES)
    except TextFileError as e:
        raise ControlError(str(e)) from None
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise ControlError(f"--config {path}: not TOML ({e})") from None
    except (ValueError, RecursionError) as e:  # an integer over 4300 digits, deep nesting
        raise ControlError(
            f"--config {path}: not TOML ({str(e)[:200] or 'nested too deep'})"
        ) from None
    name = data.get("name")
    return text, name if isinstance(name, str) else path.stem


def check_overrides(overrides: list[str], config_toml: str | None = None) -> list[str]:
    """The overrides, each one KEY=VALUE, and with `config_toml` checked as the trainer
    checks them (trainer/config.py) before anything is sent: every bad one is a line of the
    ControlError (`config: KEY = VALUE: rule`), not the first only."""
    from trainer.config import ConfigError, check_launch, error_lines

    bad = [f"config: --set {o!r}: one line, no newline in it" for o in overrides if "\n" in o]
    if config_toml is not None:
        try:
            check_launch(config_toml, [o for o in overrides if "\n" not in o])
        except ConfigError as e:
            bad += error_lines(e)
    if bad:
        raise ControlError("\n".join(bad))
    return overrides


# -- answers -------------------------------------------------------------------------------
@dataclasses.dataclass
class Launched:
    run_id: str
    run_dir: str = ""
    started: bool = True
    note: str = ""  # why it is not known to have started


@dataclasses.dataclass
class Killed:
    run_id: str
    signal: str | None = None  # SIGTERM, or SIGKILL when it did not stop in time
    pids: list[int] = dataclasses.field(default_factory=list)
    stop_s: float = 0.0
    drain_s: float | None = None  # None: no GPU to watch, or memory still held
    gpu_held_by: list[int] = dataclasses.field(default_factory=list)
    orphans: list[int] = dataclasses.field(default_factory=list)
    exit: ExitRecord | None = None
    outcome: Outcome | None = None  # how the run ended, read once it had (the agent's)
    not_running: str = ""  # Kill.ended_ok: it had ended already, nothing signalled (why)

    def describe(self, checkpoints_here: bool = True) -> str:
        """How the kill ended the run, in the outcome's words, and what a restart continues:
        `stopped at step 105 (SIGTERM), checkpoint checkpoints/step-00000105.pt — resumable
        with restart`, `killed (SIGKILL) at step 57 … — restart starts at step 0`.
        `checkpoints_here` False: a group's node other than 0, whose run dir never holds
        one (a group restart resumes from node 0's)."""
        if self.not_running:
            return self.not_running
        o = self.outcome
        sent = self.signal or "SIGTERM"
        if o is None:  # not read (the process did not end?)
            return f"signalled ({sent})"
        at = f" at step {o.step}" if o.step is not None else ""
        if o.kind == FINISHED:
            return o.summary
        if o.kind == CRASH:
            return f"{o.summary} ({sent})"
        if o.kind == STOPPED_EARLY:
            what = f"stopped{at} ({sent})"
        elif o.kind == KILLED:
            what = f"killed ({o.signal}){at}" if o.signal else f"vanished{at} (no exit record)"
        else:
            what = f"{o.kind.replace('_', ' ')}{at} ({sent})"
        if not checkpoints_here:
            return f"{what}; node 0 keeps the job's checkpoints"
        point = o.resume
        if point is None:
            checkpoint = f", checkpoint {o.checkpoint}" if o.checkpoint else ""
            return what + checkpoint + (" — resumable with restart" if o.resumable else "")
        if point.name is None:
            none = "no good checkpoint" if point.skipped or o.checkpoint else "no checkpoint"
            return f"{what}, {none} — restart starts at step 0"
        where = point.name if point.run_id == self.run_id else f"{point.name} of {point.run_id}"
        newest = o.checkpoint
        passed = f" (newest {newest} not good)" if newest and newest != point.name else ""
        return f"{what}, checkpoint {where}{passed} — resumable with restart"


@dataclasses.dataclass
class Restarted:
    launched: Launched
    killed: Killed | None = None  # None: it was not running
    resume: ResumePoint | None = None  # what it continues; None: asked to start fresh
    fresh: bool = False  # asked for step 0 (--fresh)
    more_steps: int = 0  # a continued run: this many steps more, to max_steps
    max_steps: int | None = None
    lr: str = ""  # what its learning rate does (held, or a new schedule)
    release: str | None = None  # restart --deploy: the code sha256 it now runs

    def describe(self) -> str:
        """`restarted as NEW, resuming from checkpoints/step-00000105.pt (step 105) of
        PARENT`; or why it starts at step 0, with each checkpoint passed over and why; a
        continued run says to which step, and what its learning rate does; a redeployed one
        on which release."""
        text = self.said()
        return text if self.release is None else f"{text}, on release {self.release[:16]}"

    def said(self) -> str:
        head = f"restarted as {self.launched.run_id}"
        if self.more_steps and self.resume is not None and self.resume.name is not None:
            return (
                f"continued as {self.launched.run_id}: {self.more_steps} more steps from "
                f"{self.resume.name} (step {self.resume.step}) of {self.resume.run_id} to step "
                f"{self.max_steps}; {self.lr}"
            )
        point = self.resume
        if point is None:
            return f"{head}, fresh from step 0" + (" (as asked)" if self.fresh else "")
        if point.name is None:
            return f"{head}, {point.describe()}"
        text = f"{head}, resuming from {point.name} (step {point.step}) of {point.run_id}"
        if not point.verified:
            text += " (no sidecar: the trainer checks it as it loads)"
        if point.skipped:
            text += " (" + "; ".join(f"skipped {s.name}: {s.why}" for s in point.skipped) + ")"
        return text


@dataclasses.dataclass
class Stacks:
    text: str
    run_id: str = ""
    pid: int | None = None
    path: str = ""
    pyspy: str | None = None
    kind: str = "named"  # or "faulthandler": the C-level fallback, threads named
    seconds: float | None = None  # signal -> dump read


@dataclasses.dataclass
class CacheCleared:
    path: str
    bytes: int = 0
    existed: bool = False


@dataclasses.dataclass
class Exported:
    run_id: str
    step: int
    out: str  # the folder on the host
    dtype: str
    said: str = ""  # the trainer's own line (what, how large, from where)


@dataclasses.dataclass
class Followed:
    run_id: str | None = None  # None: no run under the run root yet


@dataclasses.dataclass
class FileText:
    run_id: str
    name: str
    text: str
    start: int = 0  # the byte of the file the text begins at
    size: int = 0  # the file's size then


def _answer(cls: type[A], cmd: Command, data: dict[str, Any]) -> A:
    try:
        return decode(cls, data, cmd.cmd)
    except Invalid as e:
        raise ControlError(f"{cmd.cmd}: unexpected answer from the agent ({e})") from None


# -- commands ------------------------------------------------------------------------------
def kill_command(
    run_id: str | None = None,
    timeout_s: float | None = None,
    drain_timeout_s: float | None = None,
    ended_ok: bool = False,
) -> Kill:
    """None: the contract's default (trainer/contract/protocol.py)."""
    cmd = Kill(run_id=run_id, ended_ok=ended_ok)
    if timeout_s is not None:
        cmd.timeout_s = timeout_s
    if drain_timeout_s is not None:
        cmd.drain_timeout_s = drain_timeout_s
    return cmd


def restart_command(
    run_id: str | None = None,
    timeout_s: float | None = None,
    drain_timeout_s: float | None = None,
    fresh: bool = False,
    node: NodePlace | None = None,
    overrides: list[str] | None = None,
    more_steps: int = 0,
    new_schedule: bool = False,
    release: str | None = None,
) -> Restart:
    """`overrides`: instead of the parent's (None: its own); `more_steps`: continue its final
    checkpoint that many steps further, the lr held unless `new_schedule`; `release`: the
    code sha256 of a release deployed beside `current` (restart --deploy)."""
    kill = kill_command(run_id, timeout_s, drain_timeout_s)
    return Restart(
        run_id=kill.run_id,
        timeout_s=kill.timeout_s,
        drain_timeout_s=kill.drain_timeout_s,
        fresh=fresh,
        node=node,
        overrides=None if overrides is None else check_overrides(overrides),
        more_steps=more_steps,
        new_schedule=new_schedule,
        release=release,
    )


async def launch(
    link: Requester,
    config: Path,
    overrides: list[str],
    on_progress: Progress | None = None,
    node: NodePlace | None = None,
) -> Launched:
    """`node`: one host of a job over several (its run id and place, nodes.py)."""
    text, name = read_config(config)
    return await launch_text(link, text, name, overrides, on_progress, node)


async def launch_text(
    link: Requester,
    text: str,
    name: str,
    overrides: list[str],
    on_progress: Progress | None = None,
    node: NodePlace | None = None,
) -> Launched:
    """`launch` of a config already read (a group reads it once for all its hosts)."""
    cmd = Launch(config_toml=text, overrides=check_overrides(overrides, text), name=name, node=node)
    return _answer(Launched, cmd, await link.request(cmd, on_progress=on_progress))


async def kill(
    link: Requester,
    run_id: str | None = None,
    timeout_s: float | None = None,
    drain_timeout_s: float | None = None,
    on_progress: Progress | None = None,
    ended_ok: bool = False,
) -> Killed:
    """SIGTERM the run's process group (the alive run unless `run_id`), SIGKILL after
    `timeout_s`, then wait up to `drain_timeout_s` for its GPU memory. `ended_ok`: a named
    run that has ended already is the answer (`Killed.not_running`), not an error."""
    cmd = kill_command(run_id, timeout_s, drain_timeout_s, ended_ok)
    return _answer(Killed, cmd, await link.request(cmd, on_progress=on_progress))


async def restart(
    link: Requester,
    run_id: str | None = None,
    timeout_s: float | None = None,
    drain_timeout_s: float | None = None,
    on_progress: Progress | None = None,
    fresh: bool = False,
    node: NodePlace | None = None,
    overrides: list[str] | None = None,
    more_steps: int = 0,
    new_schedule: bool = False,
    release: str | None = None,
) -> Restarted:
    """Kill (when alive), wait for GPU memory, launch the same config and overrides in a new
    run dir, continuing the run's newest good checkpoint (`fresh`: from step 0); the new
    run's first heartbeat is waited for too. `overrides` replace the parent's; `more_steps`
    continues a finished run; `release` launches a release deployed beside `current`, once
    the host has imported it (restart_command)."""
    cmd = restart_command(
        run_id,
        timeout_s,
        drain_timeout_s,
        fresh,
        node,
        overrides,
        more_steps,
        new_schedule,
        release,
    )
    return _answer(Restarted, cmd, await link.request(cmd, on_progress=on_progress))


async def dump_stacks(link: Requester, pyspy: bool = True, run_id: str | None = None) -> Stacks:
    cmd = DumpStacks(run_id=run_id, pyspy=pyspy)
    return _answer(Stacks, cmd, await link.request(cmd))


@dataclasses.dataclass
class Signalled:
    run_id: str
    pid: int
    signal: str
    message: str = ""


async def signal_process(
    link: Requester, pid: int, start: int, signal: str, run_id: str | None = None
) -> Signalled:
    """One signal to one process of the run's group (the thread/process table's row): the
    agent proves the run and the pid's group and start time first, or refuses."""
    cmd = SignalProcess(run_id=run_id, pid=pid, start=start, signal=signal)
    return _answer(Signalled, cmd, await link.request(cmd))


async def clear_cache(link: Requester) -> CacheCleared:
    cmd = ClearCompileCache()
    return _answer(CacheCleared, cmd, await link.request(cmd))


async def export(
    link: Requester, run_id: str | None, step: int | None, dtype: str = "bfloat16"
) -> Exported:
    cmd = ExportDrafter(run_id=run_id, step=step, dtype=dtype)
    return _answer(Exported, cmd, await link.request(cmd))


async def list_runs(link: Requester, store: Store) -> list[RunInfo]:
    """The agent answers with a fresh `runs` event, which the store has folded by then."""
    await link.request(ListRuns())
    return list(store.runs)


async def follow(link: Requester, run_id: str) -> str | None:
    """Follow `run_id` ("latest": the newest run, switching when a new one starts)."""
    cmd = FollowRun(run_id=run_id, from_start=list(FROM_START_FILES))
    return _answer(Followed, cmd, await link.request(cmd)).run_id


async def read_file(
    link: Requester,
    name: str,
    run_id: str | None = None,
    tail_bytes: int = 1 << 20,
    before: int | None = None,
    lines: bool = False,
) -> FileText:
    """The last `tail_bytes` of one of the run's files, or (`before`, `lines`) a page of
    whole lines ending there: a replay pages back through a long telemetry.jsonl."""
    cmd = ReadFile(name=name, run_id=run_id, tail_bytes=tail_bytes, before=before, lines=lines)
    return _answer(FileText, cmd, await link.request(cmd))


@dataclasses.dataclass
class FilePage:
    run_id: str
    name: str
    text: str
    start: int  # the first line's byte offset
    end: int  # the byte after the last line
    size: int  # the file's size as it was read


async def read_page(
    link: Requester,
    name: str,
    run_id: str | None,
    start: int | None = None,
    end: int | None = None,
    max_bytes: int = 1 << 18,
) -> FilePage:
    """The whole lines of `name` within [start, end), at most `max_bytes` (nearest `end`
    when only it is given): a page of a long file, never the file."""
    cmd = ReadFile(name=name, run_id=run_id, tail_bytes=max_bytes, start=start, end=end)
    return _answer(FilePage, cmd, await link.request(cmd))

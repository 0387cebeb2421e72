"""Every command's handler, by its contract record. A handler returns the result's `data` or
raises CommandError with a message for the operator; the loop answers either way.

Handlers are given the agent as `AgentState`: what they read and change of it, declared here.
The loop's Agent has it, and passes itself; this table never imports the loop (the loop
imports the table)."""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any, Protocol

from dflash_tui.agent import artifacts
from dflash_tui.agent.continuation import Continuation, continuation
from dflash_tui.agent.deploy import deploy, make_current, shipped_release
from dflash_tui.agent.errors import CommandError
from dflash_tui.agent.export import export
from dflash_tui.agent.files import Refused, read_after, read_page, read_tail, size_or_zero
from dflash_tui.agent.gpu_reset import gpu_reset
from dflash_tui.agent.gpus import Gpus
from dflash_tui.agent.identity import NotRunning, Proven, prove, signal_process, still
from dflash_tui.agent.kill import kill
from dflash_tui.agent.launch import launch
from dflash_tui.agent.pages import read_page as read_range
from dflash_tui.agent.proc_table import signal_member
from dflash_tui.agent.rank_pyspy import pyspy_ranks
from dflash_tui.agent.rank_stacks import (
    FALLBACK_FILE,
    dump_ranks,
    fresh_named_dump,
    rank_places,
)
from dflash_tui.agent.release_check import check_release, release_env
from dflash_tui.agent.reused_overrides import refuse_reused
from dflash_tui.agent.runs import RunRoot
from trainer.contract.heartbeat import Heartbeat, read_heartbeat
from trainer.contract.nodes import NodePlace
from trainer.contract.protocol import (
    RELEASE_CHECK_S,
    ClearCompileCache,
    Command,
    Deploy,
    Deployed,
    DumpStacks,
    ExportDrafter,
    FollowRun,
    GpuReset,
    Kill,
    Launch,
    ListRuns,
    Ping,
    PullArtifacts,
    PushArtifacts,
    ReadFile,
    Restart,
    SignalProcess,
)
from trainer.contract.records import (
    HEARTBEAT,
    LAUNCH_CONFIG,
    ExitRecord,
    LaunchRecord,
    read_config,
    read_exit,
    read_launch,
)

SAFE_FILE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
STACKS_BYTES = 1 << 22


class AgentState(Protocol):
    """What a handler may use of the agent (loop.Agent): its arguments, run root, GPUs and
    remote dir; what it follows, and how to follow another run or none; its events."""

    args: argparse.Namespace
    runs: RunRoot
    gpus: Gpus
    remote_dir: str
    run_id: str | None  # the run followed now
    follow_target: str | None  # a run id or "latest"; None until asked
    from_start: list[str]  # files followed from byte 0 (FollowRun.from_start)

    def progress(self, cmd: Command, message: str) -> None: ...

    def set_follow(self, run_id: str, offsets: dict[str, int], resumed: bool = False) -> None: ...

    def follow_nothing(self) -> None: ...

    def emit_runs(self, alive: str | None = None, ids: list[str] | None = None) -> None: ...


def _progress(agent: AgentState, cmd: Command) -> Callable[[str], None]:
    return lambda message: agent.progress(cmd, message)


# -- quick: answered inline by the loop --------------------------------------------------------
def ping(agent: AgentState, cmd: Ping) -> dict[str, Any]:
    return {"pong": time.time()}


def follow(agent: AgentState, cmd: FollowRun) -> dict[str, Any]:
    target = cmd.run_id or "latest"
    agent.follow_target = target
    agent.from_start = list(cmd.from_start)  # and for the runs "latest" moves on to
    run_id = agent.runs.latest() if target == "latest" else target
    if run_id is None:
        agent.follow_nothing()
        return {"run_id": None}
    agent.runs.checked_dir(run_id)
    # Offsets from an earlier session apply to the run they were read from only.
    resumed = cmd.offsets_run_id is not None and cmd.offsets_run_id == run_id
    offsets = dict(cmd.offsets) if resumed else {}
    for name in cmd.from_start:
        offsets.setdefault(name, 0)
    agent.set_follow(run_id, offsets, resumed=resumed)
    return {"run_id": run_id}


def list_runs(agent: AgentState, cmd: ListRuns) -> dict[str, Any]:
    agent.emit_runs()
    count = len(agent.runs.run_ids())
    return {"count": count, "refused": agent.runs.refused}


def read_file(agent: AgentState, cmd: ReadFile) -> dict[str, Any]:
    """The end of one file of a run: a regular file directly in a real run dir, never what
    a symlink names (runs.open_in)."""
    if not SAFE_FILE.match(cmd.name):
        raise CommandError(f"bad file name {cmd.name!r}")
    run_id = cmd.run_id or agent.run_id
    if run_id is None:
        raise CommandError("no run to read from")
    run_dir = agent.runs.checked_dir(run_id)
    paged = cmd.start is not None or cmd.end is not None
    try:
        if paged:  # the step log's pages (log_pages.py): whole lines of [start, end)
            page = read_range(run_dir, cmd.name, cmd.start, cmd.end, cmd.tail_bytes or 1 << 20)
            return {"run_id": run_id, "name": cmd.name, **page}
        # the tail, or a replay's page back from `before` (files.read_page)
        text, start, size = read_page(
            run_dir, cmd.name, cmd.tail_bytes or 1 << 20, cmd.before, cmd.lines
        )
    except FileNotFoundError:
        raise CommandError(f"{os.path.join(run_dir, cmd.name)}: no such file") from None
    except OSError as e:
        raise CommandError(f"{os.path.join(run_dir, cmd.name)}: {e.strerror}") from None
    return {"run_id": run_id, "name": cmd.name, "text": text, "start": start, "size": size}


# -- long: each on a thread of its own -------------------------------------------------------
def target_run(agent: AgentState, run_id: str | None, need_alive: bool = True) -> tuple[str, str]:
    """The run a command is about: the one named, else the alive one, else (when it need not
    be alive) the latest -> (its id, its dir: `RunRoot.checked_dir`, the one time the command
    computes it)."""
    run_id = run_id or agent.runs.alive_run()
    if run_id in (None, "?"):
        if need_alive:
            raise CommandError(f"no run is alive under {agent.runs.path}")
        run_id = agent.runs.latest()
        if run_id is None:
            raise CommandError(f"no runs under {agent.runs.path}")
    return run_id, agent.runs.checked_dir(run_id)


def _check_node(node: NodePlace | None) -> None:
    why = None if node is None else node.invalid()
    if why is not None:
        raise CommandError(why, bad_input=True)


def launch_run(agent: AgentState, cmd: Launch) -> dict[str, Any]:
    if not cmd.config_toml.strip():
        raise CommandError("launch needs the config file's text")
    if any("\n" in o for o in cmd.overrides):
        raise CommandError("overrides must be single-line key=value strings")
    _check_node(cmd.node)
    return launch(
        agent.runs,
        agent.remote_dir,
        agent.args.python,
        cmd.config_toml,
        list(cmd.overrides),
        cmd.name or "run",
        cmd.start_timeout_s,
        _progress(agent, cmd),
        node=cmd.node,
    )


def kill_run(agent: AgentState, cmd: Kill) -> dict[str, Any]:
    run_id, run_dir = target_run(agent, cmd.run_id, need_alive=not (cmd.ended_ok and cmd.run_id))
    try:
        proven = prove(agent.runs, run_id, run_dir)  # refuses, signalling nothing
    except NotRunning as e:
        if not cmd.ended_ok:
            raise
        return {"run_id": run_id, "not_running": str(e)}  # nothing signalled: it had ended
    return kill(
        agent.runs, agent.gpus, proven, cmd.timeout_s, cmd.drain_timeout_s, _progress(agent, cmd)
    )


def restart(agent: AgentState, cmd: Restart) -> dict[str, Any]:
    """Kill the run (when alive and proven), then launch its config and overrides again in a
    new run dir: continuing its newest good checkpoint (chosen after the kill, which writes
    one), or from step 0 when `fresh` or when it has none (the answer says which and why).
    `overrides` replace the parent's; `more_steps` continues its final checkpoint that many
    steps further (continuation.py); `release` launches from a release deployed beside
    `current`, once it imports (`_checked_release`), and makes it current. The run's own
    overrides again, when it died before its first step of one, are refused
    (reused_overrides.py)."""
    _check_node(cmd.node)
    if cmd.overrides is not None and any("\n" in o or "=" not in o for o in cmd.overrides):
        raise CommandError("overrides must be single-line key=value strings", bad_input=True)
    if cmd.more_steps and (cmd.fresh or cmd.node is not None):
        raise CommandError("more steps continues a checkpoint: not with fresh, nor a job")
    run_id, run_dir = target_run(agent, cmd.run_id, need_alive=False)
    record = read_launch(run_dir)
    try:
        config_toml = read_tail(run_dir, LAUNCH_CONFIG, 1 << 20)
    except (OSError, Refused):
        config_toml = None
    if not isinstance(record, LaunchRecord) or config_toml is None:
        raise CommandError(f"run {run_id} was not launched by dflash-tui: nothing to restart from")
    # Its own again: refused, nothing stopped, if it died of one. Not for more steps: a run
    # that never trained has no checkpoint to continue, the refusal that says so follows.
    if cmd.overrides is None and not cmd.more_steps:
        refuse_reused(run_id, run_dir, list(record.overrides))
    progress = _progress(agent, cmd)
    release = None if cmd.release is None else _checked_release(agent, cmd.release, progress)
    killed = None
    try:
        proven = prove(agent.runs, run_id, run_dir)
    except NotRunning as e:
        progress(f"{e}; launching it again")
    else:  # alive and proven: kill it first
        killed = kill(agent.runs, agent.gpus, proven, cmd.timeout_s, cmd.drain_timeout_s, progress)
    # Another node than 0 of a job starts fresh from the run's config: node 0 resumes, and
    # its ranks hand the position and the drafter to the others over torch.distributed.
    joins = cmd.node is not None and cmd.node.node_rank != 0
    resume = None if cmd.fresh or joins else agent.runs.resume_point(run_id, run_dir)
    overrides = list(record.overrides if cmd.overrides is None else cmd.overrides)
    more: dict[str, Any] = {}
    if cmd.more_steps:
        if resume is None or resume.name is None:
            raise CommandError(f"run {run_id} has no good checkpoint to continue from")
        c = _continuation(run_dir, resume.step or 0, cmd.more_steps, cmd.new_schedule)
        overrides += c.overrides
        more = {"more_steps": cmd.more_steps, "max_steps": c.max_steps, "lr": c.lr}
        progress(f"continuing to step {c.max_steps}; {c.lr}")
    if resume is not None:
        progress(resume.describe())
    if release is not None:
        make_current(agent.remote_dir, release)
        progress(f"release {release.sha256[:16]} is current")
    started = launch(
        agent.runs,
        agent.remote_dir,
        agent.args.python,
        config_toml,
        overrides,
        record.name or "run",
        cmd.start_timeout_s,
        progress,
        resume=resume,
        node=cmd.node,
        release=None if release is None else release.release,
    )
    if release is not None:
        more["release"] = release.sha256
    return {"killed": killed, "launched": started, "resume": resume, "fresh": cmd.fresh, **more}


def _checked_release(agent: AgentState, sha256: str, progress: Callable[[str], None]) -> Deployed:
    """restart --deploy: the release shipped beside `current`, imported by the python that
    launches use, before anything is stopped; one that does not import is refused (bad
    input: exit 2) and nothing is signalled."""
    folder = shipped_release(agent.remote_dir, sha256)
    python = agent.args.python or os.path.abspath(sys.executable)
    progress(f"import check of release {sha256[:16]} with {python}")
    started = time.monotonic()
    why = check_release(python, folder, release_env(folder), RELEASE_CHECK_S)
    if why is not None:
        raise CommandError(
            f"release {sha256[:16]} does not import, nothing stopped: {why}", bad_input=True
        )
    progress(f"release {sha256[:16]} imports ({time.monotonic() - started:.1f}s)")
    return Deployed(sha256=sha256, release=folder, at=time.time())


def _continuation(run_dir: str, step: int, more: int, new: bool) -> Continuation:
    """The overrides continuing the run in `run_dir` from its checkpoint at `step`: its
    config.json's train section, its total from exit.json, else its heartbeat."""
    config = read_config(run_dir)
    train = config.get("train") if isinstance(config, dict) else None
    ended = read_exit(run_dir)
    total = ended.total_steps if isinstance(ended, ExitRecord) else None
    if total is None:
        hb = read_heartbeat(os.path.join(run_dir, HEARTBEAT))
        total = hb.total_steps if isinstance(hb, Heartbeat) else None
    return continuation(step, total, train if isinstance(train, dict) else {}, more, new)


# The named dump must arrive within NAMED_WAIT_S. A SIGUSR1 that a native library swallowed
# (the trainer's guard puts its handler back within 0.2 s) is sent again after RESEND_S.
NAMED_WAIT_S = 2.0
RESEND_S = 0.6
RANKS_PYSPY_BUDGET_S = 40.0  # py-spy over every rank: inside DumpStacks.client_timeout
_FH_THREAD = re.compile(r"^(Current thread|Thread) (0x[0-9a-f]+)", re.MULTILINE)


def _named_dump(run_dir: str, before: set[str], until: float) -> tuple[str, str] | None:
    while True:
        if (found := fresh_named_dump(run_dir, before, STACKS_BYTES)) is not None:
            return found
        if time.monotonic() >= until:
            return None
        time.sleep(0.02)


def _faulthandler_dump(proc: Proven, wait_s: float) -> str | None:
    """SIGUSR2: faulthandler's C-level dump of every thread (it runs even while the main
    thread is stuck in C code), appended to stacks-sigusr2.txt; what it appended, once the
    file has stopped growing."""
    run_dir = proc.run_dir
    offset = size_or_zero(run_dir, FALLBACK_FILE)
    signal_process(proc, signal.SIGUSR2)
    deadline, text, last = time.monotonic() + wait_s, "", -1
    while time.monotonic() < deadline:
        time.sleep(0.1)
        try:
            text, size = read_after(run_dir, FALLBACK_FILE, offset, STACKS_BYTES)
        except (OSError, Refused):
            continue
        if text and size == last:
            return text
        last = size
    return text or None


def _name_threads(text: str, run_dir: str) -> str:
    """faulthandler names threads by pthread id only: add each one's name and role from the
    heartbeat (the trainer records the ids there)."""
    hb = read_heartbeat(os.path.join(run_dir, HEARTBEAT))
    names = {}
    if isinstance(hb, Heartbeat):
        names = {t.ident: t for t in hb.threads if t.ident}

    def label(m: re.Match[str]) -> str:
        t = names.get(int(m.group(2), 16))
        tag = f' "{t.name}" role={t.role}@{t.device} ({t.state})' if t else ""
        return f"{m.group(1)} {m.group(2)}{tag}"

    return _FH_THREAD.sub(label, text)


def dump_stacks(agent: AgentState, cmd: DumpStacks) -> dict[str, Any]:
    """The named Python stacks of every thread (SIGUSR1, within NAMED_WAIT_S); when they do
    not come, faulthandler's C-level dump with the threads named (SIGUSR2); py-spy's native
    view too when it is installed."""
    run_id, run_dir = target_run(agent, cmd.run_id, need_alive=False)
    proc = prove(agent.runs, run_id, run_dir)
    t0 = time.monotonic()
    if places := rank_places(run_dir):  # processes mode: the launcher passes it on
        ranks_text, kind = dump_ranks(proc, places, cmd.timeout_s)
        answer: dict[str, Any] = {
            "run_id": run_id,
            "pid": proc.pid,
            "path": run_dir,
            "text": ranks_text,
            "kind": kind,
            "seconds": round(time.monotonic() - t0, 3),
        }
        if cmd.pyspy and shutil.which("py-spy") and still(proc):
            # Each rank attached to only once proven the launcher's child (rank_pyspy.py).
            answer["pyspy"] = pyspy_ranks(proc, places, RANKS_PYSPY_BUDGET_S)
        return answer
    before = set(os.listdir(run_dir))
    named_until = t0 + min(cmd.timeout_s, NAMED_WAIT_S)
    signal_process(proc, signal.SIGUSR1)  # the trainer writes stacks-<time>.txt
    found = _named_dump(run_dir, before, min(named_until, t0 + RESEND_S))
    if found is None and still(proc):
        signal_process(proc, signal.SIGUSR1)
        found = _named_dump(run_dir, before, named_until)
    result: dict[str, Any] = {"run_id": run_id, "pid": proc.pid}
    if found is not None:
        result.update(path=os.path.join(run_dir, found[0]), text=found[1], kind="named")
    else:
        text = _faulthandler_dump(proc, max(1.0, cmd.timeout_s - NAMED_WAIT_S))
        if text is None:
            raise CommandError(
                f"no stack dump from pid {proc.pid}: no named dump within {NAMED_WAIT_S:.0f}s "
                f"(SIGUSR1) and nothing from faulthandler (SIGUSR2); try py-spy dump --native"
            )
        result.update(
            path=os.path.join(run_dir, FALLBACK_FILE),
            kind="faulthandler",
            text=(
                f"# no named dump within {NAMED_WAIT_S:.0f}s (the main thread did not run its "
                "SIGUSR1 handler: busy or stuck in C code?): faulthandler's C-level dump, "
                "threads named from the heartbeat\n" + _name_threads(text, run_dir)
            ),
        )
    result["seconds"] = round(time.monotonic() - t0, 3)
    if cmd.pyspy and shutil.which("py-spy") and still(proc):  # py-spy attaches by pid
        r = subprocess.run(
            ["py-spy", "dump", "--native", "--pid", str(proc.pid)],
            check=False,
            capture_output=True,
            text=True,
            timeout=30,
        )
        result["pyspy"] = r.stdout + r.stderr
    return result


def signal_member_process(agent: AgentState, cmd: SignalProcess) -> dict[str, Any]:
    """One signal to one process of the run's proven group (a row of the thread/process
    table); refused, signalling nothing, unless proc_table.signal_member's checks hold."""
    run_id = cmd.run_id or agent.run_id
    if run_id is None:
        raise CommandError("no run is followed: whose process?")
    message = signal_member(agent.runs, run_id, cmd.pid, cmd.start, cmd.signal)
    return {"run_id": run_id, "pid": cmd.pid, "signal": cmd.signal, "message": message}


def compile_cache_dir() -> str:
    """Where the trainer keeps its compile cache (trainer's DFLASH_CACHE_DIR rule)."""
    base = os.environ.get("DFLASH_CACHE_DIR")
    if not base:
        xdg = os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache")
        base = os.path.join(xdg, "dflash-tui")
    return os.path.join(base, "compile")


def clear_compile_cache(agent: AgentState, cmd: ClearCompileCache) -> dict[str, Any]:
    alive = agent.runs.alive_run()
    if alive:
        raise CommandError(f"run {alive} is alive: it uses the compile cache; kill it first")
    path = compile_cache_dir()
    if not os.path.isdir(path):
        return {"path": path, "bytes": 0, "existed": False}
    size = 0
    for root, _dirs, files in os.walk(path):
        for name in files:
            with contextlib.suppress(OSError):
                size += os.lstat(os.path.join(root, name)).st_size
    shutil.rmtree(path)
    return {"path": path, "bytes": size, "existed": True}


def deploy_release(agent: AgentState, cmd: Deploy) -> Any:
    return deploy(agent.remote_dir, cmd)


def pull_artifacts(agent: AgentState, cmd: PullArtifacts) -> dict[str, Any]:
    return artifacts.pull(os.path.join(compile_cache_dir(), "artifacts"), cmd)


def push_artifacts(agent: AgentState, cmd: PushArtifacts) -> dict[str, Any]:
    return artifacts.push(agent.remote_dir, cmd)


def reset_gpu(agent: AgentState, cmd: GpuReset) -> dict[str, Any]:
    return gpu_reset(agent.gpus, agent.runs.alive_run(), cmd.index, cmd.timeout_s)


def export_drafter(agent: AgentState, cmd: ExportDrafter) -> dict[str, Any]:
    run_id, run_dir = target_run(agent, cmd.run_id, need_alive=False)
    return export(agent.remote_dir, agent.args.python, run_id, run_dir, cmd)


HANDLERS: dict[type[Command], Callable[[AgentState, Any], Any]] = {
    Ping: ping,
    FollowRun: follow,
    ListRuns: list_runs,
    ReadFile: read_file,
    Launch: launch_run,
    Kill: kill_run,
    Restart: restart,
    DumpStacks: dump_stacks,
    ClearCompileCache: clear_compile_cache,
    Deploy: deploy_release,
    PullArtifacts: pull_artifacts,
    PushArtifacts: push_artifacts,
    ExportDrafter: export_drafter,
    SignalProcess: signal_member_process,
    GpuReset: reset_gpu,
}

"""Starting a run: a fresh run dir, launch.json, and the detached wrapper, all under the run
root's launch lock (a second launch while a run lives is refused by the kernel, not a guess).

The lock is taken here and handed down: the wrapper inherits the descriptor and passes it to
the trainer, so the kernel releases it when the last of them exits, even on SIGKILL.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from dflash_tui.agent.artifacts import SHIPPED_DIR
from dflash_tui.agent.errors import CommandError
from dflash_tui.agent.files import tail_or_empty
from dflash_tui.agent.release_check import release_env
from dflash_tui.agent.runs import RunRoot, take_lock
from dflash_tui.agent.wrap import EXIT_COULD_NOT_START, record_exit
from trainer.contract.checkpoints import ResumePoint
from trainer.contract.nodes import MASTER_ENV, NODE_RANK_ENV, NODES_ENV, NodePlace
from trainer.contract.records import (
    HEARTBEAT,
    LAUNCH_CONFIG,
    LAUNCH_LOG,
    TRAIN_LOG,
    ExitRecord,
    LaunchRecord,
    read_exit,
    write_launch,
)

AGENT_FILE = "dflash_agent.py"  # the agent bundle in a release (deploy writes it)
ARTIFACTS_ENV = "DFLASH_COMPILE_ARTIFACTS"  # trainer/runtime/compile/artifacts.py reads it


def release_dir(remote_dir: str) -> str:
    cur = os.path.join(remote_dir, "current")
    if not os.path.isfile(os.path.join(cur, "trainer", "__main__.py")):
        raise CommandError(f"nothing deployed in {remote_dir}: run `dflash-tui deploy` first")
    return os.path.realpath(cur)


def launch(
    runs: RunRoot,
    remote_dir: str,
    python: str | None,
    config_toml: str,
    overrides: list[str],
    name: str,
    start_timeout_s: float,
    progress: Callable[[str], None],
    resume: ResumePoint | None = None,
    node: NodePlace | None = None,
    release: str | None = None,
) -> dict[str, Any]:
    """`resume`: continue that run's checkpoint (`--resume` its run dir: the trainer applies
    the same rule to the same files, and continues the step counter, LR and data order).
    `node`: one host of a job over several: the run dir is `node.run_id` (refused if it is
    there), and the trainer's environment names its place (trainer/distributed/nodes.py).
    `release`: this release's folder (restart --deploy's, checked) instead of `current`'s."""
    if resume is not None and resume.name is None:
        resume = None  # no good checkpoint: a fresh start
    release = release or release_dir(remote_dir)
    os.makedirs(runs.path, exist_ok=True)
    lock_fd = runs.open_lock(create=True)
    try:
        if not take_lock(lock_fd, tries=25):
            alive = runs.active_run() or "?"
            raise CommandError(f"run {alive} is alive under {runs.path}: kill it first")
        if node is None:
            run_id, run_dir = runs.new_run_dir(name)
        else:
            run_id, run_dir = node.run_id, runs.named_run_dir(node.run_id)
        config_path = os.path.join(run_dir, LAUNCH_CONFIG)
        with open(config_path, "w") as f:
            f.write(config_toml)
        # Absolute: the wrapper runs from the release folder (a PATH entry like .venv/bin
        # makes sys.executable relative).
        python = python or os.path.abspath(sys.executable)
        argv = [python, "-m", "trainer", "--config", config_path, "--run-dir", run_dir]
        if resume is not None:
            argv += ["--resume", runs.run_dir(resume.run_id)]
        for o in overrides:
            argv += ["--set", o]
        write_launch(
            run_dir,
            LaunchRecord(
                run_id=run_id,
                argv=argv,
                overrides=overrides,
                name=name,
                python=python,
                release=release,
                launched_at=time.time(),
                agent_pid=os.getpid(),
                resumed_from=resume.run_id if resume else None,
                checkpoint=resume.name if resume else None,
                node=node,
            ),
        )
        wrapper = [
            python,
            "-u",
            os.path.join(release, AGENT_FILE),
            "wrap",
            "--run-dir",
            run_dir,
            "--lock-fd",
            str(lock_fd),
            "--cwd",
            release,
            "--",
            *argv,
        ]
        env = release_env(release)  # what restart --deploy's import check ran with
        env["PYTHONUNBUFFERED"] = "1"
        # A node's place comes from the command alone: one inherited from the agent's own
        # environment would make a one-host run wait for peers that never come.
        for key in (NODES_ENV, NODE_RANK_ENV, MASTER_ENV):
            env.pop(key, None)
        if node is not None:
            env.update(node.environment())
        # Compile-cache artifacts deploy shipped: a fresh host's first run starts warm.
        env.setdefault(ARTIFACTS_ENV, os.path.join(remote_dir, SHIPPED_DIR))
        with open(os.path.join(run_dir, LAUNCH_LOG), "ab") as log:
            try:
                proc = subprocess.Popen(
                    wrapper,
                    cwd=release,
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                    pass_fds=(lock_fd,),
                    env=env,
                )
            except OSError as e:
                why = f"could not start {python}: {e}"
                log.write(f"{why}\n".encode())
                record_exit(run_dir, EXIT_COULD_NOT_START, error=why)
                raise CommandError(why) from None
        runs.set_active(run_id, proc.pid)
    finally:
        os.close(lock_fd)  # the wrapper (and the trainer) hold the lock now
    threading.Thread(target=proc.wait, daemon=True).start()  # reap it: never a zombie
    progress(f"launched {run_id}, waiting for the trainer to start")
    return wait_started(run_id, run_dir, start_timeout_s)


def bad_input_lines(ended: object, run_dir: str) -> list[str]:
    """The trainer's `error:` lines when it refused its input (exit 2, trainer/__main__.py:
    one per bad --set), else none."""
    if not isinstance(ended, ExitRecord) or ended.exit_code != 2:
        return []
    log = tail_or_empty(run_dir, TRAIN_LOG, 8000)
    return [ln.removeprefix("error: ") for ln in log.splitlines() if ln.startswith("error: ")]


def wait_started(run_id: str, run_dir: str, timeout: float) -> dict[str, Any]:
    """Report a run that dies before its first heartbeat at once, with its output."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        ended = read_exit(run_dir)
        if ended is not None:
            bad = bad_input_lines(ended, run_dir)
            if bad:  # a bad config or --set (a restart reuses the launch's): a line each
                raise CommandError("\n".join(f"run {run_id}: {b}" for b in bad), bad_input=True)
            how = ended.describe() if isinstance(ended, ExitRecord) else str(ended)
            launch_log = tail_or_empty(run_dir, LAUNCH_LOG, 4000).rstrip()
            train_log = tail_or_empty(run_dir, TRAIN_LOG, 8000).rstrip()
            raise CommandError(
                f"run {run_id} exited at start ({how})\n--- launch.log\n{launch_log}\n"
                f"--- train.log\n{train_log}"
            )
        if os.path.exists(os.path.join(run_dir, HEARTBEAT)):
            return {"run_id": run_id, "run_dir": run_dir, "started": True}
        time.sleep(0.05)
    return {
        "run_id": run_id,
        "run_dir": run_dir,
        "started": False,
        "note": f"no heartbeat after {timeout:.0f} s; still starting?",
    }

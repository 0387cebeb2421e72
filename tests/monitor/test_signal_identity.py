"""Hostile input on the host, through the real agent: a finished run whose pid now
names an unrelated process, symlinks planted in the run root, FIFOs where files should be.

Every process here is real. The unrelated process is a Python child that writes down every
signal it receives, so "never signalled" is read from the process itself, not assumed.
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from test_agent import agent_factory  # noqa: F401  (a fixture)

ROOT = Path(__file__).resolve().parents[2]
OLD = "20260101-000000-old-0000"

# Writes every signal it gets to argv[1]; on SIGUSR1 it answers as the trainer does (a
# stacks-<time>.txt ending in "# faulthandler", in argv[2]); SIGTERM ends it when argv[3] is
# "exit". "ready" goes to argv[1] once the handlers are in place.
RECORDER = r"""
import os, signal, sys, time
log, run_dir, on_term = sys.argv[1], sys.argv[2], sys.argv[3]
def note(sig, frame):
    with open(log, "a") as f:
        f.write(signal.Signals(sig).name + "\n")
    if sig == signal.SIGUSR1:
        name = time.strftime("stacks-%Y%m%d-%H%M%S.txt")
        with open(os.path.join(run_dir, name), "w") as f:
            f.write('Thread "main"\n# faulthandler\n')
    if sig == signal.SIGTERM and on_term == "exit":
        sys.exit(0)
for s in (signal.SIGTERM, signal.SIGUSR1, signal.SIGUSR2, signal.SIGINT, signal.SIGHUP):
    signal.signal(s, note)
with open(log, "a") as f:
    f.write("ready\n")
while True:
    time.sleep(0.05)
"""


class Recorder:
    """A real process in a session (so a process group) of its own, recording its signals."""

    def __init__(
        self, where: Path, run_dir: Path, on_term: str = "record", pass_fds: tuple[int, ...] = ()
    ) -> None:
        self.log = where
        self.proc = subprocess.Popen(
            [sys.executable, "-c", RECORDER, str(where), str(run_dir), on_term],
            start_new_session=True,
            pass_fds=pass_fds,
        )
        deadline = time.monotonic() + 10
        while "ready" not in self.text():
            assert time.monotonic() < deadline, "the recorder did not start"
            time.sleep(0.02)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def text(self) -> str:
        try:
            return self.log.read_text()
        except FileNotFoundError:
            return ""

    def signals(self) -> list[str]:
        return [line for line in self.text().split() if line != "ready"]

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stop(self) -> None:
        if self.alive():
            self.proc.kill()
        self.proc.wait(10)


def proc_start(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19])


def write_run(
    root: Path,
    run_id: str,
    pid: int,
    start: int | None,
    *,
    ended_ago_s: float | None = None,
    launched: bool = True,
    schema: int = 2,
) -> Path:
    """A run dir as the wrapper and the trainer leave it: launch.json (pid, pgid, proc_start),
    the shipped config, a heartbeat naming the same process, and exit.json when it ended."""
    d = root / run_id
    d.mkdir(parents=True)
    (d / "config.json").write_text(json.dumps({"name": "old", "run": {"created": time.time()}}))
    if launched:
        record = {"run_id": run_id, "argv": ["python", "-m", "trainer"], "name": "old"}
        record |= {"pid": pid, "pgid": pid, "proc_start": start, "launched_at": time.time()}
        (d / "launch.json").write_text(json.dumps(record))
        (d / "launch-config.toml").write_text("[train]\nmax_steps = 10\n")
    hb: dict[str, Any] = {"schema": schema, "run_id": run_id, "pid": pid, "process_group": pid}
    hb |= {"host": socket.gethostname(), "now": time.time(), "phase": "training"}
    if schema >= 2:
        hb["proc_start"] = start
    (d / "heartbeat.json").write_text(json.dumps(hb))
    (d / "train.log").write_text("step 1\n")
    if ended_ago_s is not None:
        ended = time.time() - ended_ago_s
        exit_record = {"run_id": run_id, "exit_code": 0, "started_at": ended - 60}
        exit_record |= {"ended_at": ended, "final_phase": "stopped", "step": 5}
        (d / "exit.json").write_text(json.dumps(exit_record))
    return d


@pytest.fixture
def recorders(tmp_path: Path) -> Iterator[list[Recorder]]:
    made: list[Recorder] = []
    yield made
    for r in made:
        r.stop()


def one_line(text: str) -> str:
    assert text and "\n" not in text.strip(), text
    return text.strip()


# -- signals only to the run that is alive ----------------------------------------------------
def test_a_finished_runs_pid_now_another_process_is_never_signalled(
    agent_factory,  # noqa: F811
    recorders,
    tmp_path,
):
    root = tmp_path / "runs"
    root.mkdir()
    stranger = Recorder(tmp_path / "stranger.log", tmp_path)
    recorders.append(stranger)
    pid = stranger.pid
    # The finished run was pid/pgid `pid` too, an earlier process: another start time.
    write_run(root, OLD, pid, proc_start(pid) - 500, ended_ago_s=3 * 3600)
    agent = agent_factory(root)

    for cmd in (
        {"cmd": "kill", "run_id": OLD, "timeout_s": 2, "drain_timeout_s": 1},
        {"cmd": "dump_stacks", "run_id": OLD, "timeout_s": 2, "pyspy": True},
    ):
        got = agent.request(cmd)
        assert got["ok"] is False, got
        error = one_line(got["error"])
        assert error.startswith(f"run {OLD} ended 3h ago"), error
        assert f"pid {pid} is another process now" in error and "not signalled" in error

    # Restart: nothing of the run lives, so it goes straight to launching (nothing is deployed
    # here, so the launch itself is what fails).
    n = len(agent.seen)
    got = agent.request({"cmd": "restart", "run_id": OLD, "timeout_s": 2})
    progress = [e["message"] for e in agent.seen[n:] if e["type"] == "progress"]
    assert any("not signalled; launching it again" in m for m in progress), progress
    assert got["ok"] is False and "nothing deployed" in got["error"]

    time.sleep(0.3)  # a signal in flight would have landed by now
    assert stranger.alive() and stranger.signals() == []


def test_a_vanished_run_whose_pid_is_reused_is_not_running(
    agent_factory,  # noqa: F811
    recorders,
    tmp_path,
):
    """No exit.json (the run was SIGKILLed with its wrapper): the start time alone tells."""
    root = tmp_path / "runs"
    root.mkdir()
    stranger = Recorder(tmp_path / "stranger.log", tmp_path)
    recorders.append(stranger)
    write_run(root, OLD, stranger.pid, proc_start(stranger.pid) - 500)
    agent = agent_factory(root)
    got = agent.request({"cmd": "kill", "run_id": OLD, "timeout_s": 2, "drain_timeout_s": 1})
    error = one_line(got["error"])
    assert error.startswith(f"run {OLD} is not running; pid {stranger.pid} is another process")
    assert stranger.alive() and stranger.signals() == []


@pytest.mark.parametrize(("schema", "launched"), [(1, False), (2, True)])
def test_no_recorded_start_time_proves_nothing(
    agent_factory,  # noqa: F811
    recorders,
    tmp_path,
    schema,
    launched,
):
    """A live process at the recorded pid, but no start time on record (an older trainer's
    heartbeat, a launch.json without proc_start): refused, never guessed."""
    root = tmp_path / "runs"
    root.mkdir()
    live = Recorder(tmp_path / "live.log", root / OLD)
    recorders.append(live)
    write_run(root, OLD, live.pid, None, launched=launched, schema=schema)
    agent = agent_factory(root)
    for cmd in (
        {"cmd": "kill", "run_id": OLD, "timeout_s": 2, "drain_timeout_s": 1},
        {"cmd": "dump_stacks", "run_id": OLD, "timeout_s": 2},
        {"cmd": "restart", "run_id": OLD, "timeout_s": 2},
    ):
        got = agent.request(cmd)
        assert got["ok"] is False
        error = one_line(got["error"])
        if cmd["cmd"] == "restart" and not launched:  # started by hand: no config to reuse
            assert "not launched by dflash-tui" in error
            continue
        assert f"no start time is recorded for pid {live.pid}" in error, error
        assert "not signalled" in error
    assert live.alive() and live.signals() == []


def _locked_run(root: Path, tmp_path: Path, recorders: list[Recorder], hold: bool) -> Recorder:
    """A launched run whose process is real and, when `hold`, holds the launch lock as a
    launched trainer does (the agent's descriptor, handed down)."""
    root.mkdir(parents=True, exist_ok=True)
    lock = os.open(root / ".launch.lock", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        if hold:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        run = Recorder(tmp_path / "run.log", root / OLD, "exit", pass_fds=(lock,) if hold else ())
    finally:
        os.close(lock)
    recorders.append(run)
    (root / ".active.json").write_text(json.dumps({"run_id": OLD}))
    write_run(root, OLD, run.pid, proc_start(run.pid))
    return run


def test_the_live_run_holding_its_lock_is_dumped_and_killed(
    agent_factory,  # noqa: F811
    recorders,
    tmp_path,
):
    root = tmp_path / "runs"
    run = _locked_run(root, tmp_path, recorders, hold=True)
    agent = agent_factory(root)
    dump = agent.request({"cmd": "dump_stacks", "run_id": OLD, "timeout_s": 10, "pyspy": False})
    assert dump["ok"], dump
    assert dump["data"]["pid"] == run.pid and "# faulthandler" in dump["data"]["text"]
    assert run.signals() == ["SIGUSR1"]
    killed = agent.request({"cmd": "kill", "timeout_s": 10, "drain_timeout_s": 1})
    assert killed["ok"], killed
    assert killed["data"]["run_id"] == OLD and killed["data"]["signal"] == "SIGTERM"
    assert killed["data"]["pids"] == [run.pid] and killed["data"]["orphans"] == []
    run.proc.wait(10)
    assert run.signals() == ["SIGUSR1", "SIGTERM"]


def test_a_launched_run_whose_process_does_not_hold_the_lock_is_not_signalled(
    agent_factory,  # noqa: F811
    recorders,
    tmp_path,
):
    """The right pid and start time but not the launch lock: not proven, refused."""
    root = tmp_path / "runs"
    run = _locked_run(root, tmp_path, recorders, hold=False)
    agent = agent_factory(root)
    got = agent.request({"cmd": "kill", "run_id": OLD, "timeout_s": 2, "drain_timeout_s": 1})
    error = one_line(got["error"])
    assert f"pid {run.pid} does not hold {root / '.launch.lock'}" in error
    assert run.alive() and run.signals() == []


def test_a_forged_heartbeat_naming_a_stranger_is_refused_and_the_stranger_lives(
    agent_factory,  # noqa: F811
    tmp_path,
):
    """No launch.json: a heartbeat naming a stranger (a real `sleep`) by its pid, start time
    and group, all readable from /proc. It holds no launch lock, so nothing proves it is the
    run: kill and dump-stacks refuse in one line, through the agent and the CLI, and it lives."""
    root = tmp_path / "runs"
    root.mkdir()
    stranger = subprocess.Popen(["sleep", "300"], start_new_session=True)
    try:
        write_run(root, OLD, stranger.pid, proc_start(stranger.pid), launched=False)
        agent = agent_factory(root)
        assert agent.runs()[OLD]["alive"]  # it looks alive: only the lock tells it apart
        refusal = f"pid {stranger.pid} does not hold {root / '.launch.lock'}"
        for cmd in (
            {"cmd": "kill", "run_id": OLD, "timeout_s": 2, "drain_timeout_s": 1},
            {"cmd": "dump_stacks", "run_id": OLD, "timeout_s": 2, "pyspy": False},
        ):
            got = agent.request(cmd)
            error = one_line(got["error"])
            assert got["ok"] is False and refusal in error and error.endswith("not signalled")
        where = ["local", "--run-root", str(root), "--remote-dir", str(tmp_path / "remote")]
        r = subprocess.run(
            [sys.executable, "-m", "dflash_tui", "kill", *where, "--run", OLD, "--timeout", "2"],
            capture_output=True,
            text=True,
            timeout=60,
            cwd=ROOT,
        )
        assert r.returncode != 0 and refusal in one_line(r.stderr), r
        time.sleep(0.2)
        assert stranger.poll() is None, "the stranger was signalled"
    finally:
        stranger.kill()
        stranger.wait()


# A processes-mode job started by hand: the torchrun launcher holds the lock, and the job's
# heartbeat names the writer rank, its child in the same group. Prints the child's pid.
LOCK_HOLDING_LAUNCHER = r"""
import fcntl, os, subprocess, sys
fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o644)
fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
child = subprocess.Popen(["sleep", "300"])  # close_fds: the rank does not hold the lock
print(child.pid, flush=True)
child.wait()
"""


def test_a_job_by_hand_is_proven_by_its_launcher_holding_the_lock(
    agent_factory,  # noqa: F811
    tmp_path,
):
    root = tmp_path / "runs"
    root.mkdir()
    launcher = subprocess.Popen(
        [sys.executable, "-c", LOCK_HOLDING_LAUNCHER, str(root / ".launch.lock")],
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        assert launcher.stdout is not None
        rank = int(launcher.stdout.readline())
        d = write_run(root, OLD, rank, proc_start(rank), launched=False)
        hb = json.loads((d / "heartbeat.json").read_text())
        (d / "heartbeat.json").write_text(json.dumps({**hb, "pgid": launcher.pid}))
        agent = agent_factory(root)
        got = agent.request({"cmd": "kill", "run_id": OLD, "timeout_s": 10, "drain_timeout_s": 1})
        assert got["ok"], got
        assert sorted(got["data"]["pids"]) == sorted([launcher.pid, rank])
        assert launcher.wait(10) is not None
    finally:
        if launcher.poll() is None:
            launcher.kill()
        launcher.wait()


def test_a_trainer_started_by_hand_holds_the_launch_lock(agent_factory, tmp_path):  # noqa: F811
    """`python -m trainer` started by hand takes the run root's launch lock as a launch does:
    a second one there is refused in one line (exit 2), and the agent proves the first by the
    lock and kills it."""
    root = tmp_path / "runs"
    tiny = ROOT / "trainer" / "configs" / "tiny-cpu.toml"
    argv = [sys.executable, "-m", "trainer", "--config", str(tiny), "--run-root", str(root)]
    argv += ["--max-steps", "100000", "--set", "runtime.wandb_mode=disabled"]
    out = open(tmp_path / "trainer.out", "wb")  # noqa: SIM115  (closed below)
    trainer = subprocess.Popen(argv, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT,
                               start_new_session=True)  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        while not list(root.glob("*/heartbeat.json")):
            assert trainer.poll() is None, (tmp_path / "trainer.out").read_text()
            assert time.monotonic() < deadline, "no heartbeat"
            time.sleep(0.1)
        (run_dir,) = [p for p in root.iterdir() if p.is_dir()]
        assert json.loads((root / ".active.json").read_text())["run_id"] == run_dir.name
        second = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=120)
        assert second.returncode == 2, second
        line = one_line(second.stderr)
        assert line == (
            f'error: "{root}": run {run_dir.name} is alive there (it holds .launch.lock): '
            "one run per run root; stop it or use another"
        )
        assert [p for p in root.iterdir() if p.is_dir()] == [run_dir]  # no run dir made
        agent = agent_factory(root)
        killed = agent.request({"cmd": "kill", "run_id": run_dir.name, "timeout_s": 60})
        assert killed["ok"], killed
        assert killed["data"]["pids"][0] == trainer.pid
        assert trainer.wait(60) is not None
    finally:
        if trainer.poll() is None:
            trainer.kill()
        trainer.wait()
        out.close()


def test_the_cli_refuses_in_one_line_and_signals_nothing(recorders, tmp_path):
    """`dflash-tui kill local --run OLD` and `dflash-tui dump-stacks` as an operator runs them."""
    root = tmp_path / "runs"
    root.mkdir()
    stranger = Recorder(tmp_path / "stranger.log", tmp_path)
    recorders.append(stranger)
    write_run(root, OLD, stranger.pid, proc_start(stranger.pid) - 500, ended_ago_s=3 * 3600)
    where = ["local", "--run-root", str(root), "--remote-dir", str(tmp_path / "remote")]
    for argv in (
        ["kill", *where, "--run", OLD, "--timeout", "2"],
        ["dump-stacks", *where, "--run", OLD],
        ["dump-stacks", *where],  # the latest run, by default
    ):
        r = subprocess.run(
            [sys.executable, "-m", "dflash_tui", *argv],
            capture_output=True,
            text=True,
            timeout=60,
            cwd=ROOT,
        )
        assert r.returncode != 0, r
        line = one_line(r.stderr)
        assert line.startswith(f"dflash-tui: run {OLD} ended 3h ago"), line
        assert f"pid {stranger.pid} is another process now" in line
        assert line.endswith("not signalled")
    assert stranger.alive() and stranger.signals() == []


# -- nothing outside the run root, and no FIFO stalls the agent --------------------------------
def test_symlinks_planted_in_the_run_root_are_refused_not_followed(
    agent_factory,  # noqa: F811
    tmp_path,
):
    secret = tmp_path / "outside"
    secret.mkdir()
    (secret / "config.json").write_text(json.dumps({"name": "secret"}))
    (secret / "train.log").write_text("SECRET LINE\n")
    (secret / "heartbeat.json").write_text(json.dumps({"schema": 2, "run_id": "x", "now": 1.0}))
    root = tmp_path / "runs"
    root.mkdir()
    (root / "evil").symlink_to(secret)  # runs/evil -> a folder outside
    good = root / "20260101-000000-good-0000"
    good.mkdir()
    (good / "config.json").write_text(json.dumps({"name": "good", "run": {"created": 1.0}}))
    (good / "train.log").symlink_to(secret / "train.log")  # train.log -> a file outside
    (good / "heartbeat.json").symlink_to(secret / "heartbeat.json")
    (good / "metrics.jsonl").symlink_to("/etc/passwd")
    agent = agent_factory(root)

    n = len(agent.seen)
    listed = agent.request({"cmd": "list_runs"})
    runs = next(e for e in agent.seen[n:] if e["type"] == "runs")["runs"]
    assert [r["run_id"] for r in runs] == [good.name]  # evil is no run
    assert listed["data"]["refused"] == {"evil": f"a symlink to {secret}: not a run, not followed"}
    # named, never read through
    assert runs[0]["unreadable"] == ["heartbeat.json", "metrics.jsonl", "train.log"]

    for run_id, name in (
        ("evil", "train.log"),
        (good.name, "train.log"),
        (good.name, "metrics.jsonl"),
    ):
        got = agent.request({"cmd": "read_file", "run_id": run_id, "name": name})
        assert got["ok"] is False and "refused" in one_line(got["error"]), got
        assert "SECRET" not in got["error"] and "root:" not in got["error"]
    said = agent.wait(lambda e: e["type"] == "log" and "evil" in e["message"])
    assert said["message"] == f"{root / 'evil'} is a symlink to {secret}: not a run, not followed"
    evil = agent.request({"cmd": "follow", "run_id": "evil"})
    assert evil["ok"] is False
    assert (
        one_line(evil["error"]) == f"{root / 'evil'} is a symlink to {secret}: not a run, refused"
    )

    assert agent.request({"cmd": "follow", "run_id": good.name})["ok"]
    warning = agent.wait(lambda e: e["type"] == "log" and "train.log" in e["message"])
    assert warning["message"] == (
        f"{good / 'train.log'} is a symlink to {secret / 'train.log'}: refused, not followed"
    )
    hb = agent.wait(lambda e: e["type"] == "heartbeat_error")
    assert hb["error"] == "heartbeat.json unreadable: a symlink: refused, not followed"
    time.sleep(1.0)  # a few polls
    seen = json.dumps(agent.seen)
    assert "SECRET" not in seen and "root:x:" not in seen
    assert not any(e["type"] in ("line", "heartbeat") for e in agent.seen)


def test_planted_checkpoints_are_refused_not_followed(agent_factory, tmp_path):  # noqa: F811
    """What a restart would resume from, in the runs list: a checkpoint or sidecar that is a
    symlink is not followed (the checkpoint is refused and named; the sidecar counts as none,
    so the trainer checks the file itself), a FIFO sidecar does not block, and a
    `checkpoints` symlink is refused whatever it names."""
    secret = tmp_path / "outside"
    secret.mkdir()
    good_meta = {"step": 30, "file": "step-00000030.pt", "finite": True, "loss": 1.0}
    (secret / "step-00000030.json").write_text(json.dumps(good_meta))
    (secret / "step-00000030.pt").write_bytes(b"PK")
    root = tmp_path / "runs"
    run = root / "20260101-000000-ckpt-0000"
    ckpts = run / "checkpoints"
    ckpts.mkdir(parents=True)
    (run / "config.json").write_text(json.dumps({"name": "ckpt", "run": {"created": 1.0}}))
    (ckpts / "step-00000030.pt").symlink_to(secret / "step-00000030.pt")
    (ckpts / "step-00000020.pt").write_bytes(b"PK")
    (ckpts / "step-00000020.json").symlink_to(secret / "step-00000030.json")
    (ckpts / "step-00000010.pt").write_bytes(b"PK")
    os.mkfifo(ckpts / "step-00000010.json")
    planted = root / "20260101-000001-planted-0000"
    planted.mkdir()
    (planted / "config.json").write_text(json.dumps({"name": "p", "run": {"created": 2.0}}))
    (planted / "checkpoints").symlink_to(secret)
    agent = agent_factory(root)

    listed = agent.runs()
    assert listed[run.name]["resume"] == {
        "run_id": run.name,
        "name": "checkpoints/step-00000020.pt",  # its sidecar not read: the trainer checks it
        "step": 20,
        "verified": False,
        "skipped": [{"name": "checkpoints/step-00000030.pt", "why": "a symlink: refused"}],
    }
    (ckpts / "step-00000020.pt").unlink()  # the FIFO sidecar next: no blocking, no sidecar
    assert agent.runs()[run.name]["resume"]["name"] == "checkpoints/step-00000010.pt"
    resume = listed[planted.name]["resume"]
    assert resume["name"] is None and len(resume["skipped"]) == 1
    assert resume["skipped"][0]["why"] == (
        f"{planted / 'checkpoints'} is a symlink to {secret}: refused, not followed"
    )


def test_fifos_never_block_the_agent(agent_factory, tmp_path):  # noqa: F811
    root = tmp_path / "runs"
    run = root / "20260101-000000-fifo-0000"
    run.mkdir(parents=True)
    (run / "config.json").write_text(json.dumps({"name": "fifo", "run": {"created": 1.0}}))
    for name in ("train.log", "metrics.jsonl", "heartbeat.json", "exit.json", "launch.json"):
        os.mkfifo(run / name)
    os.mkfifo(root / ".launch.lock")
    os.mkfifo(root / ".active.json")
    agent = agent_factory(root)
    t0 = time.monotonic()
    runs = agent.runs()  # heartbeat, exit, launch, metrics and the lock are all FIFOs
    assert set(runs) == {run.name}
    assert sorted(runs[run.name]["unreadable"]) == [
        "exit.json",
        "heartbeat.json",
        "launch.json",
        "metrics.jsonl",
        "train.log",
    ]
    got = agent.request({"cmd": "read_file", "run_id": run.name, "name": "train.log"}, timeout=5)
    assert one_line(got["error"]) == (f"{run / 'train.log'} is a FIFO, not a regular file: refused")
    assert agent.request({"cmd": "follow", "run_id": run.name}, timeout=5)["ok"]
    agent.wait(lambda e: e["type"] == "log" and "is a FIFO" in e["message"], timeout=5)
    got = agent.request({"cmd": "kill", "run_id": run.name, "timeout_s": 1}, timeout=5)
    assert got["ok"] is False  # no process recorded: nothing to signal, and no hang
    assert agent.request({"cmd": "ping"}, timeout=5)["ok"]
    assert time.monotonic() - t0 < 10


def test_a_group_left_behind_by_a_gone_leader_is_named_not_signalled(
    agent_factory,  # noqa: F811
    tmp_path,
):
    """The leader is gone, a member of its group lives on: with no live leader, nothing proves
    that group number still names the run's group; the operator is told the pids."""
    root = tmp_path / "runs"
    root.mkdir()
    child_log = tmp_path / "child.log"
    leader = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import subprocess, sys; p = subprocess.Popen(sys.argv[1:]); print(p.pid)",
            sys.executable,
            "-c",
            RECORDER,
            str(child_log),
            str(tmp_path),
            "record",
        ],
        start_new_session=True,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert leader.stdout is not None
    child = int(leader.stdout.readline())
    start = proc_start(leader.pid)
    try:
        leader.wait(10)
        deadline = time.monotonic() + 10
        while "ready" not in (child_log.read_text() if child_log.exists() else ""):
            assert time.monotonic() < deadline
            time.sleep(0.02)
        write_run(root, OLD, leader.pid, start)
        agent = agent_factory(root)
        got = agent.request({"cmd": "kill", "run_id": OLD, "timeout_s": 2, "drain_timeout_s": 1})
        assert one_line(got["error"]) == (
            f"run {OLD} is not running; pid {leader.pid} has exited (pids [{child}] are in its "
            f"process group {leader.pid}, not proven to be the run's: check them by hand): "
            "not signalled"
        )
        assert child_log.read_text().split() == ["ready"]
        os.kill(child, 0)  # still alive
    finally:
        os.kill(child, 9)

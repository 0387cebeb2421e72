"""The agent as the link runs it: the bundled script, booted through BOOTSTRAP, in a real
process, against real run dirs (the recorded fixture from the previous main), real locks and
real processes."""

from __future__ import annotations

import base64
import fcntl
import glob
import io
import json
import os
import queue
import shlex
import shutil
import socket
import subprocess
import sys
import tarfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from dflash_tui.link.bundle import agent_blob
from dflash_tui.link.transport import BOOTSTRAP, agent_source
from trainer.contract.codehash import code_hash
from trainer.contract.protocol import MAX_LINE_BYTES, PROTOCOL_VERSION

ROOT = Path(__file__).resolve().parents[2]
FIXTURE = ROOT / "tests" / "fixtures" / "rundirs" / "main-c119aa7"
FINISHED = "20261201-031405-tiny-cpu-6e92"
STOPPED = "20261201-031436-tiny-cpu-b507"
CRASHED = "20261201-031510-tiny-cpu-ca8a"
DIED = "20261201-031600-tiny-cpu-32b0"


class AgentProcess:
    """One agent started as the link starts it: `python -u -c BOOTSTRAP ARGS`, then the
    length-prefixed script on stdin, then command lines."""

    def __init__(
        self,
        run_root: Path,
        remote_dir: Path,
        cwd: Path,
        python: str = sys.executable,
        env: dict[str, str] | None = None,
        extra: tuple[str, ...] = (),
    ) -> None:
        argv = [python, "-u", "-c", BOOTSTRAP, "--run-root", str(run_root)]
        argv += ["--remote-dir", str(remote_dir), "--no-inotify", *extra]
        self.proc = subprocess.Popen(
            argv,
            cwd=cwd,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        src = agent_source()
        self.send_raw(str(len(src)).encode() + b"\n" + src)
        self.events: queue.Queue[dict[str, Any]] = queue.Queue()
        self.seen: list[dict[str, Any]] = []
        threading.Thread(target=self._read, daemon=True).start()
        self.ids = 0

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.events.put(json.loads(line))

    def send_raw(self, data: bytes) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(data)
        self.proc.stdin.flush()

    def wait(self, predicate: Callable[[dict[str, Any]], bool], timeout: float = 30) -> Any:
        for e in self.seen:
            if predicate(e):
                return e
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                e = self.events.get(timeout=0.1)
            except queue.Empty:
                continue
            self.seen.append(e)
            if predicate(e):
                return e
        raise AssertionError(f"no such event within {timeout}s; last: {self.seen[-5:]}")

    def request(self, cmd: dict[str, Any], timeout: float = 30) -> dict[str, Any]:
        self.ids += 1
        cid = self.ids
        self.send_raw((json.dumps({**cmd, "id": cid}) + "\n").encode())
        result: dict[str, Any] = self.wait(
            lambda e: e["type"] == "result" and e["id"] == cid, timeout
        )
        return result

    def runs(self) -> dict[str, dict[str, Any]]:
        """The runs list that list_runs sends (it goes out just before the result; an
        earlier periodic one may still be queued before it)."""
        n = len(self.seen)
        assert self.request({"cmd": "list_runs"})["ok"]
        event = next(e for e in reversed(self.seen[n:]) if e["type"] == "runs")
        return {r["run_id"]: r for r in event["runs"]}

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(10)
        for stream in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
            if stream is not None:
                stream.close()


@pytest.fixture
def agent_factory(tmp_path: Path):
    made: list[AgentProcess] = []

    def make(run_root: Path, **kw: Any) -> AgentProcess:
        kw.setdefault("cwd", tmp_path)
        a = AgentProcess(run_root, kw.pop("remote_dir", tmp_path / "remote"), **kw)
        made.append(a)
        a.wait(lambda e: e["type"] == "hello")
        return a

    yield make
    for a in made:
        a.close()


def find_python(minor: int) -> str | None:
    """A real interpreter of 3.<minor>, on PATH or in pyenv; None when the machine has none."""
    found = shutil.which(f"python3.{minor}")
    if found and subprocess.run([found, "-V"], capture_output=True).returncode == 0:
        return found
    pyenv = sorted(glob.glob(os.path.expanduser(f"~/.pyenv/versions/3.{minor}.*/bin/python3")))
    return pyenv[-1] if pyenv else None


# -- the runs list ------------------------------------------------------------------------------
def test_the_runs_list_reads_run_dirs_of_the_previous_main(agent_factory, tmp_path):
    shutil.copytree(FIXTURE, tmp_path / "runs")
    runs = agent_factory(tmp_path / "runs").runs()
    assert list(runs) == [FINISHED, STOPPED, CRASHED, DIED]  # oldest first
    assert all(r["alive"] is False and r["unreadable"] == [] for r in runs.values())
    assert {k: r["schema"] for k, r in runs.items()} == {
        FINISHED: 1,
        STOPPED: 1,
        CRASHED: 1,
        DIED: None,
    }

    finished, stopped, crashed, died = (runs[k]["outcome"] for k in runs)
    assert finished == {
        "kind": "finished",
        "summary": "finished at step 40 of 40",
        "step": 40,
        "total_steps": 40,
        "exit_code": 0,
        "signal": None,
        "thread": None,
        "checkpoint": "checkpoints/step-00000040.pt",
        # From before sidecars: the newest .pt, which the trainer checks as it loads it.
        "resume": {
            "run_id": FINISHED,
            "name": "checkpoints/step-00000040.pt",
            "step": 40,
            "verified": False,
            "skipped": [],
        },
    }
    # Schema 1 said "finished" for a stop: the step settles it, and the checkpoint resumes it.
    assert stopped["kind"] == "stopped"
    assert stopped["summary"] == (
        "stopped at step 51 of 400, checkpoint checkpoints/step-00000051.pt: resumable"
    )
    assert crashed["kind"] == "crashed" and crashed["thread"] == "drafter-0"
    assert crashed["summary"] == (
        "crashed in drafter-0 at step 15 of 400: "
        "InjectedFault: injected fault in drafter at item 15 (DFLASH_FAULT)"
    )
    # It died before config.json: listed all the same, with the trainer's own last words.
    assert died["kind"] == "died_before_start" and died["exit_code"] == 2
    assert died["summary"] == (
        "died before start (exit code 2): error: train.lr: expected a number, got 'abc'"
    )
    assert runs[DIED]["name"] == "tiny-cpu" and runs[DIED]["exit"]["exit_code"] == 2
    assert runs[DIED]["phases"] == {} and runs[DIED]["signature"] is None

    # Every visit, keyed by its number: the second training after a checkpoint included.
    assert list(runs[FINISHED]["phases"]) == [
        "starting",
        "loading_data",
        "loading_target",
        "compiling",
        "warmup",
        "training",
        "checkpointing",
        "training#2",
        "stopping",
        "checkpointing#2",
        "finished",
    ]
    phases = runs[FINISHED]["phases"]
    assert phases["training"] == pytest.approx(1796094855.820614 - 1796094852.913606)
    assert phases["training#2"] == pytest.approx(1796094858.5280137 - 1796094855.8444474)
    assert phases["loading_target"] == pytest.approx(1796094852.0666163 - 1796094850.7660604)
    assert phases["finished"] == 0.0  # a final phase is an instant
    assert list(runs[STOPPED]["phases"])[-3:] == ["stopping", "checkpointing", "finished"]
    assert list(runs[CRASHED]["phases"])[-2:] == ["training", "crashed"]
    # Schema 1 records no target load span, and these loads ended before compiling did.
    assert all(r["target_load_s"] is None for r in runs.values())

    signatures = [runs[k]["signature"] for k in (FINISHED, STOPPED, CRASHED)]
    assert signatures[0] == signatures[1] == signatures[2]
    assert signatures[0]["layout"] == "2 targets, 2 drafters"
    assert signatures[0]["device_kind"] == "cpu"
    assert runs[FINISHED]["role_memory"] == {"target": 587460608, "drafter": 587460608}
    assert (runs[FINISHED]["steps"], runs[STOPPED]["steps"], runs[DIED]["steps"]) == (40, 50, 0)
    assert runs[FINISHED]["best_tok_s"] == pytest.approx(3900.4427698758636)
    assert runs[STOPPED]["last_tok_s"] == pytest.approx(2875.093587680496)


def test_a_torn_or_foreign_file_is_named_not_fatal(agent_factory, tmp_path):
    shutil.copytree(FIXTURE, tmp_path / "runs")
    (tmp_path / "runs" / FINISHED / "heartbeat.json").write_text('{"schema": 1, "phase": "tr')
    (tmp_path / "runs" / STOPPED / "exit.json").write_text('{"run_id": 7}')
    (tmp_path / "runs" / CRASHED / "config.json").write_text("[" * 100_000)
    runs = agent_factory(tmp_path / "runs").runs()
    assert len(runs) == 4
    assert runs[FINISHED]["unreadable"] == ["heartbeat.json"]
    assert runs[FINISHED]["phase"] is None and runs[FINISHED]["exit"]["exit_code"] == 0
    assert runs[STOPPED]["unreadable"] == ["exit.json"] and runs[STOPPED]["exit"] is None
    assert runs[STOPPED]["alive"] is False  # an exit.json, even unreadable, means it ended
    assert runs[CRASHED]["unreadable"] == ["config.json"] and runs[CRASHED]["signature"] is None


def test_read_file_reads_a_file_of_a_run_and_nothing_else(agent_factory, tmp_path):
    shutil.copytree(FIXTURE, tmp_path / "runs")
    agent = agent_factory(tmp_path / "runs")
    got = agent.request({"cmd": "read_file", "run_id": DIED, "name": "train.log"})
    assert got["ok"] and got["data"]["text"] == "error: train.lr: expected a number, got 'abc'\n"
    tail = agent.request(
        {"cmd": "read_file", "run_id": DIED, "name": "launch.log", "tail_bytes": 30}
    )
    assert tail["data"]["text"] == "3:16:00 trainer exited: exit code 2\n"[-30:]
    outside = agent.request({"cmd": "read_file", "run_id": "../../etc", "name": "passwd"})
    assert outside["ok"] is False and "bad run id" in outside["error"]
    up = agent.request({"cmd": "read_file", "run_id": DIED, "name": "../" + FINISHED})
    assert up["error"] == f"bad file name '../{FINISHED}'"


# -- the one liveness rule ----------------------------------------------------------------------
def _proc_start(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19])


def _by_hand(run_root: Path, run_id: str, pid: int, start: int | None, **more: Any) -> Path:
    """A run started by hand: config.json and a heartbeat naming its process."""
    d = run_root / run_id
    d.mkdir(parents=True)
    (d / "config.json").write_text(json.dumps({"name": run_id, "run": {"created": time.time()}}))
    hb = {"schema": 2, "run_id": run_id, "pid": pid, "host": socket.gethostname()}
    hb |= {"now": time.time(), "phase": "training", "proc_start": start, **more}
    (d / "heartbeat.json").write_text(json.dumps(hb))
    return d


def test_one_liveness_rule_for_the_runs_list_and_the_liveness_event(agent_factory, tmp_path):
    root = tmp_path / "runs"
    sleeper = subprocess.Popen(["sleep", "60"])
    stranger = subprocess.Popen(["sleep", "60"])
    dead = subprocess.Popen(["true"])
    dead.wait()
    try:
        start = _proc_start(sleeper.pid)
        _by_hand(root, "a-by-hand", sleeper.pid, start)
        _by_hand(root, "b-no-start-recorded", sleeper.pid, None)
        # The recorded process is gone and its pid names another one now: not the run.
        _by_hand(root, "c-pid-reused", stranger.pid, _proc_start(stranger.pid) - 1)
        _by_hand(root, "d-dead", dead.pid, None)
        ended = _by_hand(root, "e-exited", sleeper.pid, start)
        (ended / "exit.json").write_text(json.dumps({"run_id": "e-exited", "exit_code": 0}))
        _by_hand(root, "f-other-host", sleeper.pid, start, host="not-" + socket.gethostname())
        # Launched: the lock is held and .active.json names it; no process needed.
        locked = root / "g-lock-held"
        locked.mkdir()
        (locked / "launch.json").write_text(json.dumps({"run_id": "g-lock-held", "pid": dead.pid}))
        (root / ".active.json").write_text(json.dumps({"run_id": "g-lock-held"}))
        lock = os.open(root / ".launch.lock", os.O_RDWR | os.O_CREAT)
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            agent = agent_factory(root)
            runs = agent.runs()
            alive = {k: r["alive"] for k, r in runs.items()}
            assert alive == {
                "a-by-hand": True,
                "b-no-start-recorded": True,
                "c-pid-reused": False,
                "d-dead": False,
                "e-exited": False,
                "f-other-host": False,
                "g-lock-held": True,
            }
            assert runs["a-by-hand"]["outcome"]["kind"] == "running"
            for run_id, expected in alive.items():
                assert agent.request({"cmd": "follow", "run_id": run_id})["ok"]
                event = agent.wait(lambda e, r=run_id: e["type"] == "liveness" and e["run_id"] == r)
                assert event["alive"] is expected, run_id
        finally:
            os.close(lock)
    finally:
        for p in (sleeper, stranger):
            p.kill()
            p.wait()


# -- stdin --------------------------------------------------------------------------------------
def test_no_command_line_kills_the_reader(agent_factory, tmp_path):
    agent = agent_factory(tmp_path / "runs")
    agent.send_raw(b"[" * 100_000 + b"\n")
    huge = b'{"cmd": "ping", "id": 1, "pad": "' + b"x" * (20 << 20) + b'"}\n'
    agent.send_raw(huge)
    agent.send_raw(b'{"cmd": "kill", "id": 2, "timeout_s": "soon"}\n')
    agent.send_raw(b'{"cmd": "no_such", "id": 3}\n')
    assert agent.request({"cmd": "ping"}, timeout=60)["ok"]
    failed = [e for e in agent.seen if e["type"] == "result" and not e["ok"]]
    assert [(e["id"], e["error"]) for e in failed] == [
        (
            None,
            "command unreadable: not JSON (maximum recursion depth exceeded while decoding a "
            "JSON array from a unicode string)",
        ),
        (None, f"a command line of {len(huge)} bytes: too long (at most {MAX_LINE_BYTES})"),
        (2, "kill command unreadable: kill.timeout_s: expected a number, got str"),
        (3, "command unreadable: unknown command 'no_such'"),
    ]


# -- the bundle -----------------------------------------------------------------------------------
def _decoy(where: Path) -> Path:
    """A trainer/contract package that announces itself on import, and then fails."""
    for pkg in (where / "trainer", where / "trainer" / "contract"):
        pkg.mkdir(parents=True)
        (pkg / "__init__.py").write_text(
            f"open({str(where / 'imported')!r}, 'a').write(__name__ + '\\n')\n"
            "raise ImportError('the decoy trainer was imported')\n"
        )
    return where


def test_the_bundle_never_imports_a_nearby_trainer(agent_factory, tmp_path):
    cwd = _decoy(tmp_path / "cwd")
    on_path = _decoy(tmp_path / "on_path")
    shutil.copytree(FIXTURE, tmp_path / "runs")
    env = {**os.environ, "PYTHONPATH": str(on_path)}
    agent = agent_factory(tmp_path / "runs", cwd=cwd, env=env)
    assert agent.seen[0]["version"] == PROTOCOL_VERSION  # the bundled contract
    assert agent.runs()[STOPPED]["outcome"]["kind"] == "stopped"  # the contract at work
    assert not (cwd / "imported").exists() and not (on_path / "imported").exists()


def test_the_bundle_runs_on_python_3_10(agent_factory, tmp_path):
    python = find_python(10)
    if python is None:
        pytest.skip("no Python 3.10 on this machine")
    shutil.copytree(FIXTURE, tmp_path / "runs")
    agent = agent_factory(tmp_path / "runs", python=python)
    assert agent.seen[0]["python_version"].startswith("3.10.")
    assert agent.runs()[DIED]["outcome"]["kind"] == "died_before_start"


def test_an_older_python_is_told_in_one_line(tmp_path):
    python = find_python(8)
    if python is None:
        pytest.skip("no Python 3.8 on this machine")
    version = subprocess.run(
        [python, "-c", "import sys; print(sys.version.split()[0])"], capture_output=True, text=True
    ).stdout.strip()
    src = agent_blob()
    r = subprocess.run(
        [python, "-u", "-c", BOOTSTRAP, "--run-root", str(tmp_path)],
        input=str(len(src)).encode() + b"\n" + src,
        capture_output=True,
        cwd=tmp_path,
    )
    assert r.returncode == 2
    assert r.stdout == b""
    assert r.stderr.decode() == (
        f"dflash-tui agent: needs Python >= 3.10, this is {version} ({python})\n"
    )


# -- deploy ---------------------------------------------------------------------------------------
def _hostile_release(tmp_path: Path) -> tuple[bytes, str, Path]:
    """A release whose trainer/contract/codehash.py writes a marker when imported."""
    marker = tmp_path / "the-archive-ran"
    trainer = tmp_path / "ship" / "trainer"
    (trainer / "contract").mkdir(parents=True)
    (trainer / "__init__.py").write_text("")
    (trainer / "__main__.py").write_text("")
    (trainer / "contract" / "__init__.py").write_text("")
    (trainer / "contract" / "codehash.py").write_text(
        f"open({str(marker)!r}, 'w').write('ran')\n"
        "def code_hash(package_dir):\n    return '0' * 64\n"
    )
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        tar.add(trainer, arcname="trainer")
    return buf.getvalue(), code_hash(trainer), marker


def test_deploy_trusts_an_archive_by_its_bytes_before_running_any_of_it(agent_factory, tmp_path):
    blob, sha, marker = _hostile_release(tmp_path)
    remote = tmp_path / "remote"
    agent = agent_factory(tmp_path / "runs", remote_dir=remote)
    tar_b64 = base64.b64encode(blob).decode()

    wrong = agent.request({"cmd": "deploy", "tar_b64": tar_b64, "sha256": "0" * 64})
    assert wrong["ok"] is False
    assert wrong["error"] == f"deploy: shipped code hashes to {sha}, expected {'0' * 64}"
    assert not (remote / "current").exists() and not marker.exists()
    assert os.listdir(remote / "releases") == []  # nothing half-unpacked stays

    right = agent.request({"cmd": "deploy", "tar_b64": tar_b64, "sha256": sha})
    assert right["ok"] is True and right["data"]["sha256"] == sha
    assert (remote / "current").resolve() == remote / "releases" / sha[:16]
    assert not marker.exists()


# -- the wrapper and exit.json --------------------------------------------------------------------
def test_the_wrapper_records_the_trainers_start_and_its_exit(tmp_path):
    run_dir = tmp_path / "runs" / "20260101-000000-wrapped-0000"
    run_dir.mkdir(parents=True)
    hb = {
        "schema": 2,
        "run_id": run_dir.name,
        "pid": 1,
        "host": socket.gethostname(),
        "now": time.time(),
        "phase": "stopped",
        "step": 51,
        "total_steps": 400,
        "last_checkpoint": {"step": 51, "path": "checkpoints/step-00000051.pt", "at": 1.0},
    }
    (run_dir / "heartbeat.json").write_text(json.dumps(hb))
    (run_dir / "launch.json").write_text(json.dumps({"run_id": run_dir.name, "future": "kept"}))
    script = tmp_path / "dflash_agent.py"
    script.write_bytes(agent_blob())
    # The "trainer" says when it started (as /proc does) and exits 3.
    trainer = (
        "import sys; from pathlib import Path\n"
        "stat = Path('/proc/self/stat').read_text().rsplit(')', 1)[1].split()\n"
        f"Path({str(tmp_path / 'start')!r}).write_text(stat[19]); sys.exit(3)\n"
    )
    r = subprocess.run(
        [
            sys.executable,
            "-u",
            str(script),
            "wrap",
            "--run-dir",
            str(run_dir),
            "--",
            sys.executable,
            "-c",
            trainer,
        ],
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    assert r.returncode == 0, r.stderr
    assert "trainer exited: exit code 3" in r.stdout
    # launch.log's argv is quoted as a shell would need it: pasted back, it runs the same.
    assert f": {shlex.join([sys.executable, '-c', trainer])}\n" in r.stdout
    launch = json.loads((run_dir / "launch.json").read_text())
    assert launch["proc_start"] == int((tmp_path / "start").read_text())
    assert launch["future"] == "kept"  # a newer agent's field survives an older wrapper
    assert launch["pid"] == launch["pgid"]
    ended = json.loads((run_dir / "exit.json").read_text())
    assert {k: ended[k] for k in ("exit_code", "signal", "final_phase", "step")} == {
        "exit_code": 3,
        "signal": None,
        "final_phase": "stopped",
        "step": 51,
    }
    assert ended["total_steps"] == 400 and ended["checkpoint"] == "checkpoints/step-00000051.pt"


def hold_lock(lock: Path, seconds: float) -> subprocess.Popen[str]:
    """Another process that holds `lock` (flock) for `seconds`, once it says so."""
    hold = (
        "import fcntl, os, sys, time\n"
        "fd = os.open(sys.argv[1], os.O_RDONLY); fcntl.flock(fd, fcntl.LOCK_EX)\n"
        "print('held', flush=True); time.sleep(float(sys.argv[2]))"
    )
    p = subprocess.Popen(
        [sys.executable, "-c", hold, str(lock), str(seconds)], stdout=subprocess.PIPE, text=True
    )
    assert p.stdout is not None and p.stdout.readline() == "held\n"
    return p


@pytest.mark.serial  # a time bound: not beside another test's trainer
def test_a_liveness_probe_is_not_taken_for_a_run(tmp_path):
    """Every agent probes the launch lock once a second (flock for microseconds). A launch
    that met a probe was refused with "run ? is alive" (seen in a clean-clone test run);
    the lock is now tried a few times: a probe passes, a run does not."""
    from dflash_tui.agent.runs import take_lock

    lock = tmp_path / ".launch.lock"
    lock.touch()

    def held_for(seconds: float) -> subprocess.Popen[str]:
        return hold_lock(lock, seconds)

    fd = os.open(lock, os.O_RDWR)
    try:
        probe = held_for(0.1)  # a probe, slowed down to be caught
        assert not take_lock(fd, tries=1)  # what a single try saw: "alive"
        assert take_lock(fd, tries=25)  # the probe let go within the tries
        fcntl.flock(fd, fcntl.LOCK_UN)
        probe.wait(5)
        run = held_for(30)  # a run holds it for good
        t0 = time.monotonic()
        assert not take_lock(fd, tries=25)
        assert time.monotonic() - t0 < 1.5
        run.kill()
        run.wait(5)
    finally:
        os.close(fd)


@pytest.mark.serial  # a time bound
def test_the_loop_tries_the_launch_lock_without_sleeping(tmp_path):
    """The loop's probe (AliveProbe) answers as alive_run does, but one try per poll: the
    loop follows files between its tries. alive_run slept 2 x 20 ms on a held lock, and
    every line arriving meanwhile waited with it (issue 32: p99 26-44 ms, once a second
    while a run trained)."""
    from dflash_tui.agent.runs import LOCK_PAUSE_S, LOCK_TRIES, AliveProbe, RunRoot

    root = RunRoot(str(tmp_path))
    (tmp_path / ".active.json").write_text(json.dumps({"run_id": "the-run", "wrapper_pid": 1}))
    lock = Path(root.lock_path())
    lock.touch()
    probe = AliveProbe(root)
    assert probe.poll() == (True, None)  # free: settled at once
    run = hold_lock(lock, 30)
    try:
        t0 = time.monotonic()
        answers = [probe.poll() for _ in range(LOCK_TRIES)]
        took = time.monotonic() - t0
        assert answers == [(False, None)] * (LOCK_TRIES - 1) + [(True, "the-run")]
        assert took < LOCK_PAUSE_S * (LOCK_TRIES - 1), took  # what alive_run sleeps
        assert root.alive_run() == "the-run"  # the same answer, the commands' way
    finally:
        run.kill()
        run.wait(5)
    assert probe.poll() == (True, None)  # let go: free again at the first try

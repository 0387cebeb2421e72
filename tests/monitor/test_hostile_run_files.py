"""Hostile run files, end to end through the real agent (issue 33, part B): each class of
bad file generated, every example checked.

- something other than a regular file (a folder, a FIFO, a device) where a run file should
  be: every run still lists, the bad file is named (in the runs list, or once in the agent's
  log, or as the heartbeat's error), the agent never blocks and never logs a tick error;
- a heartbeat that is JSON but not the contract's (`run_id` missing, `"queues": [1]`, any
  mutation the decoder refuses): `status` names it, `heartbeat.json of RUN is unreadable:
  WHY`, and exits 1 (README: warning), never `no run` with 0;
- absurd figures (1e308 tok/s, a 400-digit step, negative, NaN): every line stays within its
  width, the figure shown bounded and labelled `(implausible)`.

The run dir is a real one (recorded on an H200: tests/fixtures/rundirs/h200-schema2).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import stat
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from monitor_helpers import Remote, piped_env
from test_agent import AgentProcess
from test_hostile_input import FIXTURE, RUN_ID, mutated, seed_json

from dflash_tui.diagnosis import diagnose
from dflash_tui.headless import EXIT_WARNING, exit_code_for, status_line
from dflash_tui.targets import resolve_target
from trainer.contract.heartbeat import parse_heartbeat

ROOT = Path(__file__).resolve().parents[2]
SETTINGS = {"deadline": None, "suppress_health_check": list(HealthCheck)}
GOOD = "20261201-000000-good-0001"
# The run's files the runs list reads (a bad one is named in its `unreadable`), the ones the
# agent follows (named once in its log), and ones nothing of the monitor reads (it lists on).
LISTED = ("launch.json", "heartbeat.json", "config.json", "exit.json", "metrics.jsonl", "train.log")
FOLLOWED_NAMED = ("train.log", "metrics.jsonl", "launch.log", "telemetry.jsonl")
# Read only on request: the config a restart relaunches, a rank's heartbeat (processes mode),
# faulthandler's stack dump, an eval result, a checkpoint's record.
ELSEWHERE = (
    "launch-config.toml", "heartbeat-rank0.json", "stacks-sigusr2.txt",
    "eval/step-00000100.json", "checkpoints/step-00000366.json",
)  # fmt: skip
PLACES = (*LISTED, "launch.log", "telemetry.jsonl", *ELSEWHERE)


def can_make_devices(where: Path) -> bool:
    try:
        os.mknod(where / "probe", 0o600 | stat.S_IFCHR, os.makedev(1, 3))  # /dev/null's
    except OSError:
        return False
    (where / "probe").unlink()
    return True


def plant(path: Path, kind: str) -> None:
    """`kind` where the file `path` was."""
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    else:
        path.unlink(missing_ok=True)
    path.parent.mkdir(parents=True, exist_ok=True)
    if kind == "folder":
        path.mkdir()
        (path / "inside").write_text("{}")
    elif kind == "FIFO":
        os.mkfifo(path)
    else:
        os.mknod(path, 0o600 | stat.S_IFCHR, os.makedev(1, 3))


class FileRig:
    """One real agent over a run root: a good run, and a bad one added per example."""

    def __init__(self, base: Path) -> None:
        self.root = base / "runs"
        self.root.mkdir()
        shutil.copytree(FIXTURE / RUN_ID, self.root / GOOD)
        self.devices = can_make_devices(base)
        self.agent = AgentProcess(self.root, base / "remote", cwd=base)
        self.agent.wait(lambda e: e["type"] == "hello")
        self.bad: list[str] = []

    def add_bad_run(self, place: str, kind: str) -> str:
        run_id = f"20261201-{len(self.bad):06d}-bad-0001"
        d = self.root / run_id
        shutil.copytree(FIXTURE / RUN_ID, d)
        plant(d / place, kind)
        self.bad.append(run_id)
        return run_id

    def logs_naming(self, text: str) -> list[dict[str, Any]]:
        return [e for e in self.agent.seen if e["type"] == "log" and text in e["message"]]


@pytest.fixture(scope="module")
def rig(tmp_path_factory: pytest.TempPathFactory) -> Any:
    r = FileRig(tmp_path_factory.mktemp("hostile-files"))
    yield r
    r.agent.close()


KIND_WORDS = {"folder": "a folder", "FIFO": "a FIFO", "device": "a device"}


@settings(**SETTINGS)
@given(place=st.sampled_from(PLACES), kind=st.sampled_from(["folder", "FIFO", "device"]))
def test_a_non_file_where_a_run_file_should_be(rig: FileRig, place: str, kind: str) -> None:
    if kind == "device" and not rig.devices:
        kind = "FIFO"  # mknod needs CAP_MKNOD
    t0 = time.monotonic()
    run_id = rig.add_bad_run(place, kind)
    runs = rig.agent.runs()
    assert set(runs) == {GOOD, *rig.bad}, "one bad run hid others"
    assert not runs[run_id].get("error"), runs[run_id]
    if place in LISTED:
        assert place in runs[run_id]["unreadable"], runs[run_id]
    assert runs[GOOD]["unreadable"] == [] and runs[GOOD]["steps"] > 0
    assert rig.agent.request({"cmd": "follow", "run_id": run_id})["ok"]
    path = str(rig.root / run_id / place)
    if place == "heartbeat.json":
        e = rig.agent.wait(lambda e: e["type"] == "heartbeat_error" and e["run_id"] == run_id)
        assert e["error"].startswith("heartbeat.json unreadable: "), e
    elif place in FOLLOWED_NAMED:
        rig.agent.wait(lambda e: e["type"] == "log" and e["message"].startswith(path))
        time.sleep(1.2)  # a tick or two more: still said once
        said = rig.logs_naming(path)
        assert len(said) == 1, said
        assert KIND_WORDS[kind] in said[0]["message"] or kind == "device", said
    assert rig.agent.request({"cmd": "ping"}, timeout=5)["ok"]
    assert rig.logs_naming("tick:") == [], "the agent's loop raised"
    assert time.monotonic() - t0 < 20


# The agent's own files beside the runs: the launch lock and the record of its holder in the
# run root, and deployed.json in the remote dir, read at every start (hello).
AGENT_PLACES = ("runs/.launch.lock", "runs/.active.json", "remote/deployed.json")


def stand_in_release(remote: Path) -> None:
    """`current` as deploy leaves it, enough for launch to reach the lock; a trainer that
    exits at once (the lock refuses first, so it never runs)."""
    release = remote / "releases" / ("0" * 16)
    (release / "trainer").mkdir(parents=True)
    (release / "trainer" / "__main__.py").write_text("raise SystemExit(3)\n")
    (remote / "current").symlink_to(release)


@settings(**SETTINGS)  # 9 cases: hypothesis stops when it has tried them all
@example(place="remote/deployed.json", kind="FIFO")  # blocked the agent before its hello
@given(place=st.sampled_from(AGENT_PLACES), kind=st.sampled_from(["folder", "FIFO", "device"]))
def test_a_non_file_where_an_agent_file_should_be(
    tmp_path_factory: pytest.TempPathFactory, place: str, kind: str
) -> None:
    """A fresh agent each (it reads these as it starts): it says hello, lists the runs,
    refuses a launch past a bad lock in one line naming it, and never blocks."""
    base = tmp_path_factory.mktemp("agent-files")
    for d in ("runs", "remote"):
        (base / d).mkdir()
    shutil.copytree(FIXTURE / RUN_ID, base / "runs" / GOOD)
    stand_in_release(base / "remote")
    if kind == "device" and not can_make_devices(base):
        kind = "FIFO"
    plant(base / place, kind)
    agent = AgentProcess(base / "runs", base / "remote", cwd=base)
    try:
        hello = agent.wait(lambda e: e["type"] == "hello", 20)
        assert hello["deployed"] is None, hello
        runs = agent.runs()
        assert set(runs) == {GOOD} and runs[GOOD]["unreadable"] == [], runs
        if place.endswith(".launch.lock"):
            toml = (ROOT / "trainer" / "configs" / "tiny-cpu.toml").read_text()
            r = agent.request({"cmd": "launch", "config_toml": toml, "start_timeout_s": 5})
            assert not r["ok"] and str(base / place) in r["error"], r
            assert "\n" not in r["error"] and "Traceback" not in r["error"], r
            made = {p.name for p in (base / "runs").iterdir()} - {GOOD, ".launch.lock"}
            assert made == set(), made  # no run dir made
        assert agent.request({"cmd": "ping"}, timeout=5)["ok"]
        assert [e for e in agent.seen if e["type"] == "log" and "tick:" in e["message"]] == []
    finally:
        agent.close()


def test_every_run_lists_through_the_cli_with_its_bad_file_named(tmp_path: Path) -> None:
    """`dflash-tui runs` as an operator runs it, over a root where each run has a folder in
    place of one of its files: every run listed, each bad file named, no traceback."""
    root = tmp_path / "runs"
    root.mkdir()
    for i, name in enumerate(LISTED):
        d = root / f"20261201-{i:06d}-bad-0001"
        shutil.copytree(FIXTURE / RUN_ID, d)
        plant(d / name, "folder")
    where = ["local", "--run-root", str(root), "--remote-dir", str(tmp_path / "remote")]
    r = subprocess.run([sys.executable, "-m", "dflash_tui", "runs", *where], capture_output=True,
                       text=True, timeout=60, cwd=ROOT, env=piped_env())  # fmt: skip
    assert r.returncode == 0 and r.stderr == "", r
    rows = r.stdout.splitlines()[1:]
    assert len(rows) == len(LISTED)
    for i, name in enumerate(LISTED):
        row = next(x for x in rows if x.startswith(f"20261201-{i:06d}-bad-0001"))
        assert f"(unreadable: {name})" in row, row


# -- an unreadable heartbeat ------------------------------------------------------------------
def status(run_dir: Path, *more: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "dflash_tui", "status", "local", "--run-dir", str(run_dir), *more],
        capture_output=True, text=True, timeout=60, cwd=ROOT, env=piped_env(),
    )  # fmt: skip


def live_copy(root: Path, run_id: str) -> Path:
    """The fixture's run as if still running: no exit.json."""
    d = root / run_id
    shutil.copytree(FIXTURE / RUN_ID, d)
    (d / "exit.json").unlink()
    return d


@pytest.mark.parametrize(
    ("edit", "why"),
    [
        (lambda hb: hb.pop("run_id"), "run_id: missing"),
        (lambda hb: hb.update(queues=[1]), "queues: expected an object, got list"),
        ("folder", "a folder, not a regular file: refused"),
    ],
    ids=["no-run-id", "queues-a-list", "a-folder"],
)
def test_status_names_an_unreadable_heartbeat_and_exits_1(tmp_path: Path, edit: Any, why: str):
    d = live_copy(tmp_path / "runs", "20261201-000000-hb-0001")
    if edit == "folder":
        plant(d / "heartbeat.json", "folder")
    else:
        hb = json.loads((d / "heartbeat.json").read_text())
        edit(hb)
        (d / "heartbeat.json").write_text(json.dumps(hb))
    r = status(d)
    assert r.returncode == EXIT_WARNING, r
    first = r.stdout.splitlines()[0]
    assert "no run" not in first and "heartbeat unreadable" in first, first
    said = f"heartbeat.json of {d.name} is unreadable: {why}"
    assert f"! {said}" in first or f"warning: {said}" in r.stdout, r.stdout
    assert "Traceback" not in r.stdout + r.stderr


class Followed:
    """A real agent, link and store following one live-looking run dir."""

    def __init__(self, base: Path) -> None:
        self.run_dir = live_copy(base / "runs", "20261201-000000-live-0001")
        target = resolve_target("local", run_root=str(base / "runs"),
                                remote_dir=str(base / "remote"), python=sys.executable)  # fmt: skip
        self.remote = Remote(target)
        self.remote.wait(lambda s: s.heartbeat is not None and s.runs_received, 60, "settled")

    def replace(self, name: str, raw: bytes) -> None:
        tmp = self.run_dir / f".{name}.tmp"
        tmp.write_bytes(raw)
        os.replace(tmp, self.run_dir / name)


@pytest.fixture(scope="module")
def followed(tmp_path_factory: pytest.TempPathFactory) -> Any:
    f = Followed(tmp_path_factory.mktemp("followed"))
    yield f
    f.remote.close()


def refused(data: Any) -> bool:
    return isinstance(data, dict) and not hasattr(parse_heartbeat(data), "phase")


@settings(**SETTINGS)
@given(data=mutated(seed_json("heartbeat.json")).filter(refused))
def test_every_refused_heartbeat_is_named_a_warning_at_least(followed: Followed, data: Any):
    """JSON objects the contract refuses: the store says why, a warning names the file and
    the run, the status line never says `no run`, and the exit code is not 0."""
    r = followed.remote
    data = {**data, "now": time.time()}  # changed each time: the agent sees a new file
    if refused(data):
        with r._lock:
            r.store.heartbeat_error = None
        followed.replace("heartbeat.json", json.dumps(data, default=str).encode())
        r.wait(lambda s: s.heartbeat_error is not None, 10, "the heartbeat's error")
        with r._lock:
            findings = diagnose(r.store)
            line = status_line(r.store, findings, unicode=False)
            code = exit_code_for(r.store, findings)
        named = [f for f in findings if f.code == "heartbeat_unreadable"]
        assert named and named[0].title.startswith(
            f"heartbeat.json of {followed.run_dir.name} is unreadable: "
        ), findings
        assert "no run" not in line and code >= EXIT_WARNING, (line, code)


# -- absurd figures ---------------------------------------------------------------------------
absurd = st.one_of(
    st.floats(min_value=1e12, allow_infinity=False, exclude_min=True),
    st.floats(max_value=-1e-3, allow_infinity=False),
    st.integers(min_value=10**12 + 1, max_value=10**400),
    st.integers(max_value=-1, min_value=-(10**400)),
    st.just(float("nan")),
)
DIGITS = re.compile(r"\d{16,}")  # a figure no wider than 1e15: never 309 digits


@settings(**SETTINGS)
@given(tok_s=absurd, step=absurd, depth=st.integers(10**12 + 1, 10**400), loss=absurd)
def test_absurd_figures_are_bounded_and_labelled(
    followed: Followed, tok_s: Any, step: Any, depth: int, loss: Any
) -> None:
    r = followed.remote
    hb = seed_json("heartbeat.json")
    hb.update(tok_s=tok_s, step=step if isinstance(step, int) else 7, now=time.time())
    hb["queues"]["q_pre"][0]["depth"] = depth
    row = json.loads((FIXTURE / RUN_ID / "metrics.jsonl").read_text().splitlines()[-1])
    row.update(loss=loss, tok_s=tok_s)
    with r._lock:
        before, refusals, rows = r.store.heartbeat, r.store.malformed, len(r.lines("metrics.jsonl"))
        r.store.heartbeat_error = None
    followed.replace("heartbeat.json", json.dumps(hb).encode())  # NaN as JSON's extension
    with open(followed.run_dir / "metrics.jsonl", "a") as f:
        f.write(json.dumps(row) + "\n")
    # Taken, refused by the agent's reader, or refused by the link's decoder: each is an answer.
    r.wait(lambda s: s.heartbeat is not before or s.heartbeat_error or s.malformed > refusals,
           10, "the heartbeat's fate")  # fmt: skip
    r.wait(lambda s: len(r.lines("metrics.jsonl")) > rows, 10, "the metrics row")
    with r._lock:
        findings = diagnose(r.store)
        line = status_line(r.store, findings, unicode=False)
        texts = [line, *(f.title + f.evidence for f in findings)]
        shown = r.store.heartbeat
    assert len(line) <= 120
    for text in texts:
        assert not DIGITS.search(text), text
    if shown is not None and shown.tok_s == tok_s:  # the contract took it: the view labels it
        assert "(implausible) tok/s" in line, line


@pytest.mark.parametrize("kind", ["FIFO", "folder"])
def test_the_wrapper_records_its_trainer_past_a_planted_launch_json(tmp_path: Path, kind: str):
    """The launch wrapper adds the trainer's pid to launch.json (agent/wrap.py): a FIFO there
    never blocks it (it is replaced), a folder is said in one line and the wrapper goes on
    to wait for its trainer."""
    d = tmp_path / "run"
    d.mkdir()
    plant(d / "launch.json", kind)
    code = f"from dflash_tui.agent.wrap import update_launch; update_launch({str(d)!r}, pid=7)"
    env = {**piped_env(), "PYTHONPATH": str(ROOT)}
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       timeout=30, cwd=ROOT, env=env)  # fmt: skip
    assert r.returncode == 0 and r.stderr == "", r
    if kind == "FIFO":
        assert json.loads((d / "launch.json").read_text()) == {"run_id": "run", "pid": 7}
    else:
        assert one_line_of(r.stdout).startswith(f"could not record the trainer in {d}/launch.json")


def one_line_of(text: str) -> str:
    assert text.strip() and "\n" not in text.strip(), text
    return text.strip()


def test_the_tui_panes_show_absurd_figures_bounded(followed: Followed) -> None:
    """The same figures through the TUI (Pilot): the header, the heartbeat and the queues
    panes say `>1e12 (implausible)`, and nothing on screen is a run of 16 digits or more."""
    import asyncio
    import io

    from monitor_helpers import typed_event
    from rich.console import Console

    from dflash_tui.app import DFlashApp
    from dflash_tui.targets import Target

    r = followed.remote
    hb = seed_json("heartbeat.json")
    hb.update(tok_s=1e308, step=10**400, phase="training", now=time.time())
    hb["queues"]["q_pre"][0]["depth"] = 10**400
    followed.replace("heartbeat.json", json.dumps(hb).encode())
    r.wait(lambda s: s.heartbeat is not None and s.heartbeat.step == 10**400, 10, "the heartbeat")
    with r._lock:
        events = list(r.events)

    def plain(widget: Any) -> str:
        console = Console(width=200, record=True, file=io.StringIO(), color_system=None)
        console.print(widget.content)
        return console.export_text()

    async def go() -> str:
        app = DFlashApp(Target(name="local", kind="local"), theme_name="dark", connect=False)
        async with app.run_test(size=(160, 50)) as pilot:
            for e in events:
                app.feed(typed_event(e))
            app.redraw(force=True)
            await pilot.pause(0.3)
            assert app.is_running
            return "\n".join(plain(w) for w in app.screen.query("Static") if w.display)

    text = asyncio.run(go())
    assert "step >1e12 (implausible)" in text and ">1e12 (implausible) tok/s" in text, text
    assert ">1e12 (implausible)/8" in text, text  # the queues pane
    assert not DIGITS.search(text), DIGITS.search(text)

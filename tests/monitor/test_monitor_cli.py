"""dflash-tui from the command line, as an operator (or a script in tmux) runs it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from monitor_helpers import NO_WANDB, TINY, cli
from test_headless_stages import BUSIEST, PIPELINE, heartbeat, timed

from trainer.contract.heartbeat import ROLE_STAGES

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def running(tmp_path_factory):
    """A deployed remote dir with a live tiny run, through the CLI; killed after the module's
    last test. Its tests only read it: one run for them all (~15 s each on two cores)."""
    remote = str(tmp_path_factory.mktemp("running") / "remote")
    where = ["local", "--remote-dir", remote]
    assert cli("deploy", *where).returncode == 0
    r = cli(
        "launch",
        *where,
        "--config",
        str(TINY),
        "--set",
        NO_WANDB,
        "--set",
        "train.max_steps=100000",
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("launched ")
    run_dir = Path(r.stdout.split(" in ")[1].split()[0])
    deadline = time.monotonic() + 60
    while "step=" not in (run_dir / "train.log").read_text():
        assert time.monotonic() < deadline, (run_dir / "train.log").read_text()
        time.sleep(0.2)
    yield where, run_dir
    cli("kill", *where, "--timeout", "20")


def test_status_is_one_line_and_exit_codes(running):
    where, run_dir = running
    r = cli("status", *where)
    assert r.returncode == 0, r.stdout + r.stderr
    line = r.stdout.splitlines()[0]
    assert len(line) <= 120
    assert "training" in line and "tok/s" in line and "q_pre" in line and "no NVIDIA GPU" in line
    assert "hb " in line and "step " in line and "loss " in line
    host = r.stdout.splitlines()[1]  # the agent's host sample, this machine's
    assert host.startswith(f"host: {len(os.sched_getaffinity(0))} CPUs, load ")
    assert " free of " in host and host.endswith(f" on {run_dir.parent}")

    j = cli("status", *where, "--json")
    snap = json.loads(j.stdout.splitlines()[0])
    assert snap["kind"] == "snapshot" and snap["state"]["phase"] == "training"
    assert snap["state"]["host"]["cpus"] == len(os.sched_getaffinity(0))
    # Healthy: no finding but, on a busy test machine, the host's own load (info)
    assert snap["state"]["run_id"] == run_dir.name
    assert {f["code"] for f in snap["findings"]} <= {"host_oversubscribed"}


def test_status_of_the_live_runs_own_dir_is_the_live_status(running):
    _, run_dir = running
    j = cli("status", "--run-dir", str(run_dir), "--json")
    assert j.returncode == 0, j.stdout + j.stderr
    snap = json.loads(j.stdout.splitlines()[0])
    assert snap["state"]["run_id"] == run_dir.name and snap["state"]["phase"] == "training"
    # this 2-core host, under the test suite, is oversubscribed: said at info, nothing else
    assert {f["code"] for f in snap["findings"]} <= {"host_oversubscribed"}


def headless_until(where, extra, enough, tmp_path, sig, timeout=60):
    """`dflash-tui --headless` writing into a file (as `> file` in tmux) until `enough(text)`,
    then signalled: a fixed sleep is too short on a loaded host (CI ran two at once)."""
    out_path = tmp_path / f"headless-{len(list(tmp_path.glob('headless-*')))}.txt"
    with open(out_path, "w") as out, open(out_path.with_suffix(".err"), "w") as err:
        p = subprocess.Popen(
            [sys.executable, "-m", "dflash_tui", *where, "--headless", *extra, "--interval", "0.5"],
            stdout=out, stderr=err, text=True, cwd=ROOT, env={**os.environ, "NO_COLOR": "1"},
        )  # fmt: skip
        deadline = time.monotonic() + timeout
        while not enough(out_path.read_text()) and time.monotonic() < deadline:
            time.sleep(0.2)
        p.send_signal(sig)
        p.wait(timeout=20)
    return p.returncode, out_path.read_text(), out_path.with_suffix(".err").read_text()


def test_headless_lines_pass_step_lines_and_sigint_leaves_the_run(running, tmp_path):
    where, _run_dir = running

    def status_and_steps(text):
        lines = text.splitlines()
        return (
            len([ln for ln in lines if "| step " in ln]) >= 3
            and [ln for ln in lines if ln.startswith("[") and " step=" in ln] != []
        )

    code, out, err = headless_until(where, [], status_and_steps, tmp_path, signal.SIGINT)
    assert code == 0, err
    lines = out.splitlines()
    status = [ln for ln in lines if "| step " in ln]
    steps = [ln for ln in lines if ln.startswith("[") and " step=" in ln]
    assert len(status) >= 3 and steps
    assert all(len(ln) <= 120 for ln in status)
    assert "\x1b[" not in out  # no colour when not a TTY
    assert "Traceback" not in err
    again = cli("status", *where)  # the remote run is still alive
    assert again.returncode == 0 and "training" in again.stdout


def test_json_lines_carry_events(running, tmp_path):
    where, _ = running
    wanted = {"hello", "follow", "heartbeat", "line", "runs"}

    def types(text):
        objs = []
        for ln in text.splitlines():
            try:
                objs.append(json.loads(ln))
            except ValueError:  # the line being written as we read
                continue
        return {o["event"]["type"] for o in objs if o["kind"] == "event"}, {o["kind"] for o in objs}

    def enough(t):  # the events, and a snapshot (the first comes one interval in)
        events, kinds = types(t)
        return wanted <= events and "snapshot" in kinds

    _, out, _ = headless_until(where, ["--json"], enough, tmp_path, signal.SIGTERM)
    events, kinds = types(out)
    assert kinds == {"event", "snapshot"}
    assert wanted <= events


def test_status_carries_each_threads_stages_in_loop_order(running):
    """The headless view of stage times (test_headless_stages.py's), on this module's run."""
    where, run_dir = running
    heartbeat(run_dir, timed, "stage times on every pipeline thread")
    snap = json.loads(cli("status", *where, "--json").stdout.splitlines()[0])
    state = snap["state"]
    rows = {r["thread"]: r for r in state["stages"]}
    assert set(rows) == PIPELINE
    for r in state["stages"]:
        names = [st["stage"] for st in r["stages"]]
        assert names == [n for n in ROLE_STAGES[r["role"]] if n in names], r
        assert sum(st["ms"] for st in r["stages"]) == pytest.approx(r["period_ms"], abs=0.01)
        assert sum(st["share"] for st in r["stages"]) == pytest.approx(1.0, abs=0.01)
    # Not the heartbeat's order: JSON sorted its keys (forward, mask, transfer, wait …).
    target = [st["stage"] for st in rows["target-0"]["stages"]]
    assert target == ["wait q_pre", "forward", "transfer", "mask", "wait q_hs"]
    assert [st["wait"] for st in rows["target-0"]["stages"]] == [True, False, False, False, True]
    busiest = state["busiest"]
    assert busiest["thread"] in PIPELINE and busiest["work_share"] > 0.5
    assert state["compile"]["warmup_s"] is not None and state["phase_progress"] is None

    r = cli("status", *where)
    line = r.stdout.splitlines()[0]
    assert len(line) <= 120, line
    # A finding's title comes first; this run has none (above). The stage's shortest form
    # (`P0 build batch`, 14 columns, the longest of them) wherever it has the room: queues
    # as depth/capacity (`q_pre 8/8 8/8 q_hs 4/8 4/8`) can leave it none on two targets.
    if " | ! " not in line and len(line) + 3 + 14 <= 120:
        assert BUSIEST.search(line), line


def test_a_crashed_run_is_critical_and_shows_why(tmp_path):
    remote = str(tmp_path / "remote")
    where = ["local", "--remote-dir", remote]
    cli("deploy", *where)
    r = cli(
        "launch",
        *where,
        "--config",
        str(TINY),
        "--set",
        NO_WANDB,
        env={"DFLASH_FAULT": "drafter:2"},
    )
    assert r.returncode == 0
    deadline = time.monotonic() + 60
    while True:
        s = cli("status", *where)
        if s.returncode == 2:
            break
        assert time.monotonic() < deadline, s.stdout
        time.sleep(1)
    assert "crashed" in s.stdout and "InjectedFault" in s.stdout


def test_named_targets_from_the_user_config(tmp_path, running):
    where, _ = running
    cfg = tmp_path / "xdg" / "dflash-tui" / "config.toml"
    cfg.parent.mkdir(parents=True)
    cfg.write_text(f'[targets.box]\ntarget = "local"\nremote_dir = {json.dumps(where[2])}\n')
    r = cli("status", "box", env={"XDG_CONFIG_HOME": str(tmp_path / "xdg")})
    assert r.returncode == 0 and "training" in r.stdout


def test_an_ssh_alias_from_ssh_config_is_enough(sshd, tmp_path):
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    (home / ".ssh" / "config").write_text(sshd.ssh_config.read_text())
    r = cli(
        "runs",
        "gpu-box",
        "--remote-dir",
        str(tmp_path / "remote"),
        "--python",
        sys.executable,
        env={"HOME": str(home)},
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("RUN ID")


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["status", "ssh://"], "no host"),
        (["status", "local", "--pct", "abc"], "--pct 'abc'"),
        (["launch", "local", "--config", "/nonexistent.toml"], "--config /nonexistent.toml"),
        (["status", "bad target!"], "target 'bad target!'"),
    ],
)
def test_bad_input_is_one_clear_line(args, needle):
    r = cli(*args)
    assert r.returncode in (2, 3)
    assert needle in r.stderr and "Traceback" not in r.stderr


def test_a_named_targets_baseline_reaches_the_diagnosis(tmp_path, running):
    where, _ = running
    cfg = tmp_path / "xdg" / "dflash-tui" / "config.toml"
    cfg.parent.mkdir(parents=True)
    cfg.write_text(
        f'[targets.box]\ntarget = "local"\nremote_dir = {json.dumps(where[2])}\n'
        "baseline_tok_s = 500000.0\n"
    )
    env = {"XDG_CONFIG_HOME": str(tmp_path / "xdg")}
    deadline = time.monotonic() + 60
    while True:  # the rule compares the median of the last logged steps
        r = cli("status", "box", env=env)
        if r.returncode == 1 or time.monotonic() > deadline:
            break
        time.sleep(1)
    assert r.returncode == 1, r.stdout
    assert "below the 500.0K baseline" in r.stdout


def test_kill_says_where_it_stopped_and_restart_what_it_resumes(tmp_path):
    remote = tmp_path / "remote"
    where = ["local", "--remote-dir", str(remote)]
    assert cli("deploy", *where).returncode == 0
    r = cli(
        "launch", *where, "--config", str(TINY), "--set", NO_WANDB, "--set", "train.max_steps=400"
    )
    assert r.returncode == 0, r.stderr
    run_id = r.stdout.split()[1]
    run_dir = remote / "runs" / run_id
    try:
        deadline = time.monotonic() + 60
        while "step=" not in (run_dir / "train.log").read_text():
            assert time.monotonic() < deadline
            time.sleep(0.2)
        k = cli("kill", *where, "--timeout", "30")
        assert k.returncode == 0, k.stderr
        step = json.loads((run_dir / "exit.json").read_text())["step"]
        checkpoint = f"checkpoints/step-{step:08d}.pt"
        assert k.stdout.startswith(
            f"{run_id} stopped at step {step} (SIGTERM), checkpoint {checkpoint} — resumable "
            "with restart; "
        ), k.stdout

        runs = cli("runs", *where)
        row = next(ln for ln in runs.stdout.splitlines() if ln.startswith(run_id))
        assert row.endswith(f"stopped at step {step} of 400, checkpoint {checkpoint}: resumable")
        status = cli("status", *where)
        assert status.stdout.split(" | ")[0].split()[1] == "stopped", status.stdout

        rs = cli("restart", *where, "--run", run_id, "--timeout", "30")
        assert rs.returncode == 0, rs.stderr
        (line,) = rs.stdout.splitlines()  # nothing was alive to kill
        new = line.split()[2].rstrip(",")
        assert line == (f"restarted as {new}, resuming from {checkpoint} (step {step}) of {run_id}")

        fresh = cli("restart", *where, "--fresh", "--timeout", "30")
        assert fresh.returncode == 0, fresh.stderr
        killed, line = fresh.stdout.splitlines()
        assert killed.startswith(f"{new} stopped at step ") and "resumable with restart" in killed
        newest = line.split()[2].rstrip(",")
        assert line == f"restarted as {newest}, fresh from step 0 (as asked)"
        launched = json.loads((remote / "runs" / newest / "launch.json").read_text())
        assert launched["resumed_from"] is None and "--resume" not in launched["argv"]
    finally:
        cli("kill", *where, "--timeout", "20")

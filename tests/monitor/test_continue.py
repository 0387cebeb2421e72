"""Continue a finished run for N more steps (`restart --more-steps N [--new-schedule]`): real
CPU trainers launched and continued through the real agent (the local link).

The continued run is a new run id that resumes the final checkpoint with train.max_steps
raised by N: its losses are those of one run that trained on (the same data position, the
same weights and optimizer state), its learning rate holds the schedule's final value, or,
asked for, follows a new warmup and cosine over the N new steps. A run that died before it
started is relaunched with the overrides the operator kept (one dropped or edited).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from monitor_helpers import cli
from test_control_local import deploy
from test_resume import ckpt, launch, metrics, reach, record, until

from dflash_tui import control
from dflash_tui.control import ControlError
from dflash_tui.link.link import LinkError

# Warmup 5, cosine to lr * min_lr_ratio at step 12; every step logged.
SHORT = ("train.log_every=1", "train.warmup_steps=5", "train.checkpoint_every=0")
LR, FLOOR = 3e-3, 3e-3 * 0.1  # tiny-cpu.toml's lr, the default min_lr_ratio


@pytest.fixture
def runs_dir(local_target) -> Path:
    return Path(local_target.remote_dir) / "runs"


def finished(runs_dir: Path, run_id: str) -> None:
    until(f"{run_id} finished", (runs_dir / run_id / "exit.json").exists)
    assert record(runs_dir / run_id, "exit.json")["exit_code"] == 0


def test_continue_trains_on_from_the_final_checkpoint_with_the_lr_held(
    remote_factory, local_target, runs_dir
):
    r = remote_factory(local_target)
    deploy(r)
    # What one run of 18 steps, its schedule ending at 12, would train: the reference.
    ref = launch(r, *SHORT, "train.max_steps=18", "train.schedule_steps=12")
    finished(runs_dir, ref)
    parent = launch(r, *SHORT, "train.max_steps=12")
    finished(runs_dir, parent)

    rs = r.call(control.restart(r.link, parent, 30, 5, more_steps=6))
    child = rs.launched.run_id
    assert child not in (parent, ref)
    assert rs.resume is not None and rs.resume.name == ckpt(12) and rs.resume.step == 12
    assert rs.max_steps == 18
    assert rs.describe() == (
        f"continued as {child}: 6 more steps from {ckpt(12)} (step 12) of {parent} to step 18; "
        f"the learning rate holds the schedule's final value ({FLOOR:.3g})"
    )
    launched = record(runs_dir / child)
    assert launched["resumed_from"] == parent
    assert launched["overrides"][-3:] == [
        "train.schedule_start=0",
        "train.schedule_steps=12",
        "train.max_steps=18",
    ]
    finished(runs_dir, child)
    got = metrics(runs_dir / child)
    want = {m["step"]: m for m in metrics(runs_dir / ref)}
    assert [m["step"] for m in got] == list(range(13, 19))
    for m in got:
        assert m["lr"] == pytest.approx(FLOOR, rel=1e-6), m["step"]  # held, not warm-up again
        assert m["lr"] == pytest.approx(want[m["step"]]["lr"], rel=1e-6)
        assert m["loss"] == pytest.approx(want[m["step"]]["loss"], rel=1e-5), m["step"]
        assert m["tokens"] == want[m["step"]]["tokens"], m["step"]  # the data position

    # A new schedule, through the command line: warmup from the checkpoint's step, then
    # cosine over the new steps.
    where = ["local", "--remote-dir", local_target.remote_dir]
    cont = cli("restart", *where, "--run", parent, "--more-steps", "6", "--new-schedule")
    assert cont.returncode == 0, cont.stderr
    (line,) = cont.stdout.splitlines()  # nothing was alive to kill
    new = line.split()[2].rstrip(":")
    assert line == (
        f"continued as {new}: 6 more steps from {ckpt(12)} (step 12) of {parent} to step 18; "
        f"a new schedule: warmup 5 steps to {LR:.3g}, cosine down to {FLOOR:.3g} at step 18"
    )
    rows = reach(runs_dir / new, 14)
    assert rows[0]["step"] == 13 and rows[0]["lr"] == pytest.approx(LR / 5, rel=1e-6)
    assert rows[1]["lr"] == pytest.approx(2 * LR / 5, rel=1e-6)
    assert rows[0]["tokens"] == want[13]["tokens"]
    r.call(control.kill(r.link, new, 30, 5, ended_ok=True))


def test_more_steps_mistakes_are_one_line_exit_2(tmp_path):
    where = ["restart", "local", "--remote-dir", str(tmp_path)]
    for args, said in (
        (["--more-steps", "0"], "'0': must be at least 1"),
        (["--more-steps", "x"], "'x' is not a whole number of steps"),
        (["--new-schedule"], "--new-schedule: only with --more-steps N"),
        (["--more-steps", "3", "--fresh"], "not with --fresh"),
    ):
        r = cli(*where, *args)
        assert r.returncode == 2 and said in r.stderr.splitlines()[-1], (args, r.stderr)
        assert "Traceback" not in r.stderr


def test_continue_is_refused_for_a_run_with_no_checkpoint_and_with_fresh(
    remote_factory, local_target, runs_dir
):
    r = remote_factory(local_target)
    deploy(r)
    died = launch_dead(r, runs_dir)
    with pytest.raises((ControlError, LinkError), match="no good checkpoint to continue from"):
        r.call(control.restart(r.link, died, 30, 5, more_steps=5))
    with pytest.raises((ControlError, LinkError), match="not with fresh"):
        r.call(control.restart(r.link, died, 30, 5, fresh=True, more_steps=5))


def launch_dead(r, runs_dir: Path) -> str:
    """A run that dies before it starts: a bad override (exit 2; the agent answers with the
    trainer's own line, as bad input)."""
    with pytest.raises((ControlError, LinkError), match=r"train\.max_steps = -3"):
        launch(r, *SHORT, "train.max_steps=-3")
    died = sorted(p.name for p in runs_dir.iterdir() if (p / "exit.json").exists())[-1]
    assert record(runs_dir / died, "exit.json")["exit_code"] == 2
    return died


def test_a_run_that_died_before_start_relaunches_with_the_overrides_kept(
    remote_factory, local_target, runs_dir
):
    r = remote_factory(local_target)
    deploy(r)
    died = launch_dead(r, runs_dir)
    kept = [o for o in record(runs_dir / died)["overrides"] if "max_steps" not in o]
    rs = r.call(control.restart(r.link, died, 30, 5, overrides=[*kept, "train.max_steps=3"]))
    new = rs.launched.run_id
    assert record(runs_dir / new)["overrides"] == [*kept, "train.max_steps=3"]
    finished(runs_dir, new)
    assert [m["step"] for m in metrics(runs_dir / new)] == [1, 2, 3]

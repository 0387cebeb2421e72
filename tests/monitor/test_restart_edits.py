"""`restart --set KEY=VALUE --drop KEY` and the restart dialog's drop box (issue 32): a run
that died before its first step of a bad override is relaunched without it, or with it fixed.
Real CPU trainers launched through the real agent (the local target), the command line run
as an operator runs it, the app under Pilot.

A bad edit (a --drop of a key the run was not launched with, a --set the trainer refuses)
is one line per bad key, exit 2, and nothing is stopped or launched.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from monitor_helpers import TINY, cli, wait_for
from test_control_local import deploy
from test_group_config import group_cli, write
from test_resume import launch, metrics, record, until
from textual.widgets import Input

from dflash_tui.app import DFlashApp
from dflash_tui.control import ControlError
from dflash_tui.link.link import LinkError
from dflash_tui.restart_edits import edit
from dflash_tui.widgets.restart_dialog import RestartDialog

SHORT = ("train.log_every=1", "train.warmup_steps=2", "train.max_steps=3")
BAD = "train.lr=-1"


@pytest.fixture
def runs_dir(local_target) -> Path:
    return Path(local_target.remote_dir) / "runs"


def run_ids(runs_dir: Path) -> list[str]:
    return sorted(p.name for p in runs_dir.iterdir() if p.is_dir())


def died_of_a_bad_lr(r, runs_dir: Path) -> str:
    """A run the trainer refuses at start (exit 2): its launch keeps the bad override."""
    with pytest.raises((ControlError, LinkError), match=r"train\.lr = -1: must be a positive"):
        launch(r, *SHORT, BAD)
    died = run_ids(runs_dir)[-1]
    until(f"{died}'s exit", (runs_dir / died / "exit.json").exists)
    assert record(runs_dir / died, "exit.json")["exit_code"] == 2
    assert record(runs_dir / died)["overrides"][-1] == BAD
    return died


def trains_three_steps(runs_dir: Path, run_id: str) -> None:
    until(f"{run_id} finished", (runs_dir / run_id / "exit.json").exists, timeout=180)
    assert record(runs_dir / run_id, "exit.json")["exit_code"] == 0
    assert [m["step"] for m in metrics(runs_dir / run_id)] == [1, 2, 3]


def restarted_as(stdout: str) -> str:
    (line,) = [ln for ln in stdout.splitlines() if ln.startswith("restarted as ")]
    return line.split()[2].rstrip(",")


# Not serial: two short trainer runs through the command line, no time bound (generous
# timeouts, as in test_continue.py's and test_monitor_cli.py's, which run with the rest).
def test_restart_drops_or_fixes_the_override_a_run_died_of(remote_factory, local_target, runs_dir):
    r = remote_factory(local_target)
    deploy(r)
    died = died_of_a_bad_lr(r, runs_dir)
    where = ["local", "--remote-dir", local_target.remote_dir, "--run", died]

    # --drop: launched with the others as they were, the bad one gone.
    dropped = cli("restart", *where, "--drop", "train.lr")
    assert dropped.returncode == 0, dropped.stderr
    new = restarted_as(dropped.stdout)
    kept = record(runs_dir / died)["overrides"][:-1]
    assert dropped.stdout.splitlines()[0] == (f"{died}: the new run's overrides: {' '.join(kept)}")
    assert record(runs_dir / new)["overrides"] == kept
    trains_three_steps(runs_dir, new)
    assert metrics(runs_dir / new)[0]["lr"] > 0  # the config's own lr, warming up

    # --set: the bad one replaced in its place, the others kept.
    fixed = cli("restart", *where, "--set", "train.lr=1e-3")
    assert fixed.returncode == 0, fixed.stderr
    new = restarted_as(fixed.stdout)
    assert record(runs_dir / new)["overrides"] == [*kept, "train.lr=1e-3"]
    trains_three_steps(runs_dir, new)
    assert record(runs_dir / new, "config.json")["train"]["lr"] == pytest.approx(1e-3)


def test_a_bad_edit_is_one_line_per_key_exit_2_and_nothing_launched(
    remote_factory, local_target, runs_dir
):
    r = remote_factory(local_target)
    deploy(r)
    died = died_of_a_bad_lr(r, runs_dir)
    before = run_ids(runs_dir)
    where = ["local", "--remote-dir", local_target.remote_dir, "--run", died]
    had = "runtime.wandb_mode, train.log_every, train.warmup_steps, train.max_steps, train.lr"
    for args, said in (
        (
            ["--drop", "train.nope", "--set", "train.lr=abc", "--set", "train.max_steps=-2"],
            [
                f"config: --drop train.nope: the run was not launched with it (its overrides: "
                f"{had})",
                # in the order of the new run's list: max_steps replaced in place, lr last
                "config: train.max_steps = -2: must be a non-negative integer (0 = train.epochs)",
                'config: train.lr = "abc": expected a number',
            ],
        ),
        # Kept as it was, the bad override is said too: the new run would die of it again.
        (["--set", "train.log_every=2"], ["config: train.lr = -1: must be a positive number"]),
        (["--set", "lr"], ['config: --set "lr": expected section.key=value']),
        (
            ["--set", "train.nokey=1", "--drop", "train.lr"],
            ["config: train.nokey = 1: unknown key"],
        ),
    ):
        got = cli("restart", *where, *args)
        assert got.returncode == 2, (args, got.stdout, got.stderr)
        assert got.stderr.splitlines() == [f"dflash-tui: {line}" for line in said], args
        assert got.stdout == ""
        assert run_ids(runs_dir) == before, args  # nothing launched

    # Without --run: the alive run, else the latest (the agent's own rule): this one.
    latest = cli("restart", "local", "--remote-dir", local_target.remote_dir, "--drop", "x.y")
    assert latest.returncode == 2, latest.stderr
    assert latest.stderr.splitlines() == [
        f"dflash-tui: config: --drop x.y: the run was not launched with it (its overrides: {had})",
        "dflash-tui: config: train.lr = -1: must be a positive number",
    ]
    assert run_ids(runs_dir) == before


def test_an_edit_replaces_a_key_in_its_place_and_adds_a_new_one_at_the_end():
    launched = ["a.x=1", "b.y=2", "a.x=3", "c.z=4"]
    assert edit(launched, ["a.x=9", "d.w=5"], ["c.z"]) == ["a.x=9", "b.y=2", "d.w=5"]
    assert edit(launched, [], []) == launched
    with pytest.raises(ControlError) as e:
        edit(launched, ["nokey", "=1"], ["q.q", "q.q", "b.y"])
    assert str(e.value).split("\n") == [
        "config: --drop q.q: the run was not launched with it (its overrides: a.x, b.y, c.z)",
        'config: --set "nokey": expected section.key=value',
        'config: --set "=1": expected section.key=value',
    ]


@pytest.mark.serial  # a trainer run
def test_the_dialog_drops_the_override_a_run_died_of(remote_factory, local_target, runs_dir):
    """`r` on the run that died: its overrides, the bad one marked; an edit the trainer
    would refuse is said in the dialog and relaunches nothing; its drop box, then `fresh`:
    the new run trains without it."""
    r = remote_factory(local_target)
    deploy(r)
    died = died_of_a_bad_lr(r, runs_dir)
    kept = record(runs_dir / died)["overrides"][:-1]

    async def go() -> str:
        app = DFlashApp(local_target, theme_name="dark")
        async with app.run_test(size=(120, 40)) as pilot:
            s = app.store
            await wait_for(pilot, lambda: s.run_id == died and s.outcome(), "the died run")
            await pilot.press("r")
            dialog = await wait_for(
                pilot, lambda: isinstance(app.screen, RestartDialog) and app.screen, "the dialog"
            )
            bad = dialog.query_one("#override-4", Input)
            assert bad.value == BAD and bad.has_class("offending") and app.focused is bad
            assert dialog.offer.config_toml == TINY.read_text()

            # An added line the trainer refuses, the bad one kept: both said, nothing sent.
            dialog.query_one("#override-add", Input).value = "train.log_every=0"
            word = dialog.query_one("#fresh-word", Input)
            word.focus()
            await pilot.press(*"fresh", "enter")
            await pilot.pause(0.2)
            assert str(dialog.query_one("#edit-error").render()).split("\n") == [
                "config: train.lr = -1: must be a positive number",
                "config: train.log_every = 0: must be a positive integer",
            ]
            assert app.screen is dialog and app.controls.busy == "restart"
            assert run_ids(runs_dir) == [died]

            # The added line emptied, the bad one dropped (Tab to its box, space): relaunched.
            dialog.query_one("#override-add", Input).value = ""
            bad.focus()
            await pilot.press("tab", "space")
            await wait_for(pilot, lambda: bad.disabled, "the line dropped")
            word.focus()
            await pilot.press(*"fresh", "enter")
            await wait_for(pilot, lambda: app.controls.busy is None, "the relaunch")
            said = [n.message for n in app._notifications if n.message.startswith("restarted")]
            assert said and said[-1].endswith("fresh from step 0 (as asked)"), said
            await pilot.press("q")
            return str(said[-1].split()[2].rstrip(","))

    new = asyncio.run(go())
    assert record(runs_dir / new)["overrides"] == kept
    trains_three_steps(runs_dir, new)


def test_a_groups_job_is_not_edited(tmp_path):
    """A job over several hosts restarts as launched: refused before anything connects (its
    hosts here are unreachable)."""
    home = write(tmp_path, '[groups.pair]\nhosts = ["gpu-a", "gpu-b"]\nmaster = "h:1"\n')
    for args in (["--drop", "train.lr"], ["--set", "train.lr=1e-4"]):
        r = group_cli(home, "restart", "pair", *args)
        assert r.returncode == 2, r.stderr
        assert r.stderr.splitlines() == [
            "dflash-tui: pair: --set/--drop edit one host's run, not a group's job"
        ]

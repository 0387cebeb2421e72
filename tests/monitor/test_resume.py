"""Restart resumes: real CPU trainers launched, killed and restarted through the real agent
(the local link), each run's own files read back.

A restart continues the run's newest *good* checkpoint in a new run dir (the step counter,
the LR schedule and the data order continue, so the losses are an uninterrupted run's); it
passes over checkpoints written after the loss went NaN, saying which and why; a run with
no good checkpoint starts at step 0 and says so; `fresh` starts at step 0 whatever there is.
DFLASH_FAULT reaches a run through the agent's environment, so a fault is set for the agent
that launches the faulty run and a clean agent restarts it.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from monitor_helpers import NO_WANDB, TINY, Remote
from test_control_local import deploy

from dflash_tui import control
from dflash_tui.headless import status_line
from trainer.contract.checkpoints import ResumePoint, Skipped
from trainer.contract.protocol import Launch, ListRuns

LONG = ("train.max_steps=400", "train.log_every=1")


def ckpt(step: int) -> str:
    return f"checkpoints/step-{step:08d}.pt"


def launch(r: Remote, *overrides: str) -> str:
    cmd = Launch(config_toml=TINY.read_text(), overrides=[NO_WANDB, *overrides], name="tiny-cpu")
    run_id: str = r.request(cmd)["run_id"]
    return run_id


def until(what: str, check: Callable[[], Any], timeout: float = 90) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def metrics(run_dir: Path) -> list[dict[str, Any]]:
    try:
        text = (run_dir / "metrics.jsonl").read_text()
    except FileNotFoundError:
        return []
    return [json.loads(ln) for ln in text.splitlines() if ln.endswith("}")]


def reach(run_dir: Path, step: int) -> list[dict[str, Any]]:
    """metrics.jsonl once it has a row at `step` or later."""
    return until(  # type: ignore[no-any-return]
        f"{run_dir.name} at step {step}",
        lambda: (rows := metrics(run_dir)) and rows[-1]["step"] >= step and rows,
    )


def record(run_dir: Path, name: str = "launch.json") -> dict[str, Any]:
    data: dict[str, Any] = json.loads((run_dir / name).read_text())
    return data


@pytest.fixture
def runs_dir(local_target) -> Path:
    return Path(local_target.remote_dir) / "runs"


def test_restart_continues_a_killed_run_as_if_it_never_stopped(
    remote_factory, local_target, runs_dir
):
    r = remote_factory(local_target)
    deploy(r)
    ref = launch(r, *LONG)  # the same config and seed, never interrupted
    reach(runs_dir / ref, 30)
    r.call(control.kill(r.link, ref, 30, 5))

    cut = launch(r, *LONG)
    r.wait(lambda s: s.run_id == cut and len(s.step_lines) >= 2, 60, "two step lines")
    k = r.call(control.kill(r.link, cut, 30, 5))
    stopped = k.outcome.step
    assert k.outcome.kind == "stopped" and stopped < 25
    assert k.describe() == (
        f"stopped at step {stopped} (SIGTERM), checkpoint {ckpt(stopped)} — resumable with restart"
    )
    # the header's and headless's word for it
    r.wait(lambda s: s.shown_phase()[0] == "stopped", 15, "stopped shown")
    assert status_line(r.store, []).split(" | ")[0].split()[1] == "stopped"

    rs = r.call(control.restart(r.link, cut, 30, 5))
    new = rs.launched.run_id
    assert rs.killed is None  # it was stopped already
    assert rs.resume == ResumePoint(cut, ckpt(stopped), stopped, verified=True)
    assert rs.describe() == (
        f"restarted as {new}, resuming from {ckpt(stopped)} (step {stopped}) of {cut}"
    )
    launched = record(runs_dir / new)
    assert launched["resumed_from"] == cut and launched["checkpoint"] == ckpt(stopped)
    assert launched["argv"][launched["argv"].index("--resume") + 1] == str(runs_dir / cut)
    assert launched["overrides"] == record(runs_dir / cut)["overrides"]
    run = record(runs_dir / new, "config.json")["run"]
    assert run["parent"] == str((runs_dir / cut).resolve())
    assert run["checkpoint"] == str((runs_dir / cut / ckpt(stopped)).resolve())

    got = reach(runs_dir / new, 30)
    r.call(control.kill(r.link, new, 30, 5))
    expected = {m["step"]: m for m in metrics(runs_dir / ref)}
    assert got[0]["step"] == stopped + 1
    compared = 0
    for m in got:
        if m["step"] <= 30:
            want = expected[m["step"]]
            assert m["loss"] == pytest.approx(want["loss"], rel=1e-6), m["step"]
            assert m["lr"] == pytest.approx(want["lr"], rel=1e-6), m["step"]  # not warm-up again
            assert m["tokens"] == want["tokens"], m["step"]
            compared += 1
    assert compared == 30 - stopped


def test_restart_passes_over_checkpoints_written_after_the_loss_went_nan(
    remote_factory, local_target, runs_dir, monkeypatch
):
    monkeypatch.setenv("DFLASH_FAULT", "nan:12")  # the agent's runs get it
    r = remote_factory(local_target)
    deploy(r)
    run = launch(r, *LONG, "train.checkpoint_every=5")
    after_nan = runs_dir / run / "checkpoints" / "step-00000015.json"
    until("the checkpoint after the NaN", after_nan.exists)
    k = r.call(control.kill(r.link, run, 30, 5))
    stopped = k.outcome.step
    assert stopped >= 15
    assert k.describe() == (
        f"stopped at step {stopped} (SIGTERM), checkpoint {ckpt(10)} (newest {ckpt(stopped)} "
        "not good) — resumable with restart"
    )

    monkeypatch.delenv("DFLASH_FAULT")
    clean = remote_factory(local_target)  # its runs are not poisoned
    clean.request(ListRuns())
    listed = next(x for x in clean.store.runs if x.run_id == run)
    assert listed.outcome.summary == (
        f"stopped at step {stopped} of 400, checkpoint {ckpt(stopped)} not good: resumable "
        f"from {ckpt(10)}"
    )
    rs = clean.call(control.restart(clean.link, run, 30, 5))
    bad = sorted(p.name for p in (runs_dir / run / "checkpoints").glob("*.pt"))
    passed = [f"checkpoints/{name}" for name in reversed(bad) if name > "step-00000010.pt"]
    assert passed[-1] == ckpt(15) and passed[0] == ckpt(stopped)
    why = "weights or optimizer state not finite"  # the NaN loss went into the weights
    assert rs.resume == ResumePoint(run, ckpt(10), 10, True, [Skipped(p, why) for p in passed])
    skipped = "; ".join(f"skipped {p}: {why}" for p in passed)
    assert rs.describe() == (
        f"restarted as {rs.launched.run_id}, resuming from {ckpt(10)} (step 10) of {run} "
        f"({skipped})"
    )
    assert record(runs_dir / rs.launched.run_id)["checkpoint"] == ckpt(10)
    rows = reach(runs_dir / rs.launched.run_id, 13)
    assert rows[0]["step"] == 11 and all(m["loss"] == m["loss"] for m in rows)  # not NaN


def test_a_run_sigkilled_before_its_first_checkpoint_restarts_fresh_and_says_so(
    remote_factory, local_target, runs_dir, monkeypatch
):
    # The main thread stuck in C code: SIGTERM is never handled, so the kill's timeout
    # ends in SIGKILL, before the first checkpoint (the tiny config's is at step 200).
    monkeypatch.setenv("DFLASH_FAULT", "wedge_main:3")
    r = remote_factory(local_target)
    deploy(r)
    run = launch(r, *LONG)
    reach(runs_dir / run, 3)
    k = r.call(control.kill(r.link, run, 3, 5))
    assert k.signal == "SIGKILL" and k.outcome.kind == "killed"
    assert k.describe() == (
        f"killed (SIGKILL) at step {k.outcome.step}, no checkpoint — restart starts at step 0"
    )
    r.wait(lambda s: s.shown_phase()[0] == "killed (SIGKILL)", 15, "killed shown")
    assert status_line(r.store, []).split(" | ")[0].split()[1:3] == ["killed", "(SIGKILL)"]

    monkeypatch.delenv("DFLASH_FAULT")
    clean = remote_factory(local_target)
    rs = clean.call(control.restart(clean.link, run, 30, 5))
    first = rs.launched.run_id
    assert rs.resume == ResumePoint(run)  # no checkpoint at all
    assert rs.describe() == f"restarted as {first}, no good checkpoint: starting fresh from step 0"
    assert record(runs_dir / first)["resumed_from"] is None
    assert "--resume" not in record(runs_dir / first)["argv"]
    assert reach(runs_dir / first, 4)[0]["step"] == 1

    # fresh: step 0 although the run it replaces stops with a good checkpoint
    rs = clean.call(control.restart(clean.link, first, 30, 5, fresh=True))
    second = rs.launched.run_id
    stopped = rs.killed.outcome.step
    assert rs.killed.describe() == (
        f"stopped at step {stopped} (SIGTERM), checkpoint {ckpt(stopped)} — resumable with restart"
    )
    assert rs.resume is None and rs.fresh
    assert rs.describe() == f"restarted as {second}, fresh from step 0 (as asked)"
    assert record(runs_dir / second)["resumed_from"] is None
    assert "parent" not in record(runs_dir / second, "config.json")["run"]
    assert reach(runs_dir / second, 2)[0]["step"] == 1


def test_a_resumed_run_killed_before_its_own_checkpoint_continues_its_parents(
    remote_factory, local_target, runs_dir, monkeypatch
):
    """Restarting it from step 0 would throw away what its parent trained."""
    r = remote_factory(local_target)
    deploy(r)
    parent = launch(r, *LONG)
    r.wait(lambda s: s.run_id == parent and len(s.step_lines) >= 2, 60, "two step lines")
    stopped = r.call(control.kill(r.link, parent, 30, 5)).outcome.step

    monkeypatch.setenv("DFLASH_FAULT", f"sigkill:{stopped + 2}")
    faulty = remote_factory(local_target)
    child = faulty.call(control.restart(faulty.link, parent, 30, 5)).launched.run_id
    until("the child's SIGKILL", (runs_dir / child / "exit.json").exists)
    assert record(runs_dir / child, "exit.json")["signal"] == "SIGKILL"
    assert not (runs_dir / child / "checkpoints").exists()

    monkeypatch.delenv("DFLASH_FAULT")
    clean = remote_factory(local_target)
    clean.request(ListRuns())
    listed = next(x for x in clean.store.runs if x.run_id == child)
    last = listed.outcome.step  # its last heartbeat's: the SIGKILL may beat the next one
    assert stopped <= last <= stopped + 2
    assert listed.outcome.summary == (
        f"killed (SIGKILL) at step {last} of 400, resumable from {ckpt(stopped)} of {parent}"
    )
    rs = clean.call(control.restart(clean.link, child, 30, 5))
    own = [Skipped(child, "no good checkpoint of its own: its parent's")]
    assert rs.resume == ResumePoint(parent, ckpt(stopped), stopped, True, own)
    grandchild = rs.launched.run_id
    assert rs.describe() == (
        f"restarted as {grandchild}, resuming from {ckpt(stopped)} (step {stopped}) of {parent} "
        f"(skipped {child}: no good checkpoint of its own: its parent's)"
    )
    assert record(runs_dir / grandchild)["resumed_from"] == parent
    assert reach(runs_dir / grandchild, stopped + 1)[0]["step"] == stopped + 1

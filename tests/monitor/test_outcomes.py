"""How runs ended, in the contract's words, on every view; a heartbeat from a newer trainer.

The runs are the ones the previous main wrote (tests/fixtures/rundirs/main-c119aa7, schema 1),
whose runs list said `exit 0 (finished)` for a run stopped at step 51 of 400."""

from __future__ import annotations

import asyncio
import dataclasses
import io
import json
from pathlib import Path

from monitor_helpers import typed_event
from rich.console import Console
from test_diagnosis import NOW, Clock

from dflash_tui.app import DFlashApp
from dflash_tui.commands.runs import format_runs
from dflash_tui.headless import status_line
from dflash_tui.state import Store
from dflash_tui.targets import Target
from dflash_tui.widgets.header import StatusBar
from dflash_tui.widgets.heartbeat import HeartbeatPane
from dflash_tui.widgets.screens import RunsScreen
from trainer.contract.heartbeat import Heartbeat, read_heartbeat
from trainer.contract.outcomes import outcome_of
from trainer.contract.protocol import RunInfo
from trainer.contract.records import ExitRecord, read_exit
from trainer.contract.typed import encode

RUNDIRS = Path(__file__).resolve().parents[1] / "fixtures" / "rundirs" / "main-c119aa7"
FINISHED, STOPPED, CRASHED, DIED = (
    "20261201-031405-tiny-cpu-6e92",
    "20261201-031436-tiny-cpu-b507",
    "20261201-031510-tiny-cpu-ca8a",
    "20261201-031600-tiny-cpu-32b0",
)
TARGET = Target(name="box", kind="local")


def recorded(run_id: str) -> tuple[Heartbeat | None, ExitRecord]:
    hb = read_heartbeat(RUNDIRS / run_id / "heartbeat.json")
    ex = read_exit(RUNDIRS / run_id)
    assert isinstance(hb, Heartbeat | None) and isinstance(ex, ExitRecord)
    return hb, ex


def run_info(run_id: str, with_outcome: bool = True) -> RunInfo:
    """The runs list entry a protocol-2 agent sends (or, without outcome, a protocol-1 one)."""
    hb, ex = recorded(run_id)
    ckpts = sorted((RUNDIRS / run_id / "checkpoints").glob("*.pt"))
    words = (RUNDIRS / run_id / "train.log").read_text().strip().splitlines()[-1:]
    outcome = outcome_of(
        False,
        hb,
        ex,
        f"checkpoints/{ckpts[-1].name}" if ckpts else None,
        words[0] if words and " step=" not in words[0] else "",
    )
    return RunInfo(
        run_id=run_id,
        phase=hb.phase if hb else None,
        step=hb.step if hb else None,
        exit=ex,
        outcome=outcome if with_outcome else None,
        steps=hb.step if hb else 0,
    )


def test_the_runs_list_says_how_each_run_ended() -> None:
    text = format_runs([run_info(r) for r in (FINISHED, STOPPED, CRASHED, DIED)])
    rows = dict(ln.split(maxsplit=1) for ln in text.splitlines()[1:])
    assert rows[FINISHED].endswith("finished at step 40 of 40")
    assert rows[STOPPED].endswith(
        "stopped at step 51 of 400, checkpoint checkpoints/step-00000051.pt: resumable"
    )
    assert rows[CRASHED].endswith(
        "crashed in drafter-0 at step 15 of 400: InjectedFault: injected fault in drafter at "
        "item 15 (DFLASH_FAULT)"
    )
    assert rows[DIED].endswith(
        "died before start (exit code 2): error: train.lr: expected a number, got 'abc'"
    )
    # an agent that sends no outcome: the contract's rule on what the list has
    old = format_runs([run_info(r, with_outcome=False) for r in (FINISHED, CRASHED, DIED)])
    assert "finished at step 40" in old and "crashed at step 15" in old
    assert "died before start (exit code 2)" in old


def test_the_runs_screen_says_the_outcome() -> None:
    async def go() -> list[str]:
        app = DFlashApp(TARGET, theme_name="dark", connect=False, clock=lambda: NOW)
        async with app.run_test(size=(160, 48)) as pilot:
            runs = [run_info(r) for r in (FINISHED, STOPPED, DIED)]
            app.push_screen(RunsScreen(runs, STOPPED))
            await pilot.pause(0.2)
            table = app.screen.query_one("#runs")
            return [str(table.get_row(r)[1]) for r in (FINISHED, STOPPED, DIED)]  # type: ignore[attr-defined]

    finished, stopped, died = asyncio.run(go())
    assert finished == "finished at step 40 of 40"
    assert stopped.startswith("stopped at step 51 of 400")
    assert died.startswith("died before start (exit code 2): error: train.lr")


def stopped_store() -> Store:
    """Following the run stopped at step 51: its last heartbeat said `finished` (schema 1)."""
    hb, ex = recorded(STOPPED)
    assert hb is not None and hb.phase == "finished"
    s = Store("box", clock=Clock(hb.now + 5))
    t = hb.now
    for e in (
        {"type": "link", "t": t, "state": "connected"},
        {"type": "hello", "t": t, "version": 2, "pid": 1, "host": "h"},
        {"type": "follow", "t": t, "run_id": STOPPED},
        {
            "type": "heartbeat",
            "t": t,
            "run_id": STOPPED,
            "data": json.loads(json.dumps(encode(hb))),
        },
        {"type": "liveness", "t": t, "run_id": STOPPED, "alive": False, "exit": encode(ex)},
    ):
        s.apply(typed_event(e))
    return s


def test_the_status_line_and_header_say_stopped_not_finished() -> None:
    s = stopped_store()
    assert s.shown_phase()[0] == "stopped"
    assert status_line(s, [], now=s.clock()).split(" | ")[0].endswith(" stopped 0s")
    snap = s.to_json()
    assert snap["phase"] == "finished"  # the heartbeat's phase, as documented
    assert snap["outcome"] == {"kind": "stopped", "summary": "stopped at step 51 of 400"}


def plain(widget: object) -> str:
    console = Console(width=158, record=True, file=io.StringIO(), color_system=None)
    console.print(widget.content)  # type: ignore[attr-defined]
    return console.export_text()


def test_a_newer_heartbeat_says_upgrade_and_shows_what_it_knows() -> None:
    hb, _ = recorded(STOPPED)
    assert hb is not None
    data = json.loads(json.dumps(encode(hb)))
    data.update(schema=3, phase="training", step=30, gil="a new shape", new_field={"x": 1})

    async def go() -> tuple[str, str]:
        app = DFlashApp(TARGET, theme_name="dark", connect=False, clock=lambda: hb.now + 1)
        async with app.run_test(size=(160, 48)) as pilot:
            app.feed(typed_event({"type": "follow", "t": hb.now, "run_id": STOPPED}))
            app.feed(
                typed_event({"type": "heartbeat", "t": hb.now, "run_id": STOPPED, "data": data})
            )
            # The redraw is coalesced: wait for it (bounded), not a fixed pause, which a
            # loaded machine outran (the pane still said "no run under the run root yet").
            for _ in range(100):
                await pilot.pause(0.1)
                if "no run" not in plain(app.query_one(HeartbeatPane)):
                    break
            return plain(app.query_one(HeartbeatPane)), plain(app.query_one(StatusBar))

    pane, status = asyncio.run(go())
    assert "heartbeat schema 3: upgrade dflash-tui (this one reads 2)" in pane
    assert "step 30" in pane and "training for" in pane  # the fields it knows
    assert "malformed" not in status


def test_a_stop_signal_after_the_final_heartbeat_is_not_a_kill() -> None:
    """The trainer's final heartbeat said `stopped`, exit code 0; a second SIGTERM (a group
    signal during teardown) then ended the process: the wrapper records death by SIGTERM,
    and the run is still `stopped`. A SIGKILL there, or a SIGTERM mid-training, is a kill."""
    hb, ex = recorded(STOPPED)
    assert hb is not None
    final = dataclasses.replace(hb, phase="stopped", exit_code=0)
    late = dataclasses.replace(ex, exit_code=None, signal="SIGTERM")
    got = outcome_of(False, final, late, "checkpoints/step-00000051.pt")
    assert got.kind == "stopped" and got.word == "stopped"
    assert got.summary == (
        "stopped at step 51 of 400, checkpoint checkpoints/step-00000051.pt: resumable"
    )
    done = dataclasses.replace(final, phase="finished", step=400)
    finished = dataclasses.replace(late, signal="SIGINT", step=400, final_phase="finished")
    assert outcome_of(False, done, finished).kind == "finished"

    sigkill = outcome_of(False, final, dataclasses.replace(late, signal="SIGKILL"))
    assert sigkill.kind == "killed" and sigkill.word == "killed (SIGKILL)"
    assert sigkill.summary.startswith("killed (SIGKILL) at step 51 of 400")
    training = dataclasses.replace(hb, phase="training", exit_code=None)
    assert outcome_of(False, training, late).kind == "killed"


def test_a_final_checkpoint_that_failed_is_said_with_where_a_restart_resumes() -> None:
    """Edit of the recorded stop (step 51 of 400, checkpoint step 51): its final save failed
    instead, so step 51's file is not there and the newest is an older one. Read as a stop,
    never a crash; a finished run the same; a run with none of its own resumes its parent's."""
    from trainer.contract.checkpoints import (
        CheckpointFailure,
        CheckpointPlan,
        ResumePoint,
    )

    hb, ex = recorded(STOPPED)
    assert hb is not None
    why = "disk full (needed 22.10 GB, free 14.10 GB)"
    plan = CheckpointPlan(22 * 10**9, 20, 0, CheckpointFailure(51, why, 0.0))
    hb = dataclasses.replace(hb, phase="stopped", checkpoints=plan, last_checkpoint=None)
    ex = dataclasses.replace(ex, checkpoint=None)
    older = "checkpoints/step-00000040.pt"
    o = outcome_of(False, hb, ex, older)
    assert (o.kind, o.summary) == (
        "stopped",
        f"stopped at step 51 of 400; final checkpoint failed: {why}; resumes from step 40",
    )
    parent = ResumePoint("parent-run", "checkpoints/step-00000020.pt", 20, True)
    assert outcome_of(False, hb, ex, None, resume=parent).summary.endswith(
        "; resumes from step 20 of parent-run"
    )
    assert outcome_of(False, hb, ex, None).summary.endswith(
        "; no checkpoint: a restart starts at 0"
    )
    done = dataclasses.replace(hb, phase="finished", step=400)
    o = outcome_of(False, done, dataclasses.replace(ex, step=400), older)
    assert o.kind == "finished" and o.summary == "finished at step 400 of 400"  # not its step
    failed_last = dataclasses.replace(plan, failed=CheckpointFailure(400, why, 0.0))
    o = outcome_of(False, dataclasses.replace(done, checkpoints=failed_last),
                   dataclasses.replace(ex, step=400), older)  # fmt: skip
    assert o.summary == f"finished at step 400 of 400; final checkpoint failed: {why}; " + (
        "resumes from step 40"
    )

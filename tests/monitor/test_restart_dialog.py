"""Restart's dialog fits the run's state (issue 32): real trainers launched through the real
agent (the local target), the real app under Pilot.

A run that died before start (a bad override, exit 2) shows one alert and its launch's
overrides (`i`, the bad one marked); `r` lets the operator edit that override and relaunch
from step 0, confirmed by the typed word `fresh` only. Once that run has finished, `r`
offers "Continue" (Enter: a new run resuming the final checkpoint N more steps, the lr held)
and a new run, never a resume that trains nothing.
"""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import pytest
from monitor_helpers import NO_WANDB, TINY, Remote
from test_control_local import deploy

from dflash_tui.app import DFlashApp
from dflash_tui.control import ControlError
from dflash_tui.diagnosis import diagnose
from dflash_tui.link.link import LinkError
from dflash_tui.restart_offer import CONTINUE, DIED_BEFORE_START, Choice, Offer, lr_words
from dflash_tui.targets import Target
from dflash_tui.widgets.restart_dialog import RestartDialog
from dflash_tui.widgets.screens import TextScreen
from trainer.contract.protocol import Launch

SIZE = (120, 40)
BAD = "train.max_steps=-3"


async def until(pilot, check, what: str, tries: int = 600) -> None:
    for _ in range(tries):
        if check():
            return
        await pilot.pause(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def screen_text(widget) -> str:
    return str(widget.render())


@pytest.mark.serial  # three trainer runs, one after another
def test_restart_fits_a_died_run_then_a_finished_one(local_target: Target):
    runs = Path(local_target.remote_dir) / "runs"
    r = Remote(local_target)
    deploy(r)
    overrides = [NO_WANDB, "train.log_every=1", "train.warmup_steps=2", BAD]
    # The agent answers with the trainer's own line (bad input); the run dir stays, died.
    with pytest.raises((ControlError, LinkError), match=r"train\.max_steps = -3"):
        r.request(Launch(config_toml=TINY.read_text(), name="tiny-cpu", overrides=overrides))
    r.close()
    (died,) = [p.name for p in runs.iterdir() if p.is_dir()]

    async def go() -> None:
        app = DFlashApp(local_target, theme_name="dark")
        async with app.run_test(size=SIZE) as pilot:
            s = app.store
            await until(pilot, lambda: s.run_id == died and s.outcome() is not None, "died")
            await until(pilot, lambda: s.exit_info() is not None, "its exit")
            found = diagnose(s, time.time())
            assert [f.code for f in found] == ["died_at_start"], found  # one alert

            # i: the launch's overrides, the one the error names marked
            await pilot.press("i")
            await until(pilot, lambda: isinstance(app.screen, TextScreen), "run info")
            await until(pilot, lambda: app.screen.query("#body"), "its body")
            info = screen_text(app.screen.query_one("#body"))
            assert f"--set {BAD}   <- the error names this key" in info
            assert "--set train.log_every=1\n" in info
            await pilot.press("escape")

            # r: the overrides to edit; no resume, no step-0 button, stray keys confirm nothing
            await pilot.press("r")
            await until(pilot, lambda: isinstance(app.screen, RestartDialog), "the dialog")
            dialog = app.screen
            assert not dialog.query("#resume") and not dialog.query("#fresh")
            bad = dialog.query_one("#override-3")
            assert bad.has_class("offending") and app.focused is bad
            await pilot.press("end", *["backspace"] * 2, "3", "enter")  # -3 -> 3; Enter edits only
            assert isinstance(app.screen, RestartDialog)
            await pilot.click("#fresh-word")
            await pilot.press(*"frsh", "enter")  # not the word: nothing
            assert isinstance(app.screen, RestartDialog) and app.controls.busy == "restart"
            await pilot.press(*"fresh", "enter")
            await until(pilot, lambda: app.controls.busy is None, "the relaunch")
            said = [n.message for n in app._notifications if n.message.startswith("restarted")]
            assert said and said[-1].endswith("fresh from step 0 (as asked)"), [
                n.message for n in app._notifications
            ]
            first = said[-1].split()[2].rstrip(",")
            launched = json.loads((runs / first / "launch.json").read_text())
            assert launched["overrides"] == [*overrides[:3], "train.max_steps=3"]

            # … it finishes at step 3; r offers Continue (Enter) and a new run, nothing else
            await until(pilot, lambda: s.run_id == first, "following the new run")
            await until(
                pilot, lambda: s.outcome() is not None and s.outcome().kind == "finished", "done"
            )
            await until(pilot, lambda: (c := s.current_run()) and c.resume, "its checkpoint")
            await pilot.press("r")
            await until(pilot, lambda: isinstance(app.screen, RestartDialog), "the dialog")
            dialog = app.screen
            assert str(dialog.query_one("#resume").label) == "Continue 3 more steps"
            assert dialog.query_one("#more").value == "3"
            lr = screen_text(dialog.query_one("#lr"))
            assert lr == "to step 6: the learning rate holds the schedule's final value (0.0003)"
            question = screen_text(dialog.query_one("#question"))
            assert question.startswith(f"Run {first} finished at step 3. Continue it")
            assert "resume from step 3" not in question.lower()
            await pilot.press("enter")
            await until(pilot, lambda: app.controls.busy is None, "the continue")
            said = [n.message for n in app._notifications if n.message.startswith("continued")]
            assert said, [n.message for n in app._notifications]
            second = said[-1].split()[2].rstrip(":")
            assert said[-1].endswith(
                "3 more steps from checkpoints/step-00000003.pt (step 3) of "
                f"{first} to step 6; the learning rate holds the schedule's final value (0.0003)"
            )
            await pilot.press("q")
        done = runs / second / "exit.json"
        for _ in range(600):
            if done.exists():
                break
            await asyncio.sleep(0.1)
        rows = [json.loads(ln) for ln in (runs / second / "metrics.jsonl").read_text().splitlines()]
        assert [m["step"] for m in rows] == [4, 5, 6]
        assert all(m["lr"] == pytest.approx(3e-4, rel=1e-6) for m in rows)

    asyncio.run(go())


def dialog_app(offer: Offer) -> tuple[DFlashApp, list[Choice | None]]:
    """The app, unconnected, with the dialog pushed over it; its answers collected."""
    app = DFlashApp(Target(name="box", kind="ssh", host="box"), connect=False)
    answers: list[Choice | None] = []
    app.call_later(lambda: app.push_screen(RestartDialog(offer), answers.append))
    return app, answers


def test_at_80x24_every_line_of_the_dialog_can_be_reached_and_stray_keys_confirm_nothing():
    overrides = [f"train.key_{i}={i}" for i in range(6)] + [BAD]
    offer = Offer(
        DIED_BEFORE_START,
        "r1",
        "Run r1 died before its first step: relaunching it as it was dies the same way. Keep, "
        "edit or drop each override (or add one), then relaunch from step 0.",
        fresh_label="Relaunch from step 0 with the overrides below",
        overrides=overrides,
        offending=[6],
        error="error: config: train.max_steps = -3: must be a non-negative integer",
    )

    async def go() -> None:
        app, answers = dialog_app(offer)
        async with app.run_test(size=(80, 24)) as pilot:
            await pilot.pause(0.2)
            dialog = app.screen
            assert isinstance(dialog, RestartDialog)
            assert app.focused is dialog.query_one("#override-6")
            await pilot.press(*"rfy", "enter", "f", "enter", "y")
            assert not answers  # stray letters and Enter: nothing confirmed (an override edited)
            word = dialog.query_one("#fresh-word")
            word.focus()
            await pilot.pause(0.2)
            assert word.region.y + word.region.height <= 24 and word.region.x + 10 <= 80
            await pilot.press(*"fresh", "enter")
            await pilot.pause(0.1)
            # as the keys left it the line is no override: said, and nothing relaunches
            assert not answers and word.value == ""
            said = str(dialog.query_one("#edit-error").render())
            assert said == 'config: --set "rfyfy": expected section.key=value'
            # Tab from the line to its drop box, space: dropped (greyed, Tab passes it by)
            dialog.query_one("#override-6").focus()
            await pilot.press("tab")
            assert app.focused is dialog.query_one("#drop-6")
            await pilot.press("space")
            await pilot.pause(0.1)
            assert dialog.query_one("#override-6").disabled
            word.focus()
            await pilot.press(*"fresh", "enter")
            await pilot.pause(0.1)
            assert answers and answers[0] is not None and answers[0].fresh
            assert answers[0].overrides == overrides[:6]  # the dropped one left out

    asyncio.run(go())


def test_continue_takes_n_and_says_what_the_lr_does():
    held, new = lr_words('{"train": {"lr": 0.003, "min_lr_ratio": 0.1, "warmup_steps": 20}}')
    offer = Offer(CONTINUE, "r1", "Run r1 finished at step 142.", "Continue", steps=142,
                  fresh_label="New run from step 0", lr_held=held, lr_new=new)  # fmt: skip

    async def go() -> None:
        app, answers = dialog_app(offer)
        async with app.run_test(size=(80, 24)) as pilot:
            await pilot.pause(0.2)
            dialog = app.screen
            lr = dialog.query_one("#lr")
            assert str(lr.render()) == (
                "to step 284: the learning rate holds the schedule's final value (0.0003)"
            )
            await pilot.press("end", *["backspace"] * 3, *"50")
            dialog.query_one("#new-schedule").value = True
            await pilot.pause(0.1)
            assert str(lr.render()) == (
                "to step 192: a new schedule: warmup 20 steps to 0.003, cosine down to 0.0003 "
                "at step 192"
            )
            assert str(dialog.query_one("#resume").label) == "Continue 50 more steps"
            dialog.query_one("#more").focus()
            await pilot.press("enter")
            await pilot.pause(0.1)
            assert answers == [Choice(more_steps=50, new_schedule=True)]

    asyncio.run(go())

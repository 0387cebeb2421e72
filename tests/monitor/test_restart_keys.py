"""Keys by mode (issue 32) for the restart dialog: random keystroke strings, Enter
included, never confirm a start from step 0 unless `fresh` was typed into its own line and
Enter pressed there. The real dialog (widgets/restart_dialog.py) in a real Textual app
under Pilot, for each state the app offers it in; what it answers is what app_control
sends as the restart's arguments. (The app's path from `r` to this dialog and on to a
real run is tests/monitor/test_restart_dialog.py's.)"""

from __future__ import annotations

import asyncio

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from keystrokes import KEYS
from textual.app import App
from textual.widgets import Input

from dflash_tui.restart_offer import (
    ALIVE,
    CONTINUE,
    DIED_BEFORE_START,
    FRESH_WORD,
    NO_CHECKPOINT,
    RESUME,
    Choice,
    Offer,
)
from dflash_tui.widgets.restart_dialog import RestartDialog

OFFERS = {
    ALIVE: Offer(ALIVE, "r1", "Restart run r1? It is alive.", "Resume from where it stops"),
    RESUME: Offer(RESUME, "r1", "Restart run r1?", "Resume from step 800"),
    NO_CHECKPOINT: Offer(NO_CHECKPOINT, "r1", "Restart run r1? No good checkpoint."),
    DIED_BEFORE_START: Offer(
        DIED_BEFORE_START, "r1", "Relaunch r1?", overrides=["train.lr=1", "train.max_steps=-3"],
        offending=[1], error="error: config: train.max_steps = -3",
    ),
    CONTINUE: Offer(CONTINUE, "r1", "Run r1 finished.", "Continue 142 more steps", steps=142),
}  # fmt: skip
FEW = settings(
    max_examples=12,  # per state: 60 in all, ~1 s each on two cores
    deadline=None,
    database=None,
    phases=[Phase.explicit, Phase.generate],
    suppress_health_check=[HealthCheck.too_slow],
)


async def answer(offer: Offer, keys: list[str]) -> tuple[list[Choice | None], bool]:
    """What the dialog answered to `keys`, and whether they held `fresh` + Enter in the
    fresh line (then cut there: that is the confirmation, not a stray key)."""
    answers: list[Choice | None] = []
    app: App[None] = App()
    async with app.run_test(size=(120, 40)) as pilot:
        dialog = RestartDialog(offer)
        await app.push_screen(dialog, answers.append)
        await pilot.pause()
        for key in keys:
            if app.screen is not dialog:
                break  # answered or cancelled
            focused = app.focused
            if (
                key == "enter"
                and isinstance(focused, Input)
                and focused.id == "fresh-word"
                and focused.value.strip().lower() == FRESH_WORD
            ):
                return answers, True
            await pilot.press(key)
        await pilot.pause()
    return answers, False


@pytest.mark.parametrize("state", sorted(OFFERS))
def test_stray_keys_never_confirm_a_fresh_restart(state: str) -> None:
    @FEW
    @given(keys=KEYS)
    def prop(keys: list[str]) -> None:
        answers, typed = asyncio.run(answer(OFFERS[state], keys))
        assert typed or not any(a is not None and a.fresh for a in answers), keys

    prop()


@pytest.mark.parametrize("state", sorted(OFFERS))
def test_fresh_typed_and_enter_is_the_one_way_to_step_zero(state: str) -> None:
    async def go() -> list[Choice | None]:
        answers: list[Choice | None] = []
        app: App[None] = App()
        async with app.run_test(size=(120, 40)) as pilot:
            await app.push_screen(RestartDialog(OFFERS[state]), answers.append)
            await pilot.pause()
            if state == DIED_BEFORE_START:  # the override it died of, edited: else refused
                app.screen.query_one("#override-1", Input).value = "train.max_steps=3"
            app.screen.query_one("#fresh-word", Input).focus()  # as a click or Tab gets there
            await pilot.press(*"fresh", "enter")
            await pilot.pause()
        return answers

    (choice,) = asyncio.run(go())
    assert choice is not None and choice.fresh
    if state == DIED_BEFORE_START:
        assert choice.overrides == ["train.lr=1", "train.max_steps=3"]

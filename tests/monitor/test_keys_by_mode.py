"""Keys by mode (issue 32), as a property: random keystroke strings, Enter included, sent to
every viewer never make a request leave the app, and sent to every dialog that kills, clears
or signals never confirm it. The real app under Pilot, a real local agent, a real tiny run;
requests are counted where the link writes them (tests/monitor/keystrokes.py).

CI runs a few examples per viewer and dialog (under 50 in all); bench/keystroke_bench.py
runs the same property over the viewers and the kill and signal dialogs at 10,000. The
clear-cache dialog, which the bench does not reach, keeps more examples here."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from keystrokes import DIALOGS, KEYS, VIEWERS, LiveApp, start_run, stop_run

# Per viewer and per kill/signal dialog: 3 × (8 viewers + 2 dialogs) = 30 (~1 s each on two
# cores, in the serial phase); the bench draws from the same ones at its big count. The
# clear-cache dialog, which only this file reaches, keeps CLEAR_EXAMPLES.
EXAMPLES = 3
CLEAR_EXAMPLES = 6
FAST = settings(
    max_examples=EXAMPLES,
    deadline=None,
    database=None,
    # No shrinking: each example drives a live app for a second or so; a failure is
    # reported as drawn, its keys in the assertion.
    phases=[Phase.explicit, Phase.generate],
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveApp]:
    mp = pytest.MonkeyPatch()
    mp.setenv("XDG_CONFIG_HOME", str(tmp_path_factory.mktemp("config")))
    target, _run_id = start_run(tmp_path_factory.mktemp("keys") / "remote")
    try:
        app = LiveApp(target, settled_keys=True)  # the bench's pace too
        try:
            yield app
        finally:
            app.close()
    finally:
        stop_run(target)  # never a trainer left behind
        mp.undo()


@pytest.mark.serial  # a live trainer beside the app: not beside another trainer
@pytest.mark.parametrize("viewer", VIEWERS)
def test_keystrokes_in_a_viewer_never_send_a_request(live: LiveApp, viewer: str) -> None:
    @FAST
    @given(keys=KEYS)
    def prop(keys: list[str]) -> None:
        assert live.call(live.viewer_example(viewer, keys)) == [], keys
        assert live.late_requests == [], keys

    prop()


@pytest.mark.serial
@pytest.mark.parametrize("dialog", DIALOGS)
def test_keystrokes_in_a_dialog_never_confirm_it(live: LiveApp, dialog: str) -> None:
    @FAST
    @given(keys=KEYS)
    def prop(keys: list[str]) -> None:
        sent, _typed_word = live.call(live.dialog_example(dialog, keys))
        assert sent == [], keys
        assert live.late_requests == [], keys

    prop()
    assert live.app.store.process_alive() is True  # killed by no example


@pytest.mark.serial
def test_the_word_and_enter_confirm_and_nothing_else_does(live: LiveApp) -> None:
    """The other side: the word typed and Enter does send (the signal: what it does to the
    run is not under test here, and the next test stops the run anyway), a wrong word and
    Enter does not."""
    sent, typed = live.call(live.dialog_example("signal", [*"SIGUSR", "enter", "escape"]))
    assert (sent, typed) == ([], False)
    sent, typed = live.call(live.dialog_example("signal", [*"sigusr2"]))
    assert typed is False and sent == []
    before = len(live.sent)

    async def confirm() -> None:
        await live.to_dashboard()
        await live.open_dialog("signal")
        await live.pilot.press(*"sigusr2", "enter")
        await live.until(lambda: live.app.controls.busy is None, "the signal's answer")

    live.call(confirm())
    assert live.sent[before:] == ["signal_process"]


@pytest.mark.serial
def test_keystrokes_in_the_clear_cache_dialog_never_confirm_it(live: LiveApp) -> None:
    """Last in this file: it stops the run (clearing is refused while one is alive)."""
    from dflash_tui import control

    live.call(control.kill(live.app.link))
    live.call(live.until(lambda: live.app.store.process_alive() is False, "the run stopped"))

    @settings(FAST, max_examples=CLEAR_EXAMPLES)
    @given(keys=st.one_of(KEYS))
    def prop(keys: list[str]) -> None:
        sent, _typed_word = live.call(live.dialog_example("clear", keys))
        assert sent == [], keys

    prop()

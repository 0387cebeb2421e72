"""The plots as W&B's charts are looked at (issue 32: "plots with smoothing, a step or time
x-axis, the value under the cursor, and a held-out τ curve"), on the recorded `held_out_eval`
scenario: a real tiny run on CPU evaluating held-out τ every 10 steps, as its agent sent it,
fed to the real app under Pilot. With the plots focused: + and - smooth, x switches the axis,
← → move a cursor whose row's values the line above the plots says.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import statistics

from monitor_helpers import typed_event
from test_diagnosis import NOW, events

from dflash_tui import plot_view
from dflash_tui.app import DFlashApp
from dflash_tui.targets import Target
from dflash_tui.widgets.plots import PlotPanel, Plots

TARGET = Target(name="cpu-box", kind="local")
SCENARIO = "recorded/held_out_eval.jsonl"


def metrics_rows() -> list[dict]:
    """The followed run's metrics.jsonl rows, as the recording has them."""
    evs = events(SCENARIO)
    run_id = next(e["run_id"] for e in reversed(evs) if e.get("type") == "follow")
    return [
        json.loads(e["text"])
        for e in evs
        if e.get("type") == "line" and e["file"] == "metrics.jsonl" and e["run_id"] == run_id
    ]


def shown(app: DFlashApp, name: str):
    fig = app.query_one(f"#plot-{name}", PlotPanel).figure
    assert fig is not None
    return fig


def readout(app: DFlashApp) -> str:
    return str(app.query_one("#plot-readout").render())


def test_smoothing_axis_cursor_and_the_held_out_tau_curve():
    rows = metrics_rows()
    evals = {r["eval"]["step"]: r["eval"]["tau"] for r in rows if r.get("eval")}
    assert len(evals) >= 3  # the recording evaluated while it was followed

    async def go():
        app = DFlashApp(TARGET, theme_name="dark", connect=False, clock=lambda: NOW)
        for e in events(SCENARIO):
            app.feed(typed_event(e))
        async with app.run_test(size=(160, 48)) as pilot:
            await pilot.pause(0.3)
            plots = app.query_one(Plots)
            streak = shown(app, "streak")
            # the held-out τ beside the training streak, at the evals' steps
            assert streak.title == "streak · τ"
            tau_line = next(line for line in streak.lines if line[0] == "τ")
            assert dict(zip(tau_line[2], tau_line[3], strict=True)) == {
                float(k): v for k, v in evals.items() if v is not None
            }
            assert readout(app) == "" and not app.query_one("#plot-readout").display

            plots.focus()
            raw = shown(app, "loss").lines[0][3]
            assert list(raw) == [r["loss"] for r in rows]
            await pilot.press("plus", "plus")  # ema 0.8
            await pilot.pause(1.2)  # new points of the same axes wait DRAW_EVERY_S
            loss = shown(app, "loss")
            assert loss.title == "loss · ema 0.8" and len(loss.lines[0][3]) == len(raw)
            smooth = loss.lines[0][3]
            assert smooth[0] == raw[0]  # debiased: the first point is not pulled to 0
            steps = [b - a for a, b in itertools.pairwise(smooth)]
            jumps = [b - a for a, b in itertools.pairwise(raw)]
            assert statistics.pstdev(steps) < statistics.pstdev(jumps)
            assert "ema 0.8" in readout(app)
            await pilot.press("minus", "minus")
            await pilot.pause(1.2)
            assert shown(app, "loss").lines[0][3] == raw

            await pilot.press("x")  # time since the run started, in minutes
            await pilot.pause(0.3)
            acc = shown(app, "acc")
            assert acc.xlabel == "min since start"
            assert list(acc.lines[0][2]) == [r["elapsed_s"] / 60 for r in rows]
            assert "x: time" in readout(app)
            await pilot.press("x")
            await pilot.pause(0.3)
            assert shown(app, "acc").xlabel == "step"

            await pilot.press("left")  # the cursor on the newest row
            await pilot.pause(0.3)
            last = rows[-1]
            assert shown(app, "toks").cursor == float(last["step"])
            text = readout(app)
            assert text.startswith(f"step {last['step']} · ")
            assert f"loss {last['loss']:.3f}" in text and f"acc {last['acc']:.3f}" in text
            newest_eval = max(k for k, v in evals.items() if v is not None and k <= last["step"])
            assert f"τ {evals[newest_eval]:.2f} @{newest_eval}" in text
            await pilot.press("left", "left")
            await pilot.pause(0.3)
            assert readout(app).startswith(f"step {rows[-3]['step']} · ")
            await pilot.press("right", "right", "right")  # past the newest: no cursor
            await pilot.pause(0.3)
            assert shown(app, "toks").cursor is None and readout(app) == ""

    asyncio.run(go())


def test_the_ema_and_the_cursor_moves():
    assert plot_view.ema([4.0, 2.0], 0.5) == [4.0, (0.25 * 4 + 0.5 * 2) / 0.75]
    assert plot_view.ema([1.0, 5.0], 0.0) == [1.0, 5.0]
    assert plot_view.next_smoothing(0.99, up=True) == 0.99
    assert plot_view.next_smoothing(0.0, up=False) == 0.0
    rows = [type("R", (), {"step": s})() for s in (10, 20, 30)]
    assert plot_view.move_cursor(rows, None, -1) == 30  # type: ignore[arg-type]
    assert plot_view.move_cursor(rows, 30, 1) is None  # type: ignore[arg-type]
    assert plot_view.move_cursor(rows, 10, -1) == 10  # type: ignore[arg-type]
    assert plot_view.move_cursor(rows, 25, 1) == 30  # type: ignore[arg-type]


def test_the_smoother_carries_on_as_rows_come_and_starts_afresh_otherwise():
    rows = [r["loss"] for r in metrics_rows()]
    smooth = plot_view.Smoother()
    for n in range(1, len(rows) + 1):  # a row at a time, as a live run's redraws see them
        assert smooth("loss", rows[:n], 0.9) == plot_view.ema(rows[:n], 0.9)
    assert smooth("loss", rows, 0.8) == plot_view.ema(rows, 0.8)  # another weight
    assert smooth("loss", rows[3:], 0.8) == plot_view.ema(rows[3:], 0.8)  # the oldest dropped
    assert smooth("loss", rows, 0.0) == rows

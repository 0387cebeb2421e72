"""The plots row under Pilot: one panel each for tok/s, loss, acc, streak and GPU memory;
the loss axis on the recent range; `step` on the x axis; a reason in every empty panel;
lines in the theme's colours; the log-scale key; toasts clear of the plots."""

from __future__ import annotations

import asyncio
import copy
import json
import re

import pytest
from app_scenarios import NOW, RUN, healthy, heartbeat
from monitor_helpers import typed_event
from textual.widgets._toast import Toast
from textual_plotext import PlotextPlot

from dflash_tui import plot_data
from dflash_tui.app import DFlashApp
from dflash_tui.targets import Target
from dflash_tui.widgets import plots as plots_widget
from dflash_tui.widgets.plots import PlotPanel, Plots

SIZE = (160, 48)
PANELS = ("toks", "loss", "acc", "streak", "mem")


@pytest.fixture(autouse=True)
def own_config(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))


def app_for(theme: str = "dark") -> DFlashApp:
    return DFlashApp(
        Target(name="gpu-box", kind="ssh", host="gpu-box"),
        theme_name=theme,
        connect=False,
        clock=lambda: NOW,
    )


def region_text(app: DFlashApp, widget) -> str:
    """What the screen shows inside `widget`, row by row."""
    r = widget.region
    rows = []
    for strip in app.screen._compositor.render_strips()[r.y : r.bottom]:
        rows.append("".join(seg.text for seg in strip)[r.x : r.right])
    return "\n".join(rows)


def colours_in(app: DFlashApp, widget, glyphs: str) -> set[str]:
    """The foreground colours of the cells of `widget` that draw one of `glyphs`."""
    r = widget.region
    found = set()
    for strip in app.screen._compositor.render_strips()[r.y : r.bottom]:
        x = 0
        for seg in strip:
            if r.x <= x < r.right and any(g in seg.text for g in glyphs) and seg.style:
                found.add(seg.style.color.triplet.hex)  # type: ignore[union-attr]
            x += len(seg.text)
    return found


BRAILLE = "".join(chr(c) for c in range(0x2801, 0x2900))


def with_warmup_loss(events: list[dict], first_loss: float) -> list[dict]:
    """The healthy scenario with its first metrics row's loss set to a warm-up value."""
    events = copy.deepcopy(events)
    for e in events:
        if e.get("type") == "line" and e.get("file") == "metrics.jsonl":
            row = json.loads(e["text"])
            row["loss"] = first_loss
            e["text"] = json.dumps(row)
            break
    return events


async def shown(app: DFlashApp, pilot, events: list[dict]) -> None:
    for e in events:
        app.feed(typed_event(e))
    app.redraw(force=True)
    await pilot.pause(0.3)


def test_recent_range_follows_the_last_rows_not_the_warmup():
    losses = [11.7, 9.0, *[2.0 + 0.01 * i for i in range(200)]]
    lo, hi = plot_data.recent_range(losses, tail=100)
    assert 2.9 < lo < 3.0 and 3.99 < hi < 4.1  # the last 100: 3.0 .. 3.99, with 10 % margin
    assert plot_data.recent_range([None, float("nan")]) is None
    lo, hi = plot_data.recent_range([5.0, 5.0])
    assert lo < 5.0 < hi  # a flat line gets room
    lo, hi = plot_data.recent_range([0.0, 1.0, 10.0], log=True)
    assert 0.7 < lo < 1.0 and 10.0 < hi < 13.0  # log: the zero left out, the margin a factor


def test_each_series_has_its_own_panel_with_step_on_x_and_the_loss_on_its_recent_range():
    async def go():
        app = app_for()
        async with app.run_test(size=SIZE) as pilot:
            await shown(app, pilot, with_warmup_loss(healthy(), 11.7))
            for name in PANELS:
                panel = app.query_one(f"#plot-{name}", PlotPanel)
                assert panel.query_one(PlotextPlot).display, name
            texts = {n: region_text(app, app.query_one(f"#plot-{n}")) for n in PANELS}
            for name, title in (("toks", "K tok/s"), ("loss", "loss"), ("acc", "acc")):
                assert title in texts[name], texts[name]
                assert "step" in texts[name].splitlines()[-1], texts[name]
            assert "streak" in texts["streak"] and "0 = latest" in texts["mem"]
            # acc (0.10-0.12) on its own axis: its ticks are in its range, not streak's 1.4+.
            acc_ticks = [float(v) for v in re.findall(r"^\s*(\d+\.\d+)┤", texts["acc"], re.M)]
            assert acc_ticks and max(acc_ticks) < 0.2, texts["acc"]
            # The loss axis follows the recent rows (1.34-1.49), not the warm-up's 11.7.
            loss_ticks = [float(v) for v in re.findall(r"^\s*(\d+\.\d+)┤", texts["loss"], re.M)]
            assert loss_ticks and max(loss_ticks) < 2.0 and min(loss_ticks) > 1.0, texts["loss"]

    asyncio.run(go())


def test_l_switches_the_loss_axis_to_log_and_back():
    async def go():
        app = app_for()
        async with app.run_test(size=SIZE) as pilot:
            await shown(app, pilot, healthy())
            app.query_one(Plots).focus()
            await pilot.press("L")
            await pilot.pause(0.2)
            assert "loss (log)" in region_text(app, app.query_one("#plot-loss"))
            await pilot.press("L")
            await pilot.pause(0.2)
            assert "loss (log)" not in region_text(app, app.query_one("#plot-loss"))

    asyncio.run(go())


@pytest.mark.parametrize("theme", ["dark", "light", "high-contrast"])
def test_plot_lines_take_the_theme_colours(theme):
    async def go():
        app = app_for(theme)
        async with app.run_test(size=SIZE) as pilot:
            await shown(app, pilot, healthy())
            t = app.current_theme
            want = {
                "toks": t.primary,
                "loss": t.accent,
                "acc": t.success,
                "streak": t.secondary,
            }
            for name, colour in want.items():
                got = colours_in(app, app.query_one(f"#plot-{name}"), BRAILLE)
                assert got == {colour.lower()}, (name, got, colour)

    asyncio.run(go())


def test_empty_panels_say_why():
    async def go():
        app = app_for()
        async with app.run_test(size=SIZE) as pilot:
            app.redraw(force=True)
            await pilot.pause(0.2)
            # Never connected: the plots are hidden behind a blank ("no data yet"), the note
            # under the header says why (widgets/offline.py), not drawn as empty axes.
            box = " ".join(region_text(app, app.query_one("#plots-box")).split())
            assert "— no data yet" in box, box
            assert not app.query_one("#plot-loss").query_one(PlotextPlot).display

            # Connected, a run compiling, a host without GPUs.
            events = [e for e in healthy() if e["type"] in ("link", "hello", "follow")]
            events.append(
                {
                    "type": "gpu",
                    "t": NOW - 1,
                    "backend": "none",
                    "devices": [],
                    "state": "no_gpu",
                    "reason": "NVML: not found; nvidia-smi: not found",
                }
            )
            hb = heartbeat(NOW, phase="compiling", step=0)
            events.append({"type": "heartbeat", "t": NOW - 0.4, "run_id": RUN, "data": hb})
            await shown(app, pilot, events)
            loss = " ".join(region_text(app, app.query_one("#plot-loss")).split())
            mem = " ".join(region_text(app, app.query_one("#plot-mem")).split())
            assert "no metrics yet: the run is compiling" in loss, loss
            assert "no GPU samples: the host has no NVML or nvidia-smi" in mem, mem

    asyncio.run(go())


def test_a_toast_does_not_cover_the_plots():
    async def go():
        app = app_for()
        async with app.run_test(size=SIZE, notifications=True) as pilot:
            await shown(app, pilot, healthy())
            app.notify("restart: launched 20260520-094738-qwen36-27b-a1b3", timeout=30)
            app.notify("a second toast, stacked above the first", timeout=30)
            await pilot.pause(0.3)
            toasts = list(app.screen.query(Toast))
            assert toasts
            plots = app.query_one("#plots-box").region
            for toast in toasts:
                assert toast.region.area and not toast.region.overlaps(plots), (
                    toast.region,
                    plots,
                )

    asyncio.run(go())


def test_an_unchanged_store_draws_no_panel_again():
    async def go():
        app = app_for()
        async with app.run_test(size=SIZE) as pilot:
            await shown(app, pilot, healthy())
            plots = app.query_one(Plots)
            drawn = plots.drawn
            app.redraw(force=True)
            await pilot.pause(0.1)
            assert plots.drawn == drawn

    asyncio.run(go())


def test_a_theme_change_recolours_the_lines_and_the_queue_bars():
    async def go():
        app = app_for("dark")
        async with app.run_test(size=SIZE) as pilot:
            await shown(app, pilot, healthy())
            app.theme = "light"
            await pilot.pause(0.3)
            t = app.current_theme
            assert colours_in(app, app.query_one("#plot-toks"), BRAILLE) == {t.primary.lower()}
            # healthy(): every queue is between empty and full, so its bar is `success`.
            assert colours_in(app, app.query_one("#queues"), "█") == {t.success.lower()}

    asyncio.run(go())


def test_new_points_wait_for_the_next_second_then_show(monkeypatch):
    # The wait is stretched from 1 s to 4 s so that a loaded CI machine (a 0.1 s pause that
    # takes over a second) cannot let the held-back draw through before it is looked at.
    monkeypatch.setattr(plots_widget, "DRAW_EVERY_S", 4.0)

    async def go():
        app = app_for()
        async with app.run_test(size=SIZE) as pilot:
            await shown(app, pilot, healthy())
            row = {"step": 2000, "loss": 1.2, "acc": 0.2, "streak": 2.0, "tok_s": 15000.0}
            line = {"type": "line", "t": NOW, "run_id": RUN, "file": "metrics.jsonl"}
            app.feed(typed_event({**line, "offset": 0, "end": 0, "text": json.dumps(row)}))
            app.redraw(force=True)
            await pilot.pause(0.1)
            assert "2000" not in region_text(app, app.query_one("#plot-loss"))  # held back
            for _ in range(80):  # then drawn once the wait is over, without another event
                await pilot.pause(0.1)
                if "2000" in region_text(app, app.query_one("#plot-loss")):
                    break
            assert "2000" in region_text(app, app.query_one("#plot-loss"))

    asyncio.run(go())

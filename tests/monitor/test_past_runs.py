"""Past runs you can open, and comparing runs (issue 16, item 1): the real agent through the
`local` target over a run root holding run dirs a real trainer wrote (tests/fixtures/rundirs/
main-c119aa7: 6e92 finished at step 40, b507 stopped at step 51; their configs differ in
train.max_steps and train.checkpoint_every), the real Textual app under Pilot, the real CLI."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import monitor_helpers
import pytest
from monitor_helpers import Remote
from textual_plotext import PlotextPlot

from dflash_tui import control, log_pages
from dflash_tui.agent.pages import read_page
from dflash_tui.app import DFlashApp
from dflash_tui.link.link import Link
from dflash_tui.targets import Target
from dflash_tui.widgets.compare import CompareScreen
from dflash_tui.widgets.screens import RunsScreen, TextScreen
from dflash_tui.widgets.steplog import StepLog

ROOT = Path(__file__).resolve().parents[2]
RECORDED = ROOT / "tests" / "fixtures" / "rundirs" / "main-c119aa7"
FINISHED = "20261201-031405-tiny-cpu-6e92"  # the older run: 40 of 40 steps
STOPPED = "20261201-031436-tiny-cpu-b507"  # the newest: SIGTERM at step 51
SIZE = (160, 48)


@pytest.fixture
def run_root(local_target: Target) -> Target:
    root = Path(local_target.effective_run_root)
    root.mkdir(parents=True)
    for run_id in (FINISHED, STOPPED):
        shutil.copytree(RECORDED / run_id, root / run_id)
    return local_target


def log_text(log: StepLog) -> str:
    return "\n".join("".join(seg.text for seg in strip) for strip in log.lines)


def static_text(widget) -> str:
    return str(widget.render())


# -- the agent's page by byte range --------------------------------------------------------
def test_read_page_gives_whole_lines_of_a_byte_range():
    folder = str(RECORDED / FINISHED)
    data = (RECORDED / FINISHED / "train.log").read_bytes()
    tail = read_page(folder, "train.log", None, None, 300)
    assert tail["end"] == tail["size"] == len(data)
    assert data[tail["start"] - 1 : tail["start"]] == b"\n"  # starts at a line's start
    assert data[tail["start"] : tail["end"]].decode() == tail["text"]
    before = read_page(folder, "train.log", None, tail["start"], 300)
    assert before["end"] == tail["start"]  # the page before ends where the tail begins
    assert data[before["start"] : before["end"]].decode() == before["text"]
    first = read_page(folder, "train.log", 0, None, 300)
    assert first["start"] == 0 and first["text"].startswith("run dir: ")
    assert first["text"].endswith("\n") and len(first["text"]) <= 300
    # paging back from the end, page by page, gives the file exactly, first line included
    pages, end = [], None
    while end != 0:
        page = read_page(folder, "train.log", None, end, 300)
        pages.insert(0, page["text"])
        end = page["start"]
    assert "".join(pages).encode() == data
    # a range outside the file is clamped to it, and a page never exceeds what was asked
    assert read_page(folder, "train.log", -5, None, 300)["start"] == 0
    assert read_page(folder, "train.log", None, 10**9, 300)["end"] == len(data)
    assert read_page(folder, "train.log", 10**9, None, 300)["text"] == ""


def test_window_joins_pages_and_stays_bounded(monkeypatch):
    monkeypatch.setattr(log_pages, "MAX_WINDOW_LINES", 3)
    w = log_pages.Window()
    w.prepend("c\nd\n", 4, 8)
    w.prepend("a\nb\n", 0, 4)
    assert [t for _, t in w.lines] == ["a", "b", "c"] and (w.start, w.end) == (0, 6)
    assert w.joins(6) and not w.joins(7)


# -- the link: a run chosen again gets its lines again -------------------------------------
def test_switching_runs_resets_the_store_and_the_offsets(run_root, remote_factory):
    r = remote_factory(run_root)
    newest = (RECORDED / STOPPED / "train.log").read_text().splitlines()
    older = (RECORDED / FINISHED / "train.log").read_text().splitlines()
    r.wait(lambda s: list(s.log_lines) == newest, what="the newest run's whole log")
    assert r.call(control.follow(r.link, FINISHED)) == FINISHED
    r.wait(lambda s: s.run_id == FINISHED and list(s.log_lines) == older, what="older run")
    assert [m.step for m in r.store.metrics] == [10, 20, 30, 40]
    # Back to the first: the link had its offsets from the first follow, and used to drop
    # every line the agent sent again (an empty log).
    assert r.call(control.follow(r.link, STOPPED)) == STOPPED
    r.wait(lambda s: s.run_id == STOPPED and list(s.log_lines) == newest, what="back again")
    assert not any(FINISHED in ln for ln in r.store.log_lines)
    # The same run chosen again is followed afresh too: its lines once, not twice.
    assert r.call(control.follow(r.link, STOPPED)) == STOPPED
    r.wait(lambda s: s.follows == 4 and list(s.log_lines) == newest, what="chosen again")
    assert r.store.log_offsets[0] == 0


# -- the TUI --------------------------------------------------------------------------------
async def wait_for(pilot, predicate, what: str, timeout: float = 60.0):
    return await monitor_helpers.wait_for(pilot, predicate, what, timeout)  # a longer default


async def choose_run(pilot, app: DFlashApp, run_id: str) -> None:
    await pilot.press("l")
    await wait_for(pilot, lambda: isinstance(app.screen, RunsScreen), "the runs screen")
    table = app.screen.query_one("DataTable")
    rows = [str(k.value) for k in table.rows]
    table.move_cursor(row=rows.index(run_id))
    await pilot.press("enter")
    await wait_for(pilot, lambda: app.store.run_id == run_id, f"following {run_id}")


def test_an_older_run_opens_with_its_whole_log_plots_and_info(run_root, monkeypatch):
    """The agent starts a follow 600 bytes from a file's end and a page is 700 bytes, so the
    older run's first and last step lines are reached only by paging back."""
    monkeypatch.setattr(log_pages, "PAGE_BYTES", 700)
    older = (RECORDED / FINISHED / "train.log").read_text()

    async def go():
        app = DFlashApp(run_root, theme_name="dark")
        app.link = Link(run_root, app.feed, agent_extra=["--tail-bytes", "600"])
        async with app.run_test(size=SIZE) as pilot:
            log = app.query_one(StepLog)
            await wait_for(pilot, lambda: STOPPED in log_text(log), "the newest run's log")
            await choose_run(pilot, app, FINISHED)
            await wait_for(pilot, lambda: f"{FINISHED}/wandb" in log_text(log), "its tail")
            shown = log_text(log)
            assert STOPPED not in shown and "Find logs at" in shown
            assert "step=" not in shown  # only the tail so far: 600 bytes of wandb's summary

            # PageUp to the top, then past it: the page before, ending where the tail began
            await pilot.click("#steplog")
            for _ in range(5):
                await pilot.press("pageup")
                await pilot.pause(0.5)
                if "step=40 loss=4.8491" in log_text(log):
                    break
            await wait_for(pilot, lambda: "step=40 loss=4.8491" in log_text(log), "page back")
            shown = log_text(log)
            assert "finished at step 40" in shown and "Find logs at" in shown  # joined

            # g: the file's first page (a page, not the file), from its first line
            await pilot.press("g")
            await wait_for(pilot, lambda: log_text(log).startswith("run dir: "), "first page")
            assert "step=" not in log_text(log) and "more of train.log after byte" in log_text(log)
            # PageDown to its bottom, then past it: the next page, the first step line
            for _ in range(5):
                await pilot.press("pagedown")
                await pilot.pause(0.5)
                if "step=10 loss=11.6682" in log_text(log):
                    break
            await wait_for(pilot, lambda: "step=10 loss=11.6682" in log_text(log), "next page")
            assert log_text(log).startswith("run dir: ")
            assert len(log_text(log).encode()) < len(older.encode())  # pages, not the file
            await pilot.pause(0.5)  # a redraw: the title says where in the file it is
            title = static_text(app.query_one("#log-title"))
            assert "train.log from byte 0: G for the newest" in title

            # the plots: metrics.jsonl from its first row, though it is past the tail
            assert [m.step for m in app.store.metrics] == [10, 20, 30, 40]
            loss_plot = app.query_one("#plot-loss").query_one(PlotextPlot)
            await wait_for(pilot, lambda: loss_plot.display, "the loss plot drawn")
            assert loss_plot.plt._active.monitor.y

            # i: how it ended, its environment and whole config
            await pilot.press("i")
            await wait_for(pilot, lambda: isinstance(app.screen, TextScreen), "run info")
            await wait_for(pilot, lambda: app.screen.query("#body"), "its body")
            body = static_text(app.screen.query_one("#body"))
            assert f"run      {FINISHED}" in body
            assert "exit     exit code 0" in body and "at step 40 of 40" in body
            assert "train.max_steps = 40" in body and "train.checkpoint_every = 20" in body
            await pilot.press("escape")

            # back to the newest run: its lines, none of the older one's
            await choose_run(pilot, app, STOPPED)
            await wait_for(pilot, lambda: STOPPED in log_text(log), "the newest run again")
            assert FINISHED not in log_text(log)
            assert [m.step for m in app.store.metrics] == [10, 20, 30, 40, 50]
            assert static_text(app.query_one("#log-title")) == "Step log"

    asyncio.run(go())


def test_compare_two_marked_runs(run_root):
    async def go():
        app = DFlashApp(run_root, theme_name="dark")
        async with app.run_test(size=SIZE) as pilot:
            await wait_for(pilot, lambda: len(app.store.runs) == 2, "the runs list")
            await pilot.press("l")
            await wait_for(pilot, lambda: isinstance(app.screen, RunsScreen), "the runs screen")
            table = app.screen.query_one("DataTable")
            table.move_cursor(row=0)
            await pilot.press("space", "space")  # marks a row and moves to the next
            assert app.screen.marked == [STOPPED, FINISHED]
            assert str(table.get_row(STOPPED)[0]).startswith("● ")
            await pilot.press("c")
            await wait_for(pilot, lambda: isinstance(app.screen, CompareScreen), "compare")
            key = static_text(app.screen.query_one("#key"))
            assert STOPPED in key and FINISHED in key
            diffs = static_text(app.screen.query_one("#differences #body"))
            assert "train.max_steps: 400  40" in diffs
            assert "train.checkpoint_every: 200  20" in diffs
            assert "train.lr" not in diffs  # the same in both: not listed
            plot = app.screen.query_one("#cmp-loss")
            labels = plot.plt._active.monitor.label
            assert STOPPED in labels and FINISHED in labels
            await pilot.press("escape")

    asyncio.run(go())


# -- the CLI --------------------------------------------------------------------------------
def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "dflash_tui", *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
        env=dict(os.environ),
    )


def test_compare_command(run_root):
    where = ["local", "--remote-dir", run_root.remote_dir]
    r = cli("compare", FINISHED, STOPPED, *where)
    assert r.returncode == 0, r.stderr
    out = r.stdout.splitlines()
    finished = next(ln for ln in out if ln.startswith(FINISHED))
    assert finished.split()[1:5] == ["40", "4.849", "0.122", "3,382"]
    assert "finished" in finished
    assert next(ln for ln in out if ln.startswith(STOPPED)).split()[1] == "51"
    assert "  train.max_steps: 40  400" in out
    assert not any("train.lr" in ln for ln in out)

    r = cli("compare", FINISHED, STOPPED, *where, "--json")
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    assert [s["run_id"] for s in data["runs"]] == [FINISHED, STOPPED]
    assert data["runs"][0]["steps"] == 40 and data["runs"][0]["outcome"].startswith("finished")
    assert data["config_differences"]["train.max_steps"] == [40, 400]

    r = cli("compare", FINISHED, "20261201-000000-nope-0000", *where)
    assert r.returncode == 2
    assert r.stderr.strip() == "dflash-tui: no run '20261201-000000-nope-0000' under the run root"
    r = cli("compare", FINISHED, *where)  # `local` is the target: one run is no comparison
    assert r.returncode == 2
    assert r.stderr.strip() == (
        "dflash-tui: compare needs two or more run ids (dflash-tui runs lists them)"
    )


# -- environment differences ----------------------------------------------------------------
def test_environment_differences_name_what_changed_between_recorded_runs():
    """The two runs of the recorded `fingerprinted` scenario carry the real fingerprint (the
    same machine: the same environment). Edit, as test_environment.py does: the earlier
    run's transformers and fla as an older install had them."""
    from test_diagnosis import events, of_type, store

    from dflash_tui import compare

    evs = events("recorded/fingerprinted.jsonl")
    same = [compare.RunData(r) for r in store(evs).runs]
    assert len(same) == 2 and all(r.info.environment is not None for r in same)
    assert compare.environment_differences(same) == {}
    assert "environment differences: none" in compare.describe(same)

    earlier = of_type(evs, "runs")[-1]["runs"][0]["environment"]
    earlier["transformers"] = "5.17.0"
    earlier["fast_kernels"] = {**earlier["fast_kernels"], "fla": "0.4.1"}
    runs = [compare.RunData(r) for r in store(evs).runs]
    later = runs[1].info
    now_tf = later.environment.transformers if later.environment else None
    assert compare.environment_differences(runs) == {
        later.run_id: [f"transformers 5.17.0 → {now_tf}", "fla missing"]
    }
    assert (
        f"  {later.run_id} vs {runs[0].info.run_id}: transformers 5.17.0 → {now_tf}; fla missing"
        in compare.describe(runs)
    )

    old = [compare.RunData(dataclasses.replace(r.info, environment=None)) for r in runs]
    assert compare.describe(old)[-1].startswith("environment differences: not recorded")


# -- the live run, left and come back to ----------------------------------------------------
@pytest.fixture
def live_beside_recorded(run_root):
    """The recorded runs, and a real tiny trainer alive beside them (the newest run)."""
    from monitor_helpers import NO_WANDB, TINY
    from test_control_local import deploy

    from trainer.contract.protocol import Kill, Launch

    r = Remote(run_root)
    try:
        deploy(r)
        cmd = Launch(
            config_toml=TINY.read_text(),
            name="tiny-cpu",
            overrides=[NO_WANDB, "train.max_steps=100000"],
        )
        run_id = r.request(cmd)["run_id"]
        r.wait(lambda s: s.heartbeat and s.heartbeat.phase == "training", 120, "training")
        yield run_root, run_id
    finally:
        with contextlib.suppress(Exception):
            r.request(Kill(timeout_s=10, drain_timeout_s=5), timeout=40)
        r.close()


def test_going_back_to_the_live_run(live_beside_recorded):
    target, live = live_beside_recorded

    async def go():
        app = DFlashApp(target, theme_name="dark")
        async with app.run_test(size=SIZE) as pilot:
            log = app.query_one(StepLog)
            await wait_for(pilot, lambda: f"runs/{live}" in log_text(log), "the live run's log")
            await wait_for(pilot, lambda: "step=" in log_text(log), "its step lines", 120)
            await choose_run(pilot, app, FINISHED)
            await wait_for(pilot, lambda: f"{FINISHED}/wandb" in log_text(log), "the older run")
            assert live not in log_text(log)

            await choose_run(pilot, app, live)
            await wait_for(pilot, lambda: f"runs/{live}" in log_text(log), "the live run again")
            shown = log_text(log)
            assert shown.startswith("run dir: ") and FINISHED not in shown  # from its start
            assert app.store.process_alive() is not False
            # and it goes on: new step lines keep coming into the log
            seen = app.store.log_total
            await wait_for(pilot, lambda: app.store.log_total > seen, "new lines", 120)
            await wait_for(pilot, lambda: app.store.metrics, "its metrics rows", 120)
            assert app.store.metrics[0].step == app.store.step_lines[0].step  # from the first

    asyncio.run(go())

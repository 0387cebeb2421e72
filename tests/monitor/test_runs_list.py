"""The runs list as operators' other tools have theirs (issue 32, "what operators' other tools
already do"; "Seen" 6): the columns that fit 80 columns in priority order, a STEPS column that
agrees with the outcome, a filter and a sort, in the TUI's runs screen and `dflash-tui runs`.

Over a run root holding run dirs a real trainer wrote (tests/fixtures/rundirs: a finished, a
stopped, two crashed, a died-before-start run on CPU, a stopped one on an H200), read by the
real agent through the `local` target; the real Textual app under Pilot, the real CLI.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from monitor_helpers import wait_for

from dflash_tui.app import DFlashApp
from dflash_tui.targets import Target
from dflash_tui.widgets.screens import RunsScreen

ROOT = Path(__file__).resolve().parents[2]
RUNDIRS = ROOT / "tests" / "fixtures" / "rundirs"
FINISHED = "20261201-031405-tiny-cpu-6e92"  # 40 of 40, best 3,900 tok/s
STOPPED = "20261201-031436-tiny-cpu-b507"  # SIGTERM at step 51; its last metrics row: 50
CRASHED = "20261201-031510-tiny-cpu-ca8a"  # drafter-0 at step 15; last row 10
DIED = "20261201-031600-tiny-cpu-32b0"  # a bad --set: no step
H200 = "20261201-052645-tiny-gpu-2735"  # stopped at step 366 on an H200, best 8,937 tok/s
REPLAYED = "20261202-160630-tiny-cpu-56b8"  # crashed at step 150, best 3,496 tok/s


@pytest.fixture
def run_root(local_target: Target) -> Target:
    root = Path(local_target.effective_run_root)
    root.mkdir(parents=True)
    for run_dir in sorted(RUNDIRS.glob("*/2026*")):
        shutil.copytree(run_dir, root / run_dir.name)
    return local_target


def cli(target: Target, *args: str, columns: int | None = None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "COLUMNS"}
    if columns is not None:
        env["COLUMNS"] = str(columns)
    where = ["local", "--remote-dir", target.remote_dir]
    return subprocess.run(
        [sys.executable, "-m", "dflash_tui", "runs", *where, *args],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
        env=env,
    )


def rows_by_id(text: str) -> dict[str, list[str]]:
    return {ln.split()[0]: ln.split() for ln in text.splitlines()[1:]}


def test_the_cli_fits_80_columns_with_steps_that_agree_with_the_outcome(run_root):
    r = cli(run_root, columns=80)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0].split() == ["RUN", "ID", "STEPS", "BEST", "TOK/S", "BEST", "τ", "OUTCOME"]
    assert all(len(ln) <= 80 for ln in lines), lines
    rows = rows_by_id(r.stdout)
    assert rows[STOPPED][1:3] == ["51", "3,346"] and rows[STOPPED][4] == "stopped"
    assert rows[CRASHED][1] == "15" and rows[H200][1] == "366" and rows[DIED][1] == "0"

    # a pipe gets the whole outcome (for grep); STEPS the same step the outcome names
    whole = cli(run_root).stdout
    stopped = next(ln for ln in whole.splitlines() if ln.startswith(STOPPED))
    assert stopped.split()[1] == "51" and "stopped at step 51 of 400" in stopped
    assert stopped.endswith("resumable")


def test_the_cli_sorts_and_filters(run_root):
    by_toks = cli(run_root, "--sort", "tok/s")
    assert [ln.split()[0] for ln in by_toks.stdout.splitlines()[1:]] == [
        H200,
        FINISHED,
        REPLAYED,
        STOPPED,
        CRASHED,
        DIED,  # no tok/s: last
    ]
    by_steps = cli(run_root, "--sort", "steps", "--filter", "tiny-cpu")
    assert [ln.split()[0] for ln in by_steps.stdout.splitlines()[1:]] == [
        REPLAYED,
        STOPPED,
        FINISHED,
        CRASHED,
        DIED,
    ]
    newest = cli(run_root, "--sort", "start").stdout.splitlines()[1].split()[0]
    assert newest == REPLAYED
    crashed = cli(run_root, "--filter", "outcome:crash", "--json")
    assert sorted(r["run_id"] for r in json.loads(crashed.stdout)) == [CRASHED, REPLAYED]
    words = cli(run_root, "--filter", "lr ABC").stdout.splitlines()  # words, any case
    assert [ln.split()[0] for ln in words[1:]] == [DIED]


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (("--sort", "speed"), "--sort 'speed': no such key (one of: start, tok/s, tau, steps)"),
        (("--filter", "outcome:exploded"), "--filter 'outcome:exploded': no such outcome"),
        (("--filter", "a\x1b[2Jb"), "control characters are no filter"),
    ],
)
def test_a_bad_sort_or_filter_is_one_line_and_exit_2(run_root, args, said):
    r = cli(run_root, *args)
    assert r.returncode == 2 and r.stdout == ""
    assert len(r.stderr.splitlines()) == 1 and said in r.stderr, r.stderr
    assert "\x1b" not in r.stderr


def test_the_runs_screen_at_80x24_filters_and_sorts(run_root):
    async def go():
        app = DFlashApp(run_root, theme_name="dark")
        async with app.run_test(size=(80, 24)) as pilot:
            await wait_for(pilot, lambda: len(app.store.runs) == 6, "the runs list")
            await pilot.press("l")
            screen = await wait_for(
                pilot, lambda: isinstance(app.screen, RunsScreen) and app.screen, "the runs screen"
            )
            table = screen.query_one("DataTable")
            headers = [str(c.label) for c in table.columns.values()]
            # today's 80 columns showed id and outcome only
            assert headers[:5] == ["run id", "outcome", "steps", "best tok/s", "best τ"]
            assert sum(c.get_render_width(table) for c in table.columns.values()) <= 76
            ids = [str(k.value) for k in table.rows]
            assert ids[0] == REPLAYED  # newest first
            assert str(table.get_row(STOPPED)[2]) == "51"

            await pilot.press("s")  # by best tok/s
            assert [str(k.value) for k in table.rows][:2] == [H200, FINISHED]
            await pilot.press("S")  # turned round: the slowest with a figure first
            assert next(str(k.value) for k in table.rows) == CRASHED

            await pilot.press("slash", *"outcome:stop", "enter")
            assert sorted(str(k.value) for k in table.rows) == sorted([STOPPED, H200])
            title = str(screen.query_one("#runs-title").render())
            assert "2 of 6 · sort: tok/s reversed · filter: outcome:stop" in title
            # an outcome no kind starts with: said beside the input; Esc puts back the one
            # before (the list follows the text as typed, as the step log's filter does)
            await pilot.press("slash", "ctrl+u", *"outcome:qq")
            assert "no such outcome" in str(screen.query_one("#filter-error").render())
            await pilot.press("escape")
            assert sorted(str(k.value) for k in table.rows) == sorted([STOPPED, H200])

            # a wider terminal: the columns that did not fit come
            await pilot.resize_terminal(160, 48)
            await pilot.pause(0.3)
            headers = [str(c.label) for c in table.columns.values()]
            assert headers[5:] == ["phase", "error"]

            # Enter still picks the run under the cursor
            table.move_cursor(row=[str(k.value) for k in table.rows].index(STOPPED))
            await pilot.press("enter")
            await wait_for(pilot, lambda: app.store.run_id == STOPPED, "following it")

    asyncio.run(go())

"""The end of a run (issue 32): the real app under Pilot, through the real agent (the local
target), over a run dir a real trainer wrote (tests/fixtures/rundirs/main-c119aa7's 6e92:
finished at step 40 of 40, wandb offline, checkpoints at 20 and 40).

Once the followed run has ended, its summary stands in for the live views (the queues and
the stage bars are gone): outcome, steps, wall time, best tok/s, the last good checkpoint and
the export command; the step log's tail is its steps, not wandb's history and summary; the
heartbeat pane says its pid exited; quitting the demo after it does not say it goes on."""

from __future__ import annotations

import asyncio
import io
import json
import re
import shutil
from pathlib import Path

from rich.console import Console

from dflash_tui.app import DFlashApp
from dflash_tui.commands.demo import quit_words
from dflash_tui.fmt import duration, rate
from dflash_tui.targets import Target
from dflash_tui.widgets.steplog import StepLog

ROOT = Path(__file__).resolve().parents[2]
FINISHED = "20261201-031405-tiny-cpu-6e92"
RECORDED = ROOT / "tests" / "fixtures" / "rundirs" / "main-c119aa7" / FINISHED


def plain(widget) -> str:
    # Wide: the export line holds the test's remote dir, longer under xdist's worker dirs
    console = Console(width=400, record=True, file=io.StringIO(), color_system=None)
    console.print(widget.content)
    return console.export_text()


def log_text(log: StepLog) -> str:
    return "\n".join("".join(seg.text for seg in strip) for strip in log.lines)


def test_an_ended_run_shows_its_summary_in_place_of_the_live_views(local_target: Target):
    root = Path(local_target.effective_run_root)
    root.mkdir(parents=True)
    shutil.copytree(RECORDED, root / FINISHED)
    train_log = (RECORDED / "train.log").read_text()
    assert "wandb: Run summary:" in train_log.splitlines()[-20:]  # the noise is there
    ended = json.loads((RECORDED / "exit.json").read_text())
    best = max(json.loads(ln)["tok_s"] for ln in (RECORDED / "metrics.jsonl").open())

    async def go() -> None:
        app = DFlashApp(local_target, theme_name="dark")
        async with app.run_test(size=(120, 40)) as pilot:
            for _ in range(300):
                await pilot.pause(0.1)
                s = app.store
                if s.outcome() is not None and s.current_run() and s.current_run().resume:
                    break
            await pilot.pause(0.3)
            screen = app.screen
            assert screen.query_one("#summary-box").display
            assert screen.has_class("ended")
            for live in ("#queues-box", "#stages-box", "#ranks-box"):
                assert screen.query_one(live).region.height == 0, live
            summary = plain(screen.query_one("#summary"))
            where = f"local --remote-dir {local_target.remote_dir}"
            for line in (
                "outcome    finished at step 40 of 40",
                "steps      40 of 40",
                f"wall time  {duration(ended['ended_at'] - ended['started_at'])}",
                f"best tok/s {rate(best)}",
                # the previous main wrote no sidecars
                "checkpoint checkpoints/step-00000040.pt (step 40), the newest (no sidecar: "
                "unchecked)",
                f"export     dflash-tui export {where} --run {FINISHED}",
            ):
                assert line in summary, (line, summary)
            shown = log_text(app.query_one(StepLog))
            # wandb's history and summary folded; where it syncs stays
            assert "step=40" in shown and "Run summary" not in shown and "loss 4.84908" not in shown
            assert "▁" not in shown and shown.rstrip().endswith(
                f"{FINISHED}/wandb/offline-run-20261201_031411-zhtk9zq0/logs"
            )
            heartbeat = plain(app.query_one("#heartbeat"))
            assert ", exited" in heartbeat and "(pgid" not in heartbeat
            await pilot.press("q")

    asyncio.run(go())
    assert quit_words(local_target, FINISHED) == (
        f"demo: run {FINISHED} has ended; its files are in {root / FINISHED}"
    )
    (root / FINISHED / "exit.json").unlink()
    assert quit_words(local_target, "latest").startswith("demo: the run goes on until it finishes")


def test_a_step_no_run_could_reach_is_bounded_in_the_summary(local_target: Target):
    """Found by the reliability bench (2026-12-07): an ended run whose heartbeat and exit
    record said step 10**400 printed all 401 digits in the summary's steps row."""
    root = Path(local_target.effective_run_root)
    root.mkdir(parents=True)
    shutil.copytree(RECORDED, root / FINISHED)
    for name in ("heartbeat.json", "exit.json"):
        data = json.loads((root / FINISHED / name).read_text())
        data["step"] = 10**400
        (root / FINISHED / name).write_text(json.dumps(data))

    async def go() -> str:
        app = DFlashApp(local_target, theme_name="dark")
        async with app.run_test(size=(120, 40)) as pilot:
            for _ in range(300):
                await pilot.pause(0.1)
                if app.store.outcome() is not None and app.store.current_run():
                    break
            await pilot.pause(0.3)
            assert app.screen.query_one("#summary-box").display
            return plain(app.screen.query_one("#summary"))

    summary = asyncio.run(go())
    assert "steps      >1e12 (implausible) of 40" in summary, summary
    assert not re.search(r"\d{16,}", summary), summary

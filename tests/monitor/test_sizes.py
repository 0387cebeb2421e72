"""Every size from 80x24 up (issue 32): the real app under Pilot at 80x24, 120x40 and
160x48, fed the scripted streams, a recorded heartbeat or a real local agent over the NVML
stand-in, read as the screen's text."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from app_scenarios import NOW, RUN, healthy
from monitor_helpers import typed_event
from rank_fixtures import events, now_of
from test_layout_keys import fed, screen_text, scripted, until
from textual.widgets import Button, DataTable

from dflash_tui.app import DFlashApp
from dflash_tui.restart_offer import ALIVE, Offer
from dflash_tui.state import Store
from dflash_tui.targets import Target
from dflash_tui.widgets.dialogs import TypedConfirm
from dflash_tui.widgets.layout import MIN_HEIGHT, MIN_WIDTH, plan
from dflash_tui.widgets.restart_dialog import RestartDialog
from dflash_tui.widgets.thread_table import (
    COLUMNS,
    NAME_NARROW,
    SIGNAL_WHAT,
    WAITS_COLUMN,
    ThreadsScreen,
    fitted,
)
from trainer.contract.protocol import MAX_PROC_NAME, PROCESS_SIGNALS, Follow, HeartbeatEvent

ROOT = Path(__file__).resolve().parents[2]
SIZES = [(80, 24), (120, 40), (160, 48)]  # the sizes issue 32 names
CONNECTED = {"type": "link", "state": "connected", "target": "cpu-box", "version": 3}
H200_RUN = (
    ROOT / "tests" / "fixtures" / "rundirs" / "h200-schema2" / "20261201-052645-tiny-gpu-2735"
)


@pytest.fixture(autouse=True)
def own_config(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))


def run(coro):
    return asyncio.run(coro)


# -- the header -------------------------------------------------------------------------


def test_time_in_training_counts_from_its_first_visit_not_the_last_checkpoint():
    """A real H200 run's heartbeat, written in its second training visit (after a save)."""
    beats = [json.loads(line) for line in (H200_RUN / "telemetry.jsonl").read_text().splitlines()]
    beat = next(
        b
        for b in beats
        if b["phase"] == "training" and "checkpointing" in [v["phase"] for v in b["phase_history"]]
    )
    now = beat["now"]
    s = Store("local", clock=lambda: now)
    s.apply(Follow(run_id=beat["run_id"], t=now))
    s.apply(HeartbeatEvent(run_id=beat["run_id"], data=beat, t=now))
    first = next(v["started_at"] for v in beat["phase_history"] if v["phase"] == "training")
    assert beat["phase_started_at"] > first  # the trainer's own clock restarted at the save
    phase, age = s.shown_phase()
    assert phase == "training" and age == pytest.approx(now - first)
    assert s.phase()[1] == pytest.approx(now - beat["phase_started_at"])  # the visit's own


# -- below the minimum ------------------------------------------------------------------


@pytest.mark.parametrize("size", [(79, 24), (80, 23), (40, 10), (20, 5)])
def test_below_80x24_one_line_says_the_minimum_and_the_dashboard_comes_back(size):
    async def go():
        app = scripted()
        async with app.run_test(size=size) as pilot:
            for e in healthy():
                app.feed(typed_event(e))
            app.redraw(force=True)
            await pilot.pause(0.3)
            lines = [ln for ln in screen_text(app).splitlines() if ln.strip()]
            assert len(lines) == 1, lines
            w, h = size
            assert f"{MIN_WIDTH}x{MIN_HEIGHT}" in lines[0] and f"{w}x{h}" in lines[0], lines
            assert len(lines[0].rstrip()) <= w
            await pilot.resize_terminal(80, 24)
            await until(pilot, lambda: "step=876" in screen_text(app))
            back = screen_text(app)
            assert "step=876" in back and "needs at least" not in back

    run(go())


# -- the threads table ------------------------------------------------------------------


def procs_event() -> dict:
    """The run's process group as the agent sends it: command lines as long as the contract
    keeps (MAX_PROC_NAME), a trainer, its worker children and the launch wrapper."""
    trainer = "/usr/bin/python3 -u -m trainer --config /workspace/dflash/configs/qwen36.toml"
    worker = "/usr/bin/python3 -c from multiprocessing.spawn import spawn_main; spawn_main()"

    def proc(pid: int, name: str, cpu: float, rss_gib: int) -> dict:
        return {
            "pid": pid,
            "start": 1000 + pid,
            "ppid": 4242,
            "state": "S",
            "name": name[:MAX_PROC_NAME],
            "cpu_pct": cpu,
            "rss": rss_gib << 30,
            "threads": 4,
        }

    return {
        "type": "procs",
        "t": NOW,
        "run_id": RUN,
        "pgid": 4242,
        "leader": 4242,
        "procs": [
            proc(4242, trainer, 512.3, 48),
            *(proc(4250 + i, worker, 3.0, 2) for i in range(4)),
        ],
        "wrapper": proc(4241, "python3 -u -c BOOTSTRAP wrap", 0.1, 0),
    }


def table_text(app: DFlashApp) -> list[str]:
    table = app.screen.query_one(DataTable)
    return [str(c.label) for c in table.columns.values()]


@pytest.mark.parametrize("size", SIZES, ids=[f"{w}x{h}" for w, h in SIZES])
def test_the_threads_table_keeps_its_important_columns_and_scrolls_sideways(size):
    async def go():
        app = scripted()
        async with app.run_test(size=size) as pilot:
            await fed(pilot, app, [*healthy(), procs_event()])
            await pilot.press("T")
            await until(pilot, lambda: isinstance(app.screen, ThreadsScreen))
            await pilot.pause(0.3)
            shown = table_text(app)
            screen = screen_text(app)
            # The name, its CPU, what it does and its role at every width, in table order.
            assert [c for c in shown if c in ("name", "role", "state", "CPU %")] == [
                "name",
                "role",
                "state",
                "CPU %",
            ]
            every = [*COLUMNS, WAITS_COLUMN]
            left_out = [c or "T/P" for c in every if c not in shown]
            if left_out:  # said, with the way to see them
                assert f"left out: {', '.join(left_out)}" in " ".join(screen.split()), screen
                assert "(a: every column)" in " ".join(screen.split())
            # Nothing cut at the right edge: the last column's header is whole on screen.
            header = next(ln for ln in screen.splitlines() if "CPU %" in ln and " role " in ln)
            assert header.rstrip().endswith(shown[-1]), header
            table = app.screen.query_one(DataTable)
            assert table.max_scroll_x == 0  # fitted: no sideways scrolling needed
            if size[0] < 160:
                assert left_out
                await pilot.press("a")  # every column, the table scrolls sideways
                await pilot.pause(0.3)
                assert table_text(app) == every
                assert table.max_scroll_x > 0
                for _ in range(5):
                    await pilot.press("right")
                await pilot.pause(0.2)
                assert table.scroll_x > 0
            else:
                # 160 columns: what it does, for how long, its slowest stage and memory stay
                assert set(left_out) <= {"T/P", "device"}, left_out

    run(go())


def test_fitting_drops_the_least_important_columns_first():
    every = [*COLUMNS, WAITS_COLUMN]
    widths = [1, 70, 8, 6, 14, 4, 5, 7, 14, 10, 12]
    assert fitted(widths, 1000) == (list(range(len(every))), None)
    shown, name_w = fitted(widths, 78)
    names = [every[i] for i in shown]
    assert name_w == NAME_NARROW and names[:2] == ["name", "role"]
    assert "device" not in names and "" not in names and "CPU %" in names
    assert sum((name_w if every[i] == "name" else widths[i]) + 2 for i in shown) <= 78


# -- dialogs ----------------------------------------------------------------------------

QUESTION = (
    f"Restart run {RUN}? It is alive: it is killed first (SIGTERM to its process group, "
    "then SIGKILL after 30 s), the GPU memory drained, and the same config launched again."
)
KILL_QUESTION = f"Kill run {RUN}? SIGTERM, then SIGKILL after 30 s."
DIALOGS = {
    "confirm": lambda: TypedConfirm(
        f"Kill run {RUN}? SIGTERM, then SIGKILL after 30 s.", ("kill",)
    ),
    "restart": lambda: RestartDialog(
        Offer(ALIVE, RUN, QUESTION, "Resume from step 800 (checkpoints/step-00000800.pt)")
    ),
    "signal": lambda: signal_dialog(
        f"Signal pid 4242 (python3 -m trainer), the run's trainer (run {RUN})? The agent "
        "sends it only if pid 4242 still lives, started at the same tick."
    ),
}


@pytest.mark.parametrize("size", SIZES, ids=[f"{w}x{h}" for w, h in SIZES])
@pytest.mark.parametrize("dialog", sorted(DIALOGS))
def test_every_dialog_and_its_buttons_fit_on_screen(dialog, size):
    async def go():
        app = scripted()
        async with app.run_test(size=size) as pilot:
            await fed(pilot, app, healthy())
            app.push_screen(DIALOGS[dialog]())
            await pilot.pause(0.3)
            screen = app.screen
            box = screen.children[0].region  # the dialog's box (a Vertical, or a VerticalScroll)
            assert box.x >= 0 and box.right <= size[0] and box.bottom <= size[1], box
            buttons = list(screen.query(Button))
            assert buttons or dialog in ("confirm", "signal")  # a typed word, no buttons
            for b in buttons:  # whole, inside the dialog: none past its edge or over another
                r = b.region
                assert r.width > 0 and box.x <= r.x and r.right <= box.right, (b.id, r, box)
                assert r.bottom <= box.bottom, (b.id, r, box)
                label = str(b.label)
                assert label in screen_text(app), label
            regions = [b.region for b in buttons]
            assert not any(a.overlaps(b) for i, a in enumerate(regions) for b in regions[i + 1 :])
            await pilot.press("escape")

    run(go())


# -- the GPUs, from a real local agent over the NVML stand-in ---------------------------


@pytest.mark.parametrize("size", SIZES, ids=[f"{w}x{h}" for w, h in SIZES])
def test_the_gpu_pane_is_on_screen_at_every_size_on_a_gpu_host(
    size, local_target, fake_gpu, monkeypatch
):
    """At 80x24 on an H200 host the GPUs were an empty black region: here the real agent
    samples 8 stand-in H200s (one throttled for heat) and the pane shows them at each size,
    a row per device where the rows allow, else one line, whole figures either way."""
    _, gpu = fake_gpu(devices=8)
    for i in range(8):
        gpu.set_device(i, util=60 + i, power_w=300.0 + i, temp_c=50 + i)
    gpu.set_device(5, sm_clock_mhz=1410, clocks_event_reasons=0x40, temp_c=91)
    for k, v in gpu.env.items():
        monkeypatch.setenv(k, v)

    async def go():
        app = DFlashApp(local_target, theme_name="dark")
        async with app.run_test(size=size) as pilot:
            # The memory comes with the first sample; the utilisation may show "—" until a
            # later one (a loaded machine drew that frame once): wait for both.
            await until(
                pilot, lambda: "/140G" in screen_text(app) and "67%" in screen_text(app), timeout=30
            )
            screen = screen_text(app)
            if plan(*size).gpus_compact:
                line = next(ln for ln in screen.splitlines() if "8× H200" in ln)
                assert "util " in line and "60–67%" in line and "300–307W" in line, line
                assert "GPU 5 thm" in line, line  # the throttled one, named
            else:
                devices = [ln for ln in screen.splitlines() if "/140G" in ln]
                assert len(devices) == 8, screen
                assert all(f"{60 + i}%" in ln for i, ln in enumerate(devices)), devices
                assert all(f"{50 + i}C" in ln or "91C" in ln for i, ln in enumerate(devices))

    run(go())


# -- a processes-mode job's ranks ---------------------------------------------------------


def test_a_processes_mode_jobs_ranks_are_named_when_there_is_no_room_for_them():
    """A real 4-rank job's heartbeats (tests/fixtures/ranks/slow-drafter) at 80x24: no room
    for the ranks pane, and the step log's border says so; a threads-mode run's note has no
    ranks in it (test_every_size_keeps_phase_step_alerts_queues_and_help)."""
    name = "slow-drafter"

    async def go():
        target = Target(name="cpu-box", kind="ssh", host="cpu-box")
        app = DFlashApp(target, connect=False, clock=lambda: now_of(name))
        async with app.run_test(size=(80, 24)) as pilot:
            app.feed(typed_event({**CONNECTED, "t": now_of(name)}))
            for e in events(name):
                app.feed(typed_event(e))
            await until(pilot, lambda: "Ranks (30+ rows)" in screen_text(app))
            assert "hidden: Heartbeat (30+ rows) · Ranks (30+ rows) · Stages" in screen_text(app)

    run(go())


# -- zoom -------------------------------------------------------------------------------


@pytest.mark.parametrize(("box_id", "size"), [("#plots-box", (160, 48)), ("#gpus-box", (80, 24))])
def test_z_gives_the_focused_pane_the_whole_screen_and_back(box_id, size):
    """The plots' height and the GPUs' compact row are set for the layout; zoomed, each takes
    the screen (no `╱` hatching round a small box), the GPUs a row per device again."""

    async def go():
        app = scripted()
        async with app.run_test(size=size) as pilot:
            await fed(pilot, app, healthy())
            box = app.query_one(box_id)
            small = box.region
            box.focus()
            await pilot.press("z")
            await until(pilot, lambda: app.screen.maximized is box)
            await pilot.pause(0.3)
            screen = screen_text(app)
            assert "╱" not in screen, screen
            assert box.region.width == size[0] and box.region.height >= size[1] - 2, box.region
            if box_id == "#gpus-box":
                assert len([ln for ln in screen.splitlines() if "/140G" in ln]) == 8, screen
            await pilot.press("z")
            await until(pilot, lambda: app.screen.maximized is None)
            await pilot.pause(0.3)
            assert box.region == small  # back where the layout puts it
            if box_id == "#gpus-box":
                assert "8× H200  util " in screen_text(app)

    run(go())


def signal_dialog(question: str) -> TypedConfirm:
    """The threads view's per-process signal, as it opens it (widgets/thread_table.py)."""
    return TypedConfirm(question, PROCESS_SIGNALS, SIGNAL_WHAT)

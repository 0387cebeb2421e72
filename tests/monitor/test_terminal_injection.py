"""Terminal injection, end to end: escape sequences, C1 controls, bidi overrides, CR progress
bars and Rich markup written into a real run dir (train.log lines, heartbeat strings, thread
names in a stack dump, an exit record's error, a run folder's name), read by the real agent
over the real link (a local subprocess, and OpenSSH's sshd), and shown by each view as an
operator runs it: `status`, `runs`, `dump-stacks`, headless lines, `--json`, and the TUI
under Pilot. No view may hand the terminal a raw ESC, C1 or bidi control, or read the host's
text as markup; each shows the sequence as text; `--json` keeps the exact strings.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from monitor_helpers import ROOT, piped_env

from trainer.contract.heartbeat import ErrorInfo
from trainer.contract.ranks import RANK_SCHEMA_VERSION, RankHeartbeat

# Every attack in one string, each after a letter so a test can find it.
ATTACKS = (
    "A\x1b[2J B\x1b]0;title\x07 C\x1b]8;;http://evil\x1b\\text\x1b]8;;\x1b\\ "
    "D\x1b]52;c;ZXZpbA==\x07 E\x9b2J F\u202eG [link=http://x]y[/link] [bold red]H[/]"
)
# What each view shows instead: the sequences as text, the markup as its brackets.
SHOWN = [
    r"A\x1b[2J",
    r"B\x1b]0;title\x07",
    "C\\x1b]8;;http://evil\\x1b\\text\\x1b]8;;\\x1b\\",
    r"D\x1b]52;c;ZXZpbA==\x07",
    r"E\x9b2J",
    r"F\u202eG",
    "[link=http://x]y[/link]",
    "[bold red]H[/]",
]
STEP = "[1m] step=7 loss=1.2345 acc=0.500 | "
STEP_LINES = [
    STEP + ATTACKS,
    # A progress bar redrawn with CR: only its last state is shown.
    "[1m] step=8 loss=1.1 10%\r[1m] step=8 loss=1.1 50%\r[1m] step=8 loss=1.1 done 100%",
]
BAD_RUN_ID = "evil\x1b[2J\x1b]0;t\x07\u202e"  # a folder name: never listed (the agent's rule)

FIXTURE = ROOT / "tests" / "fixtures" / "rundirs" / "h200-schema2"
OLD_RUN = "20261201-052645-tiny-gpu-2735"
LIVE_RUN = "20991231-000000-hostile-0001"
HOSTILE_TRAINER = ROOT / "tests" / "infra" / "hostile_trainer.py"


def assert_terminal_safe(text: str, where: str) -> None:
    """No ESC, C0 (but TAB and NEWLINE), C1 or bidi control: nothing a terminal acts on."""
    for i, ch in enumerate(text):
        o = ord(ch)
        bad = (o < 0x20 and ch not in "\t\n") or 0x7F <= o < 0xA0
        bad = bad or o in (0x061C, 0x200E, 0x200F, 0x2028, 0x2029)
        bad = bad or 0x202A <= o <= 0x202E or 0x2066 <= o <= 0x2069
        assert not bad, f"{where}: raw {ch!r} at {i}: …{text[max(0, i - 40) : i + 40]!r}…"


class HostileRunRoot:
    """A run root holding an old run that crashed with a hostile error, a live run (the
    stand-in trainer process) with a hostile heartbeat and train.log, and a folder whose
    name is an escape sequence."""

    def __init__(self, base: Path) -> None:
        self.root = base / "runs"
        old = self.root / OLD_RUN
        shutil.copytree(FIXTURE / OLD_RUN, old)
        exit_record = json.loads((old / "exit.json").read_text())
        exit_record.update(exit_code=1, final_phase="crashed", error=ATTACKS)
        (old / "exit.json").write_text(json.dumps(exit_record))
        (old / "train.log").write_text("\n".join(STEP_LINES) + "\n")

        bad = self.root / BAD_RUN_ID
        bad.mkdir()
        (bad / "config.json").write_text((FIXTURE / OLD_RUN / "config.json").read_text())

        self.live = self.root / LIVE_RUN
        self.live.mkdir()
        config = json.loads((FIXTURE / OLD_RUN / "config.json").read_text())
        config["run"]["created"] = time.time()
        (self.live / "config.json").write_text(json.dumps(config))
        (self.live / "train.log").write_text("\n".join(STEP_LINES) + "\n")
        # processes mode: a rank heartbeat (the contract's own writer) whose host and error
        # are attacks, a torn one, and a symlink where one should be.
        rank0 = RankHeartbeat(
            schema=RANK_SCHEMA_VERSION,
            run_id=LIVE_RUN,
            rank=0,
            world_size=2,
            role="target",
            index=0,
            device="cuda:0",
            pid=os.getpid(),
            host=ATTACKS,
            now=time.time(),
            phase="crashed",
            error=ErrorInfo(thread="target-0", message=ATTACKS),
            failed_rank=0,
        )
        (self.live / "heartbeat-rank0.json").write_text(json.dumps(rank0.to_json()))
        (self.live / "heartbeat-rank1.json").write_text('{"schema": 1, "rank": ')
        (self.live / "heartbeat-rank2.json").symlink_to("/etc/passwd")
        text_file = base / "attacks.txt"
        text_file.write_text(ATTACKS, encoding="utf-8")
        self.proc = subprocess.Popen(
            [
                sys.executable,
                str(HOSTILE_TRAINER),
                str(self.live),
                str(text_file),
                str(FIXTURE / OLD_RUN / "heartbeat.json"),
            ],
            cwd=ROOT,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
        )
        deadline = time.monotonic() + 30
        while not (self.live / "heartbeat.json").exists():
            assert time.monotonic() < deadline and self.proc.poll() is None, "no heartbeat"
            time.sleep(0.05)

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)


@pytest.fixture
def hostile(tmp_path: Path) -> Iterator[HostileRunRoot]:
    r = HostileRunRoot(tmp_path)
    yield r
    r.close()


def cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "dflash_tui", *args],
        capture_output=True,
        text=True,
        encoding="utf-8",
        errors="surrogateescape",
        timeout=120,
        cwd=ROOT,
        env={**piped_env(), "NO_COLOR": "1", **(env or {})},
    )


@pytest.fixture(params=["local", "ssh"])
def where(
    request: pytest.FixtureRequest, hostile: HostileRunRoot, tmp_path: Path
) -> tuple[list[str], dict[str, str]]:
    """The CLI's target arguments and environment: the local transport, or a real sshd
    reached through an ssh alias (the agent then runs in an sshd session)."""
    common = ["--run-root", str(hostile.root), "--remote-dir", str(tmp_path / "remote")]
    if request.param == "local":
        return ["local", *common], {}
    sshd = request.getfixturevalue("sshd")
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    (home / ".ssh" / "config").write_text(sshd.ssh_config.read_text())
    return ["gpu-box", *common, "--python", sys.executable], {"HOME": str(home)}


def assert_shows_attacks(text: str, where: str, shown: list[str] = SHOWN) -> None:
    assert_terminal_safe(text, where)
    missing = [s for s in shown if s not in text]
    assert not missing, f"{where}: not shown as text: {missing}\n{text}"


# -- the command line ------------------------------------------------------------------------
def test_status_shows_hostile_strings_as_text(where: tuple[list[str], dict[str, str]]) -> None:
    args, env = where
    r = cli("status", *args, env=env)
    assert r.returncode in (0, 1, 2), r.stdout + r.stderr
    out = r.stdout
    assert_terminal_safe(out + r.stderr, "status")
    first = out.splitlines()[0]
    assert first.split()[1] == "training" and len(first) <= 120
    # The findings quote the host's thread names and states (the stuck drafter).
    assert_shows_attacks(out, "status's findings")
    assert r"drafter-0 A\x1b[2J" in out, out
    # Each rank's line: the hostile one as text, the torn and the symlinked one named.
    assert r"rank 0 (target 0) pid" in out and r"on A\x1b[2J" in out, out
    assert "rank 0 (target 0) failed on" in out  # the rank_failed finding
    assert "rank 1: unreadable (" in out and "rank 2: unreadable (" in out, out


def test_status_json_keeps_the_exact_strings(where: tuple[list[str], dict[str, str]]) -> None:
    args, env = where
    r = cli("status", *args, "--json", env=env)
    assert r.stdout.isascii()  # JSON escapes every control and non-ASCII character
    snap = json.loads(r.stdout.splitlines()[0])
    assert snap["state"]["run_id"] == LIVE_RUN
    assert snap["state"]["phase"] == "training"
    assert any(ATTACKS in f["evidence"] or ATTACKS in f["title"] for f in snap["findings"])
    (target,) = snap["state"]["stages"]  # the one thread with stage times, its names exact
    assert target["thread"] == f"target-0 {ATTACKS}"
    assert [st["stage"] for st in target["stages"]] == ["wait q_hs", f"forward {ATTACKS}"]


def test_runs_shows_the_crash_error_as_text(where: tuple[list[str], dict[str, str]]) -> None:
    args, env = where
    r = cli("runs", *args, env=env)
    assert r.returncode == 0, r.stderr
    assert_terminal_safe(r.stdout + r.stderr, "runs")
    rows = r.stdout.splitlines()
    assert any(row.startswith(OLD_RUN) for row in rows) and any(LIVE_RUN in x for x in rows)
    assert not any(row.startswith("evil") for row in rows)  # not a run id the agent lists
    old = next(row for row in rows if row.startswith(OLD_RUN))
    assert r"A\x1b[2J" in old, old  # its outcome quotes the exit record's error


def test_dump_stacks_shows_thread_names_as_text(where: tuple[list[str], dict[str, str]]) -> None:
    args, env = where
    r = cli("dump-stacks", *args, "--no-pyspy", env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    assert_shows_attacks(r.stdout + r.stderr, "dump-stacks")
    assert f'Thread "drafter-0 {SHOWN[0]}' in r.stdout
    assert "# faulthandler" in r.stdout


def test_headless_lines_and_json_lines(hostile: HostileRunRoot, tmp_path: Path) -> None:
    """The headless monitor's text lines show the step lines escaped (the progress bar at
    its last state); its JSON lines carry them exact."""
    args = ["local", "--run-root", str(hostile.root), "--remote-dir", str(tmp_path / "r")]
    outs = {}
    for mode in ([], ["--json"]):
        p = subprocess.Popen(
            [sys.executable, "-m", "dflash_tui", *args, "--headless", "--interval", "0.3", *mode],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            cwd=ROOT,
            env={**os.environ, "NO_COLOR": "1"},
        )
        time.sleep(4)
        p.send_signal(signal.SIGINT)
        out, err = p.communicate(timeout=30)
        assert p.returncode == 0, err
        outs[bool(mode)] = out.decode("utf-8")
    text = outs[False]
    assert_shows_attacks(text, "headless")
    lines = text.splitlines()
    assert STEP + SHOWN[0] in text
    assert "[1m] step=8 loss=1.1 done 100%" in lines and "50%" not in text  # the last state
    assert any(" training " in ln and "| step 366 |" in ln for ln in lines)  # status lines

    events = [json.loads(ln) for ln in outs[True].splitlines()]
    texts = [
        o["event"]["text"]
        for o in events
        if o["kind"] == "event"
        and o["event"]["type"] == "line"
        and o["event"]["file"] == "train.log"
    ]
    assert STEP_LINES[0] in texts and STEP_LINES[1] in texts  # exact, CRs and all
    heartbeats = [
        o["event"] for o in events if o["kind"] == "event" and o["event"]["type"] == "heartbeat"
    ]
    assert heartbeats and heartbeats[-1]["data"]["error"]["message"] == ATTACKS


# -- the TUI ---------------------------------------------------------------------------------
def screen_text(app: Any) -> str:
    """What the screen on top shows: every cell of every line, as the terminal gets it
    (Textual writes the style around these characters, never in them)."""
    strips = app.screen._compositor.render_strips()
    return "\n".join("".join(seg.text for seg in strip) for strip in strips)


def test_the_tui_shows_hostile_strings_as_text(
    hostile: HostileRunRoot, tmp_path: Path, fake_gpu: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The app over a real link to the hostile run root (fake NVML for the GPU pane): the
    main screen, the runs screen, the stacks screen, restart's choice and a toast, each
    rendered and read."""
    from textual.widgets._toast import Toast

    from dflash_tui.app import DFlashApp
    from dflash_tui.targets import resolve_target
    from dflash_tui.widgets.steplog import StepLog

    _, gpu = fake_gpu(devices=1)
    for key, value in gpu.env.items():
        monkeypatch.setenv(key, value)
    target = resolve_target(
        "local", run_root=str(hostile.root), remote_dir=str(tmp_path / "r"), python=sys.executable
    )
    # The old run's checkpoints folder, planted: a symlink whose target is the attacks. Restart's
    # choice quotes why it is refused.
    checkpoints = hostile.root / OLD_RUN / "checkpoints"
    shutil.rmtree(checkpoints)
    checkpoints.symlink_to(ATTACKS)
    seen: dict[str, str] = {}

    async def wait_for(pilot: Any, what: str, ok: Any, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while not ok():
            assert time.monotonic() < deadline, f"timed out waiting for {what}"
            await pilot.pause(0.1)

    async def go() -> None:
        app = DFlashApp(target, theme_name="dark")
        async with app.run_test(size=(240, 70), notifications=True) as pilot:
            s = app.store
            await wait_for(
                pilot,
                "the live run",
                lambda: (
                    s.heartbeat is not None
                    and s.gpu is not None
                    and s.gpu.devices
                    and len(s.log_lines) >= 2
                    and len(s.runs) >= 2
                ),
            )
            app.redraw(force=True)
            await pilot.pause(0.3)
            seen["main"] = screen_text(app)
            log = app.query_one(StepLog)
            seen["steplog"] = "\n".join(strip.text for strip in log.lines)

            await pilot.press("l")
            await pilot.pause(0.5)
            seen["runs"] = screen_text(app)
            await pilot.press("escape")
            await pilot.pause(0.2)

            await pilot.press("d")
            await wait_for(pilot, "the stacks screen", lambda: "Stacks of pid" in screen_text(app))
            await pilot.pause(0.3)
            seen["stacks"] = screen_text(app)
            await pilot.press("escape")
            await pilot.pause(0.2)

            # Restart's choice for the old run (followed from the runs screen): why its
            # checkpoints are refused quotes the symlink's target.
            await pilot.press("l")
            await pilot.pause(0.5)
            await pilot.press("down", "enter")  # the newest first: the old run is second
            await wait_for(
                pilot,
                "the old run's resume point",
                lambda: (
                    s.run_id == OLD_RUN
                    and (run := s.current_run()) is not None
                    and run.resume is not None
                ),
            )
            await pilot.press("r")
            await wait_for(
                pilot, "restart's choice", lambda: "type fresh and Enter" in screen_text(app)
            )
            seen["restart"] = screen_text(app)
            await pilot.press("escape")
            await pilot.pause(0.2)

            # A toast, as an agent's error is shown (`{name}: {error}`).
            app.notify(f"toast {ATTACKS}", title=f"title {ATTACKS}", timeout=30)
            await pilot.pause(0.5)
            seen["toast"] = screen_text(app)
            seen["toast widget"] = "\n".join(t.render().plain for t in app.screen.query(Toast))

    asyncio.run(go())
    for name, text in seen.items():
        assert_terminal_safe(text, name)
    main = seen["main"]
    assert r"A\x1b[2J B\x1b]0;title\x07" in main  # the heartbeat pane: the error
    assert r"drafter-0 A\x1b[2J" in main  # the alert naming the stuck thread
    # The stage bars: the thread's name (cut to its column) and the stage's, as text.
    assert r"target-0 A\x1…" in main and r"forward A\x1b[2J B\x1b]0;title\x07" in main
    assert "[link=http://x]y[/link] [bold red]H[/]" in main  # markup shown, not applied
    # The ranks pane: the hostile rank's host as text (cut to its column), marked failed.
    assert re.search(r"target 0\s+A\\x1b\[2J .*cuda:0\s+crashed\s.*failed", main), main
    assert_shows_attacks(seen["steplog"], "step log")
    assert "+1m step=8 loss=1.1 done 100%" in seen["steplog"] and "50%" not in seen["steplog"]
    assert r"A\x1b[2J" in seen["runs"] and LIVE_RUN in seen["runs"]
    assert "evil" not in seen["runs"]
    assert_shows_attacks(seen["stacks"], "stacks screen", SHOWN[:2])
    words = " ".join(seen["restart"].replace("█", " ").split())  # as wrapped in the dialog
    assert "It has no good checkpoint: the new run starts at step 0." in words, words
    assert "Restart from step 0: type fresh and Enter" in words
    assert r"is a symlink to A\x1b[2J B\x1b]0;title\x07" in seen["restart"].replace("\n", "")
    assert r"toast A\x1b[2J" in seen["toast"]  # on screen
    assert_shows_attacks(seen["toast widget"], "toast", [f"title {SHOWN[0]}", f"toast {SHOWN[0]}"])
    assert "[link=http://x]y[/link] [bold red]H[/]" in seen["toast widget"]  # not markup

"""`dflash-tui fleet`: every configured target at once, over the real thing each time: a
config.toml in XDG_CONFIG_HOME with two local run roots holding run dirs the previous main's
trainer and agent really wrote (tests/fixtures/rundirs/main-c119aa7: one finished, one
crashed), read by real local agents (and one over a real sshd, tests/infra/sshd.py), and an
ssh:// target on a closed port of 127.0.0.1 (a bound socket that does not listen: the kernel
refuses every connect to it)."""

from __future__ import annotations

import asyncio
import io
import json
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from rich.console import Console

from dflash_tui.app_fleet import FleetApp
from dflash_tui.fleet import configured_targets
from dflash_tui.fleet_links import Fleet
from dflash_tui.widgets.fleet import FleetScreen
from dflash_tui.widgets.header import StatusBar
from dflash_tui.widgets.heartbeat import HeartbeatPane

ROOT = Path(__file__).resolve().parents[2]
RECORDED = ROOT / "tests" / "fixtures" / "rundirs" / "main-c119aa7"
FINISHED, CRASHED = "20261201-031405-tiny-cpu-6e92", "20261201-031510-tiny-cpu-ca8a"


@pytest.fixture
def closed_port() -> Iterator[int]:
    """A port on 127.0.0.1 nothing listens on, held for the test so nothing else takes it."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        yield s.getsockname()[1]


def write_config(home: Path, targets: dict[str, dict[str, str]]) -> Path:
    lines = []
    for name, keys in targets.items():
        lines.append(f"[targets.{name}]")
        lines += [f"{k} = {json.dumps(v)}" for k, v in keys.items()]
        lines.append("")
    path = home / "dflash-tui" / "config.toml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines))
    return home


def run_root(base: Path, run: str) -> dict[str, str]:
    """A local target whose run root holds one recorded run dir, copied."""
    shutil.copytree(RECORDED / run, base / "runs" / run)
    return {"target": "local", "remote_dir": str(base), "run_root": str(base / "runs")}


@pytest.fixture
def three(tmp_path: Path, closed_port: int) -> Path:
    """XDG_CONFIG_HOME of a fleet: a finished run, a crashed run, a closed port."""
    (tmp_path / "known_hosts").write_text("")
    return write_config(
        tmp_path / "config",
        {
            "box-a": run_root(tmp_path / "a", FINISHED),
            "box-b": run_root(tmp_path / "b", CRASHED),
            "dead": {
                "target": f"ssh://127.0.0.1:{closed_port}",
                "known_hosts": str(tmp_path / "known_hosts"),
            },
        },
    )


def fleet_cli(config_home: Path, *args: str) -> tuple[subprocess.CompletedProcess, float]:
    t0 = time.monotonic()
    r = subprocess.run(
        [sys.executable, "-m", "dflash_tui", "fleet", *args],
        capture_output=True, text=True, timeout=60, cwd=ROOT,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin", "HOME": str(config_home.parent),
             "XDG_CONFIG_HOME": str(config_home)},
    )  # fmt: skip
    return r, time.monotonic() - t0


def test_once_names_every_target_and_exits_with_the_worst_status(three):
    r, seconds = fleet_cli(three, "--headless", "--once")
    assert r.returncode == 3, r.stdout + r.stderr  # unreachable is the worst
    lines = {line.split()[0]: line for line in r.stdout.splitlines()}
    assert sorted(lines) == ["box-a", "box-b", "dead"], r.stdout
    a, b, dead = lines["box-a"], lines["box-b"], lines["dead"]
    assert " ok " in a and "connected" in a and FINISHED in a and "finished" in a, a
    assert "step 40" in a
    assert " critical " in b and CRASHED in b and "crashed" in b and "step 15" in b, b
    assert "! critical: run crashed in drafter-0" in b
    assert " unreachable " in dead and "Connect call failed" in dead and "run " not in dead
    assert "Traceback" not in r.stderr
    # Concurrent: the closed port's 3 s is spent while the agents start, not after them.
    assert seconds < 12, seconds


def test_once_json_has_each_targets_fields(three):
    r, _ = fleet_cli(three, "--headless", "--once", "--json")
    assert r.returncode == 3, r.stdout + r.stderr
    rows = {row["name"]: row for row in map(json.loads, r.stdout.splitlines())}
    assert {n: rows[n]["status"] for n in rows} == {"box-a": 0, "box-b": 2, "dead": 3}
    assert rows["box-a"]["run_id"] == FINISHED and rows["box-a"]["step"] == 40
    assert rows["box-b"]["worst"]["code"] == "crashed"
    assert "InjectedFault" in rows["box-b"]["worst"]["evidence"]
    assert rows["dead"]["connection"].startswith("unreachable: ")
    assert rows["dead"]["run_id"] is None and rows["dead"]["status_word"] == "unreachable"


def test_the_worst_reachable_target_sets_the_status(tmp_path):
    home = write_config(
        tmp_path / "config",
        {"box-a": run_root(tmp_path / "a", FINISHED), "box-b": run_root(tmp_path / "b", CRASHED)},
    )
    r, _ = fleet_cli(home, "--once")
    assert r.returncode == 2, r.stdout + r.stderr
    assert len(r.stdout.splitlines()) == 2, r.stdout
    home = write_config(tmp_path / "config-ok", {"box-a": run_root(tmp_path / "a2", FINISHED)})
    r, _ = fleet_cli(home, "--once")
    assert r.returncode == 0 and "box-a" in r.stdout, r.stdout + r.stderr


def test_an_ssh_target_is_a_row_like_the_others(sshd, tmp_path):
    """A target over a real sshd on 127.0.0.1 beside a local one: one asyncssh connection,
    the same row. The same sshd under a known_hosts that holds another key is refused, and
    said so (not retried, not waited for)."""
    remote = tmp_path / "over-ssh"
    ssh = {
        "target": f"ssh://{sshd.user}@127.0.0.1:{sshd.port}",
        "identity": str(sshd.client_key),
        "known_hosts": str(sshd.known_hosts),
        "python": sys.executable,
        **{k: v for k, v in run_root(remote, CRASHED).items() if k != "target"},
    }
    impostor = {**ssh, "known_hosts": str(sshd.wrong_known_hosts)}  # another host's key
    home = write_config(
        tmp_path / "config",
        {"box-a": run_root(tmp_path / "a", FINISHED), "gpu-box": ssh, "impostor": impostor},
    )
    r, seconds = fleet_cli(home, "--once")
    assert r.returncode == 3, r.stdout + r.stderr
    lines = {line.split()[0]: line for line in r.stdout.splitlines()}
    assert " unreachable " in lines["impostor"], r.stdout
    assert "refused: host key of" in lines["impostor"] and "not accepted" in lines["impostor"]
    assert " critical " in lines["gpu-box"] and "connected" in lines["gpu-box"], r.stdout
    assert CRASHED in lines["gpu-box"] and "run crashed in drafter-0" in lines["gpu-box"]
    assert " ok " in lines["box-a"] and FINISHED in lines["box-a"]
    assert seconds < 12, seconds


def test_a_cause_quoting_hostile_text_reaches_the_terminal_made_visible(tmp_path, monkeypatch):
    """The link's cause quotes what the config and the host said (here the interpreter that
    could not start, named with an escape sequence and a bidi override): visible, not obeyed,
    in the lines and in the fleet screen's cells; exact in --json."""
    hostile = str(tmp_path / "no-python\x1b[2J\u202e")
    home = write_config(tmp_path / "config", {"odd": {"target": "local", "python": hostile}})
    r, _ = fleet_cli(home, "--once")
    assert r.returncode == 3, r.stdout + r.stderr
    assert "\x1b" not in r.stdout and "\u202e" not in r.stdout, r.stdout
    assert "no-python\\x1b[2J\\u202e" in r.stdout and "unreachable: could not start" in r.stdout
    r, _ = fleet_cli(home, "--once", "--json")
    assert json.loads(r.stdout)["connection"].count(hostile) == 1

    monkeypatch.setenv("XDG_CONFIG_HOME", str(home))

    async def go() -> None:
        app = FleetApp(Fleet(configured_targets()), theme_name="dark")
        async with app.run_test(size=(180, 40)) as pilot:
            await until(pilot, lambda: "no-python" in table_rows(app)["odd"][2], what="cause")
            cell = table_rows(app)["odd"][2]
            assert "\x1b" not in cell and "\u202e" not in cell and "\\x1b" in cell, cell

    asyncio.run(go())


def test_without_once_a_block_of_lines_comes_each_interval_until_ctrl_c(tmp_path):
    home = write_config(tmp_path / "config", {"box-a": run_root(tmp_path / "a", FINISHED)})
    env = {"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin", "XDG_CONFIG_HOME": str(home)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "dflash_tui", "fleet", "--headless", "--interval", "0.5"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT, env=env,
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        seen: list[str] = []
        deadline = time.monotonic() + 30
        while sum(FINISHED in line for line in seen) < 2 and time.monotonic() < deadline:
            seen.append(proc.stdout.readline())
        assert sum(FINISHED in line for line in seen) >= 2, seen
        clocks = [line for line in seen if len(line.strip()) == 8 and line.count(":") == 2]
        assert len(clocks) >= 2, seen  # each block under its time
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=15) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@pytest.mark.parametrize(
    ("config", "needle"),
    [
        (None, "fleet: no targets in"),
        ("[other]\nx = 1\n", "fleet: no targets in"),
        ('[targets.x]\ntarget = "local"\ncolour = "red"\n', "targets.x: unknown keys ['colour']"),
        ("[targets\n", "config.toml:"),
    ],
)
def test_no_or_bad_targets_is_one_clear_line_and_exit_2(tmp_path, config, needle):
    home = tmp_path / "config"
    if config is not None:
        (home / "dflash-tui").mkdir(parents=True)
        (home / "dflash-tui" / "config.toml").write_text(config)
    for args in (["--headless", "--once"], []):
        r, _ = fleet_cli(home, *args)
        assert r.returncode == 2, r.stdout + r.stderr
        assert needle in r.stderr and len(r.stderr.splitlines()) == 1, r.stderr
        assert "Traceback" not in r.stderr


# -- the TUI under Pilot ------------------------------------------------------------------
def plain(widget) -> str:
    console = Console(width=178, record=True, file=io.StringIO(), color_system=None)
    console.print(widget.content)
    return console.export_text()


def table_rows(app: FleetApp) -> dict[str, list[str]]:
    from textual.widgets import DataTable

    table = app.fleet_screen.query_one(DataTable)
    return {str(k.value): [c.plain for c in table.get_row(k)] for k in table.rows}


async def until(pilot, ok, timeout: float = 30.0, what: str = "") -> None:
    deadline = time.monotonic() + timeout
    while not ok():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await pilot.pause(0.1)


def test_the_fleet_screen_opens_each_targets_dashboard_and_comes_back(three, monkeypatch):
    monkeypatch.setenv("XDG_CONFIG_HOME", str(three))
    monkeypatch.setenv("XDG_STATE_HOME", str(three.parent / "state"))  # the theme memory

    async def go() -> None:
        app = FleetApp(Fleet(configured_targets()), theme_name="dark")
        async with app.run_test(size=(180, 40)) as pilot:
            assert isinstance(app.screen, FleetScreen)

            def settled() -> bool:
                rows = table_rows(app)
                return (
                    len(rows) == 3
                    and "finished" in rows["box-a"]
                    and "crashed" in rows["box-b"]
                    and rows["dead"][2].startswith("unreachable")
                )

            await until(pilot, settled, what="three settled rows")
            rows = table_rows(app)
            assert list(rows) == ["box-a", "box-b", "dead"]  # the config's order
            assert rows["box-a"][:4] == ["box-a", "ok", "connected", FINISHED]
            assert rows["box-a"][5] == "40"
            assert rows["box-b"][:4] == ["box-b", "critical", "connected", CRASHED]
            assert rows["box-b"][7].startswith("critical: run crashed in drafter-0")
            assert rows["dead"][1] == "unreachable" and rows["dead"][3] == "—"
            assert rows["box-b"][8].endswith(" ago")

            # The dashboard's control keys mean nothing here: K opens no kill dialog.
            await pilot.press("K")
            await pilot.pause(0.2)
            assert app.screen is app.fleet_screen

            await pilot.press("down", "enter")  # box-b
            await until(pilot, lambda: app.screen is not app.fleet_screen, what="dashboard")
            await until(pilot, lambda: CRASHED in plain(app.query_one(StatusBar)), what="run")
            status = plain(app.query_one(StatusBar))
            assert "box-b" in status and "crashed" in status and "connected" in status
            await until(
                pilot, lambda: "step 15" in plain(app.query_one(HeartbeatPane)), what="hb pane"
            )
            assert app.link is app.fleet.member("box-b").link  # the fleet's own connection

            await pilot.press("escape")
            await until(pilot, lambda: app.screen is app.fleet_screen, what="the fleet again")
            await pilot.press("up", "enter")  # box-a
            await until(pilot, lambda: FINISHED in plain(app.query_one(StatusBar)), what="a")
            assert "box-a" in plain(app.query_one(StatusBar))
            await pilot.press("q")  # back to the fleet, not out of the app
            await until(pilot, lambda: app.screen is app.fleet_screen, what="q: the fleet")
            assert app.is_running
            await pilot.press("q")
            await until(pilot, lambda: not app.is_running, what="q on the fleet: quit")

    asyncio.run(go())

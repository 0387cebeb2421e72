"""After the demo, plain `status` and `runs` find the demo's runs (issue 32): where nothing
names a target and the default root has no runs, they read the demo's root and say so in one
line; a named root, or runs in the default one, are read as before. A real CLI, a real
local agent, a recorded run dir copied in."""

from __future__ import annotations

import shutil
from pathlib import Path

from monitor_helpers import cli

RUNDIRS = Path(__file__).resolve().parents[1] / "fixtures/rundirs"
RUN = RUNDIRS / "main-c119aa7/20261201-031405-tiny-cpu-6e92"


def home(tmp_path: Path) -> dict[str, str]:
    """A user with no config and no ~/dflash: only the demo's state folder."""
    return {
        "HOME": str(tmp_path / "home"),
        "XDG_STATE_HOME": str(tmp_path / "state"),
        "XDG_CONFIG_HOME": str(tmp_path / "config"),
    }


def test_runs_and_status_read_the_demos_root_and_say_so_once(tmp_path: Path) -> None:
    env = home(tmp_path)
    demo_root = tmp_path / "state/dflash-tui/demo/runs"
    shutil.copytree(RUN, demo_root / RUN.name)

    r = cli("runs", env=env)
    assert r.returncode == 0, r.stderr
    assert RUN.name in r.stdout
    said = [line for line in r.stderr.splitlines() if "demo" in line]
    assert said == [
        f"dflash-tui: no runs under ~/dflash/runs: the demo's runs (--run-root {demo_root})"
    ]
    s = cli("status", env=env)
    assert RUN.name not in s.stderr and said[0] in s.stderr.splitlines()
    assert "no run under" not in s.stdout, s.stdout
    assert "finished" in s.stdout.splitlines()[0] or "stopped" in s.stdout.splitlines()[0]

    # The root the line names reads the same runs, and says nothing more.
    named = cli("runs", "--run-root", str(demo_root), env=env)
    assert named.stdout == r.stdout and "demo" not in named.stderr


def test_a_named_root_or_runs_in_the_default_root_are_read_as_before(tmp_path: Path) -> None:
    env = home(tmp_path)
    shutil.copytree(RUN, tmp_path / "state/dflash-tui/demo/runs" / RUN.name)
    empty = tmp_path / "empty"
    r = cli("runs", "local", "--run-root", str(empty), env=env)
    assert r.returncode == 0 and RUN.name not in r.stdout and "demo" not in r.stderr

    mine = tmp_path / "home/dflash/runs/20261202-000000-mine-0001"
    mine.mkdir(parents=True)
    (mine / "launch.json").write_text((RUN / "launch.json").read_text())
    r = cli("runs", env=env)
    assert r.returncode == 0 and "demo" not in r.stderr
    assert RUN.name not in r.stdout and mine.name in r.stdout


def test_demo_help_names_the_remote_dir_it_uses(tmp_path: Path) -> None:
    r = cli("demo", "--help", env={**home(tmp_path), "COLUMNS": "200"})
    assert f"(default: {tmp_path / 'state/dflash-tui/demo'})" in r.stdout
    assert "~/dflash" not in r.stdout

"""Every --set mistake, through every way in (issue 32): the trainer, `launch`, `demo` and
`restart` (which reuses the launch's overrides) each say one line per bad key,
`config: KEY = VALUE: rule`, and exit 2, with no traceback. Real processes: the CLI, the
local agent and the trainer it starts."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from monitor_helpers import NO_WANDB, TINY, cli
from test_control_local import deploy

from dflash_tui.link.link import BadInput
from trainer.contract.protocol import Launch

ROOT = Path(__file__).resolve().parents[2]
BAD = ["nonsense", "train.lr=abc", "trian.lr=1", "train.epochs=2"]  # the last one is good
SAID = [
    'config: --set "nonsense": expected section.key=value',
    'config: train.lr = "abc": expected a number',
    "config: trian.lr = 1: trian is no section (did you mean train?)",
]


def sets(overrides: list[str]) -> list[str]:
    return [arg for o in overrides for arg in ("--set", o)]


def said(stderr: str, prefix: str) -> list[str]:
    assert "Traceback" not in stderr, stderr
    return [line.removeprefix(prefix) for line in stderr.splitlines() if "config: " in line]


def test_the_trainer_says_each_bad_key_on_its_own_line(tmp_path: Path) -> None:
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "trainer",
            "--config",
            str(TINY),
            "--run-root",
            str(tmp_path),
            *sets(BAD),
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
    )
    assert r.returncode == 2
    assert said(r.stderr, "error: ") == SAID
    assert not any(tmp_path.iterdir())  # refused before a run dir was made


@pytest.mark.parametrize("command", ["launch", "demo"])
def test_launch_and_demo_refuse_before_anything_is_sent(command: str, tmp_path: Path) -> None:
    remote = tmp_path / "remote"
    where = ["--remote-dir", str(remote)]
    args = (
        ["launch", "local", *where, "--config", str(TINY)]
        if command == "launch"
        else ["demo", "--headless", *where]
    )
    r = cli(*args, *sets(BAD), "--set", "name=a\nb", env={"XDG_STATE_HOME": str(tmp_path)})
    assert r.returncode == 2
    assert said(r.stderr, "dflash-tui: ") == [
        "config: --set 'name=a\\nb': one line, no newline in it",
        *SAID,
    ]
    assert not remote.exists()  # nothing deployed, nothing launched


def test_restart_of_a_run_with_bad_overrides_says_them_and_exits_2(
    remote_factory, local_target
) -> None:
    r = remote_factory(local_target)
    deploy(r)
    # As an older monitor (or a hand-edited launch) could have sent it: the agent launches
    # it, the trainer refuses it at start, and the agent says the trainer's lines.
    launch = Launch(config_toml=TINY.read_text(), overrides=[NO_WANDB, *BAD[1:]], name="tiny")
    with pytest.raises(BadInput) as failed:
        r.request(launch, timeout=120)
    lines = str(failed.value).splitlines()
    run_id = lines[0].split(":")[0].removeprefix("run ")
    assert [ln.removeprefix(f"run {run_id}: ") for ln in lines] == SAID[1:]

    # A plain restart reuses them: refused on the host before anything is launched, a line
    # per bad override (train.log's closing error lines), each with the --drop to use.
    where = ["local", "--remote-dir", local_target.remote_dir]
    again = cli("restart", *where, "--run", run_id)
    assert again.returncode == 2, again.stderr
    lines = said(again.stderr, "dflash-tui: ")
    assert len(lines) == 2, again.stderr
    for line, bad, rule in zip(lines, BAD[1:3], SAID[1:], strict=True):
        key = bad.split("=")[0]
        assert line == (
            f"restart: {run_id} died before its first step of --set {bad} ({rule}); "
            f"as it was it dies again: restart --drop {key} (or --set {key}=VALUE)"
        ), line

"""`dflash-tui export` as an operator runs it: deploy, a real tiny run through the agent,
then the export written on the host from the deployed trainer, never over an earlier one."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pytest
from monitor_helpers import NO_WANDB, TINY, Remote
from test_monitor_cli import cli

from dflash_tui.link.link import LinkError
from dflash_tui.targets import Target
from trainer.contract.protocol import Launch


def test_export_writes_the_runs_drafter_on_the_host_and_never_overwrites(tmp_path):
    remote = tmp_path / "remote"
    where = ["local", "--remote-dir", str(remote)]
    assert cli("deploy", *where).returncode == 0
    r = cli("launch", *where, "--config", str(TINY), "--set", NO_WANDB, "--set",
            "train.max_steps=8", "--set", "train.checkpoint_every=4")  # fmt: skip
    assert r.returncode == 0, r.stderr
    run_dir = Path(r.stdout.split(" in ")[1].split()[0])
    deadline = time.monotonic() + 120
    while not (run_dir / "exit.json").exists():
        assert time.monotonic() < deadline, (run_dir / "train.log").read_text()
        time.sleep(0.5)

    e = cli("export", *where)
    assert e.returncode == 0, e.stderr
    out = remote / "exports" / f"{run_dir.name}-step-8-bfloat16"
    assert e.stdout.splitlines() == [
        e.stdout.splitlines()[0],
        f"on the host: {out}",
    ]
    assert e.stdout.startswith("exported step 8 (25 tensors")
    config = json.loads((out / "config.json").read_text())
    assert config["architectures"] == ["DFlashDraftModel"] and config["dtype"] == "bfloat16"
    assert (out / "model.safetensors").stat().st_size > 0

    earlier = cli("export", *where, "--run", run_dir.name, "--step", "4", "--dtype", "float32")
    assert earlier.returncode == 0, earlier.stderr
    assert (remote / "exports" / f"{run_dir.name}-step-4-float32" / "config.json").is_file()

    for args, needle, code in [
        ([], "already exists; an export never overwrites", 1),
        (["--step", "5"], "no checkpoint at step 5 (steps: 4, 8)", 2),
        (["--run", "../../etc"], "bad run id", 2),
        (["--run", "nope"], "no run 'nope'", 2),
    ]:
        bad = cli("export", *where, *args)
        # Refused by the host in one line: exit 2 for what was named (no such step or run),
        # 1 for a refusal of the host's state (an export made before).
        assert bad.returncode == code, (args, bad.stdout, bad.stderr)
        assert needle in bad.stderr and len(bad.stderr.strip().splitlines()) == 1, bad.stderr
        assert "Traceback" not in bad.stderr
    assert sorted(p.name for p in (remote / "exports").iterdir()) == [
        f"{run_dir.name}-step-4-float32",
        f"{run_dir.name}-step-8-bfloat16",
    ]


def test_export_of_a_run_that_never_checkpointed_is_bad_input(tmp_path):
    """A launch whose trainer exits 2 at once (a bad override): a real run dir with no
    checkpoint. The export names it: one line, exit 2. (The CLI's `launch` refuses a bad
    override before launching, so the agent is asked directly, as an older client would.)"""
    remote = tmp_path / "remote"
    where = ["local", "--remote-dir", str(remote)]
    assert cli("deploy", *where).returncode == 0
    r = Remote(Target(name="local", kind="local", remote_dir=str(remote), python=sys.executable))
    try:
        with pytest.raises(LinkError, match=r"train\.lr"):
            r.request(Launch(config_toml=TINY.read_text(), name="tiny-cpu",
                             overrides=[NO_WANDB, "train.lr=abc"]))  # fmt: skip
    finally:
        r.close()
    (run_id,) = [p.name for p in (remote / "runs").iterdir() if p.is_dir()]
    bad = cli("export", *where, "--run", run_id)
    assert bad.returncode == 2, (bad.stdout, bad.stderr)
    (line,) = bad.stderr.strip().splitlines()
    assert line.endswith(f"run {run_id}: no good checkpoint to export (it has none)"), line
    assert not (remote / "exports").exists() or not list((remote / "exports").iterdir())

"""No false alarms: the real CPU demo (trainer/configs/demo-cpu.toml, its own trained target
and data, the eval thread on) deployed and launched through the CLI, then `dflash-tui status
--json` every 5 s for its whole life, loading to finished, as an operator's cron would run
it. No snapshot may carry a warning or a critical finding; info (the 2-core host cannot keep
up with the eval, say) is allowed and listed on failure."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from monitor_helpers import NO_WANDB

ROOT = Path(__file__).resolve().parents[2]
DEMO = ROOT / "trainer" / "configs" / "demo-cpu.toml"


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "dflash_tui", *args], capture_output=True, text=True,
        timeout=120, cwd=ROOT, env=os.environ.copy(),
    )  # fmt: skip


@pytest.mark.serial  # the demo as an operator runs it: alone on its host, not beside a test's
@pytest.mark.timeout(900)  # the chat target's first build (~2-4 min on 2 cores) + the run
def test_the_healthy_demo_watched_every_5s_for_its_whole_life_raises_no_warning(
    tmp_path, tiny_chat_ready
):
    where = ["local", "--remote-dir", str(tmp_path / "remote")]
    assert cli("deploy", *where).returncode == 0
    r = cli("launch", *where, "--config", str(DEMO), "--set", NO_WANDB)
    assert r.returncode == 0, r.stderr
    run_id = r.stdout.split()[1]
    phases: list[str] = []
    alarms: list[tuple[str, str, str, str]] = []
    infos: set[str] = set()
    deadline = time.monotonic() + 420
    while True:
        t0 = time.monotonic()
        s = cli("status", *where, "--json")
        snap = json.loads(s.stdout.splitlines()[0])
        state = snap["state"]
        assert state["run_id"] == run_id
        phase = state["phase"] or "?"
        if not phases or phases[-1] != phase:
            phases.append(phase)
        for f in snap["findings"]:
            if f["severity"] == "info":
                infos.add(f["code"])
            else:
                alarms.append((phase, f["severity"], f["code"], f["evidence"]))
        assert s.returncode == (1 if any(f["severity"] == "warning" for f in snap["findings"])
                                else 0) or alarms, s.stdout  # fmt: skip
        if phase in ("finished", "crashed", "stopped"):
            break
        assert time.monotonic() < deadline, f"still {phase} after 7 minutes: {phases}"
        time.sleep(max(0.0, 5.0 - (time.monotonic() - t0)))
    assert phases[-1] == "finished", phases
    assert "training" in phases, phases  # watched through the loop, not only its end
    assert not alarms, f"false alarms on a healthy run (info seen: {sorted(infos)}): {alarms}"

"""A straggler in a real processes-mode job, on the operator's path: `dflash-tui launch` of
the tiny CPU job of 4 ranks with one drafter rank slowed for real
(DFLASH_FAULT=slow:drafter:S:rank=3, which only torchrun's rank 3 takes), then
`dflash-tui status` names that rank as the straggler, with its host and device, and
`--json` carries the finding and the rank's loop times."""

from __future__ import annotations

import json
import socket
import time

from monitor_helpers import NO_WANDB, TINY, cli
from test_processes_launch import job_pids

SLOWED = 3  # drafter 1: the fault's rank


def test_status_names_the_slowed_rank_as_the_straggler(tmp_path):
    remote = tmp_path / "remote"
    where = ["local", "--remote-dir", str(remote)]
    assert cli("deploy", *where).returncode == 0
    r = cli(
        "launch",
        *where,
        "--config",
        str(TINY),
        "--set",
        "runtime.mode=processes",
        "--set",
        NO_WANDB,
        "--set",
        "train.max_steps=100000",
        env={"DFLASH_FAULT": f"slow:drafter:0.4:rank={SLOWED}"},
    )
    assert r.returncode == 0, r.stderr
    run_dir = remote / "runs" / r.stdout.split()[1]
    try:
        deadline = time.monotonic() + 150
        while True:
            st = cli("status", *where, "--json")
            state = json.loads(st.stdout)
            codes = [f["code"] for f in state.get("findings", [])]
            if "rank_straggler" in codes:
                break
            assert time.monotonic() < deadline, st.stdout[-3000:]
            time.sleep(2)
        (f,) = [f for f in state["findings"] if f["code"] == "rank_straggler"]
        host = socket.gethostname()
        assert f["title"] == f"rank {SLOWED} (drafter 1) is a straggler on {host}, cpu", f
        ranks = {x["rank"]: x["heartbeat"] for x in state["state"]["ranks"]}
        slowed = ranks[SLOWED]
        assert slowed["loop"] == "drafter-1" and slowed["stages_ms"]["forward"] >= 400, slowed
        peer = ranks[2]["stages_ms"]["forward"]
        assert peer < 400, ranks[2]  # only rank 3 took the fault
        # The text view says it too, and the rank's own line its loop's split.
        text = cli("status", *where).stdout
        assert f"rank {SLOWED} (drafter 1) is a straggler on {host}, cpu" in text, text
        line = next(ln for ln in text.splitlines() if ln.startswith(f"rank {SLOWED} (drafter 1)"))
        assert " ms compute + " in line and " ms comm per step" in line, line
    finally:
        cli("kill", *where, "--timeout", "30")
    assert job_pids(run_dir) == []

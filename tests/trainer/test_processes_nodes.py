"""processes mode over two hosts, on loopback: two `python -m trainer` launchers, each with
its own run root (no shared filesystem), DFLASH_NODES=2 and its node rank, meeting at node
0's rendezvous. Each node runs 1 target + 1 drafter rank (the lists are per node), 4 ranks in
all: the job trains the threads-mode trajectory of 2 targets + 2 replicas, each host's run
dir has the job's run id and its own ranks' heartbeats, only node 0 keeps checkpoints, and
a resume given to node 0 alone continues on every rank (the writer sends it)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from test_processes import QUIET, REL_TOLERANCE, ROOT, TINY, metrics, the_run_dir, threads_run

from trainer.contract.heartbeat import Heartbeat, read_heartbeat
from trainer.contract.ranks import RankHeartbeat, read_rank_heartbeat

PER_NODE = ("--set", 'runtime.targets=["cpu"]', "--set", 'runtime.drafters=["cpu"]')


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def node(root: Path, rank: int, port: int, run_id: str, *args: str) -> subprocess.Popen[bytes]:
    """One host's launcher as `dflash-tui launch GROUP` starts it: `python -m trainer` with
    the node variables and `--run-dir <its run root>/<the job's run id>`."""
    root.mkdir(parents=True, exist_ok=True)
    out = open(root / "node.out", "wb")  # noqa: SIM115
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "DFLASH_NODES": "2",
        "DFLASH_NODE_RANK": str(rank),
        "DFLASH_MASTER": f"127.0.0.1:{port}",
    }
    cmd = [sys.executable, "-m", "trainer", "--config", str(TINY)]
    cmd += ["--run-dir", str(root / "runs" / run_id), "--set", "runtime.mode=processes"]
    cmd += [*PER_NODE, *QUIET, *args]
    return subprocess.Popen(
        cmd, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
    )


def two_nodes(tmp: Path, run_id: str, *args: str, resume: Path | None = None) -> None:
    port = free_port()
    extra = ("--resume", str(resume)) if resume is not None else ()
    jobs = [
        node(tmp / "host-a", 0, port, run_id, *args, *extra),
        node(tmp / "host-b", 1, port, run_id, *args),
    ]
    try:
        for host, job in zip(("host-a", "host-b"), jobs, strict=True):
            code = job.wait(timeout=300)
            assert code == 0, (host, (tmp / host / "node.out").read_text()[-4000:])
    finally:
        for job in jobs:
            if job.poll() is None:
                os.killpg(job.pid, 9)
                job.wait()


def test_a_job_over_two_hosts_trains_the_threads_trajectory_and_resumes_from_node_0(
    tmp_path, tiny_target_dir
):
    ref = threads_run(tmp_path / "threads", "--max-steps", "8")
    try:
        two_nodes(tmp_path / "first", "job-1", "--max-steps", "4")
        a, b = tmp_path / "first" / "host-a" / "runs" / "job-1", tmp_path / "first" / "host-b"
        b = b / "runs" / "job-1"
        # Each host's run dir: the job's run id, config.json naming the node, its own
        # ranks' heartbeats; node 0's holds the job's files and the only checkpoint.
        assert json.loads((a / "config.json").read_text())["run"]["run_id"] == "job-1"
        b_config = json.loads((b / "config.json").read_text())["run"]
        assert b_config["node"] == 1 and b_config["run_id"] == "job-1"
        assert b_config["ranks"]["world_size"] == 4
        assert sorted(p.name for p in a.glob("heartbeat-rank*")) == [
            "heartbeat-rank0.json",
            "heartbeat-rank1.json",
        ]
        assert sorted(p.name for p in b.glob("heartbeat-rank*")) == [
            "heartbeat-rank2.json",
            "heartbeat-rank3.json",
        ]
        lead = read_rank_heartbeat(b, 3)
        assert isinstance(lead, RankHeartbeat)
        assert (lead.role, lead.index, lead.writer, lead.run_id) == ("drafter", 1, True, "job-1")
        assert lead.phase == "finished" and lead.step == 4
        node_beat = read_heartbeat(b / "heartbeat.json")
        assert isinstance(node_beat, Heartbeat) and node_beat.phase == "finished"
        assert (a / "checkpoints" / "step-00000004.pt").is_file()
        assert not (b / "checkpoints").exists() or not list((b / "checkpoints").iterdir())

        # Resumed: --resume on node 0 only; node 1 is sent the position and state.
        two_nodes(tmp_path / "second", "job-2", "--max-steps", "8", resume=a)
        a2 = tmp_path / "second" / "host-a" / "runs" / "job-2"
        b2 = tmp_path / "second" / "host-b" / "runs" / "job-2"
        assert "resumed from" in (a2 / "train.log").read_text()
        assert "resumed from the writer rank's checkpoint at step 4" in (
            (b2 / "train.log").read_text()
        )
        assert ref.wait(timeout=300) == 0, (tmp_path / "threads" / "trainer.out").read_text()
    finally:
        ref.kill()
    expected = {m["step"]: m for m in metrics(the_run_dir(tmp_path / "threads"))}
    got = metrics(a) + metrics(a2)
    assert [m["step"] for m in got] == list(range(1, 9))
    for m in got:
        assert m["loss"] == pytest.approx(expected[m["step"]]["loss"], rel=REL_TOLERANCE)
        assert m["tokens"] == expected[m["step"]]["tokens"]
    # Node 1's drafter logs the same (all-reduced) numbers into its host's run dir.
    assert [m["loss"] for m in metrics(b2)] == [m["loss"] for m in metrics(a2)]


NODE_ROUTED = (
    *("--set", 'runtime.targets=["cpu","cpu"]', "--set", 'runtime.drafters=["cpu"]'),
    *("--set", "runtime.routing=node", "--max-steps", "4"),
)


def test_node_routing_over_two_hosts_sends_no_batch_across_and_status_shows_every_rank(
    tmp_path, tiny_target_dir
):
    """2 targets + 1 replica a host: "fixed" routing would send half the batches across
    (target 1 of host a feeds replica 1 of host b); "node" sends none, and the replicas
    train the same batches in the same order, so the losses are threads mode's. Host a's
    `status` shows host b's ranks too, relayed by the writer (trainer/distributed/rank_relay.py)."""
    ref = threads_run(
        tmp_path / "threads",
        *("--set", 'runtime.targets=["cpu","cpu","cpu","cpu"]'),
        *("--set", 'runtime.drafters=["cpu","cpu"]', "--max-steps", "4"),
    )
    try:
        two_nodes(tmp_path / "job", "job-1", *NODE_ROUTED)
        assert ref.wait(timeout=300) == 0, (tmp_path / "threads" / "trainer.out").read_text()
    finally:
        ref.kill()
    a = tmp_path / "job" / "host-a" / "runs" / "job-1"
    b = tmp_path / "job" / "host-b" / "runs" / "job-1"
    # Each target rank's own train.log says what it forwarded and how much left its node:
    # 8 batches over 4 targets, none across.
    said = {}
    for host, ranks in ((a, (0, 1)), (b, (3, 4))):
        for rank in ranks:
            log = (host / "ranks" / f"rank-{rank}" / "train.log").read_text()
            line = next(ln for ln in log.splitlines() if "batches, " in ln)
            said[rank] = line.split("] ", 1)[-1] if "] " in line else line
    for rank, line in said.items():
        assert "forwarded 2 batches, 0 to another node's drafters" in line, (rank, line)
        assert "runtime.routing = node" in line
    expected = [m["loss"] for m in metrics(the_run_dir(tmp_path / "threads"))]
    got = [m["loss"] for m in metrics(a)]
    assert len(got) == 4
    assert got == pytest.approx(expected, rel=REL_TOLERANCE)
    assert [m["loss"] for m in metrics(b)] == got
    # `status` on host a names all six ranks: host b's through the writer's heartbeat.
    status = [sys.executable, "-m", "dflash_tui", "status", "local", "--run-root", str(a.parent)]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    said = subprocess.run(status, env=env, capture_output=True, text=True, timeout=120)
    for rank, role in enumerate(["target 0", "target 1", "drafter 0"]):
        assert f"rank {rank} ({role}) pid " in said.stdout, said.stdout
    for rank, role in zip((3, 4, 5), ("target 2", "target 3", "drafter 1"), strict=True):
        line = next(ln for ln in said.stdout.splitlines() if ln.startswith(f"rank {rank} "))
        assert line.startswith(f"rank {rank} ({role}) pid "), said.stdout
        assert ": finished, step " in line and line.endswith(", relayed by the writer"), line
    as_json = subprocess.run([*status, "--json"], env=env, capture_output=True, text=True)
    ranks = json.loads(as_json.stdout)["state"]["ranks"]
    assert [(x["rank"], x["relayed"]) for x in ranks] == [(r, r >= 3) for r in range(6)]
    assert all(x["heartbeat"]["phase"] == "finished" for x in ranks), ranks

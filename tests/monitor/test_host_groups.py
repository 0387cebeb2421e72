"""A processes-mode job over two hosts, on the operator's path: a config.toml group of two
targets reached through a real sshd on 127.0.0.1, each with its own remote dir (two agents,
two run roots), node 0's rendezvous on a free loopback port. `launch pair` starts node i on
hosts[i] in run dirs of one id, the job trains, `status pair` shows both hosts and their
ranks, `kill pair` stops every process of it, `restart pair` resumes node 0's checkpoint
with every node under one new id. Real sshd, agents, torchrun and trainer ranks."""

from __future__ import annotations

import json
import re
import sys
import time
from pathlib import Path

from infra.sshd import free_port
from monitor_helpers import NO_WANDB, TINY, cli
from test_processes_launch import job_pids, wait_for_step

HOSTS = ("gpu-a", "gpu-b")
STEP = re.compile(r"\] step=(\d+) ")
# Two ranks per node (one target, one drafter), four in all.
JOB = [
    "--set", "runtime.mode=processes", "--set", NO_WANDB,
    "--set", 'runtime.targets=["cpu"]', "--set", 'runtime.drafters=["cpu"]',
    "--set", "train.max_steps=100000",
]  # fmt: skip


def write_config(tmp_path: Path, sshd, master: str) -> tuple[dict[str, str], dict[str, Path]]:
    """XDG_CONFIG_HOME with the two targets and the group; (env for the CLI, run roots)."""
    home, roots, lines = tmp_path / "config", {}, []
    for host in HOSTS:
        remote = tmp_path / host
        roots[host] = remote / "runs"
        lines += [
            f"[targets.{host}]",
            f'target = "ssh://{sshd.user}@127.0.0.1:{sshd.port}"',
            f"identity = {json.dumps(str(sshd.client_key))}",
            f"known_hosts = {json.dumps(str(sshd.known_hosts))}",
            f"python = {json.dumps(sys.executable)}",
            f"remote_dir = {json.dumps(str(remote))}",
            "",
        ]
    lines += ["[groups.pair]", f"hosts = {json.dumps(list(HOSTS))}", f'master = "{master}"']
    (home / "dflash-tui").mkdir(parents=True)
    (home / "dflash-tui" / "config.toml").write_text("\n".join(lines) + "\n")
    return {"XDG_CONFIG_HOME": str(home), "HOME": str(tmp_path)}, roots


def said(stdout: str, host: str, node: int, after: int = 0) -> str:
    """The host's line (`after`: its later ones) without its `pair: HOST node N ` head."""
    head = f"pair: {host} node {node} "
    lines = [ln[len(head) :] for ln in stdout.splitlines() if ln.startswith(head)]
    return lines[after] if len(lines) > after else ""


def test_launch_status_kill_and_restart_a_job_over_two_hosts(sshd, tmp_path):
    env, roots = write_config(tmp_path, sshd, f"127.0.0.1:{free_port()}")
    for host in HOSTS:
        d = cli("deploy", host, env=env)
        assert d.returncode == 0, d.stderr

    r = cli("launch", "pair", "--config", str(TINY), *JOB, env=env, timeout=240)
    assert r.returncode == 0, r.stdout + r.stderr
    ids = [said(r.stdout, h, i).split()[1] for i, h in enumerate(HOSTS)]
    assert said(r.stdout, "gpu-a", 0).startswith("launched ") and ids[0] == ids[1], r.stdout
    run_id = ids[0]
    dirs = [roots[h] / run_id for h in HOSTS]
    restarted: list[Path] = []
    try:
        assert all(d.is_dir() for d in dirs), r.stdout
        for node, d in enumerate(dirs):  # each agent recorded its node's place
            place = json.loads((d / "launch.json").read_text())["node"]
            assert place == {
                "run_id": run_id, "nodes": 2, "node_rank": node, "master": place["master"]
            }  # fmt: skip
        wait_for_step(dirs[0], timeout=180)
        assert "processes mode: 2 ranks under torchrun" in (dirs[0] / "train.log").read_text()
        assert job_pids(dirs[0]) and job_pids(dirs[1])  # a torchrun and its ranks per host

        st = cli("status", "pair", "--json", env=env)
        job = json.loads(st.stdout)
        assert job["group"] == "pair" and job["run_id"] == run_id, st.stdout[:2000]
        assert [(h["host"], h["node"]) for h in job["hosts"]] == [("gpu-a", 0), ("gpu-b", 1)]
        ranks = {
            (h["host"], relayed): sorted(
                x["rank"]
                for x in h["snapshot"]["state"]["ranks"]
                if bool(x.get("relayed")) == relayed
            )
            for h in job["hosts"]
            for relayed in (False, True)
        }
        assert ranks[("gpu-a", False)] == [0, 1] and ranks[("gpu-b", False)] == [2, 3], ranks
        # The writer's host also lists the other host's ranks as they reached it (rank_relay):
        # those that have by now, and no others.
        assert set(ranks[("gpu-a", True)]) <= {2, 3} and ranks[("gpu-b", True)] == [], ranks
        text = cli("status", "pair", env=env).stdout
        assert "=== pair: gpu-a node 0 ===" in text and "=== pair: gpu-b node 1 ===" in text
        node1 = text.split("=== pair: gpu-b node 1 ===")[1]
        assert "rank 2 (target 1) pid " in node1 and "rank 3 (drafter 1) pid " in node1, text

        # Each host's launcher passes SIGUSR1 on to its own ranks: every rank's stacks, host
        # by host, and the job trains on.
        d = cli("dump-stacks", "pair", "--no-pyspy", env=env, timeout=180)
        assert d.returncode == 0, d.stdout[-3000:] + d.stderr
        hosts = d.stdout.split("=== pair: gpu-b node 1 ===")
        assert hosts[0].startswith("=== pair: gpu-a node 0 ===") and len(hosts) == 2, d.stdout
        for part, ranks_here in zip(hosts, ([0, 1], [2, 3]), strict=True):
            heads = [s.split(" pid ")[0] for s in part.split("\n## ")[1:]]
            assert [h.split(" (")[0] for h in heads] == [f"rank {r}" for r in ranks_here], heads
        # Node 1 keeps its own heartbeat (its lead rank's): needs the trainer's per-node
        # run dirs (trainer-side work on main).
        for h in job["hosts"]:
            state = h["snapshot"]["state"]
            assert state["phase"] == "training" and state["step"] > 0, (h["host"], state)

        k = cli("kill", "pair", "--timeout", "60", env=env, timeout=240)
        assert k.returncode == 0, k.stdout + k.stderr
        assert said(k.stdout, "gpu-a", 0).startswith(f"{run_id} stopped at step "), k.stdout
        assert "orphans: none" in said(k.stdout, "gpu-a", 0), k.stdout
        assert said(k.stdout, "gpu-b", 1), k.stdout  # killed, or already ended with node 0
        # Node 1 never holds a checkpoint: its line must not promise a restart from step 0.
        assert "restart starts at step 0" not in said(k.stdout, "gpu-b", 1), k.stdout
        assert job_pids(dirs[0]) == [] and job_pids(dirs[1]) == []
        ended = json.loads((dirs[0] / "exit.json").read_text())
        assert ended["final_phase"] == "stopped", ended
        step = ended["step"]

        rs = cli("restart", "pair", "--timeout", "60", env=env, timeout=300)
        assert rs.returncode == 0, rs.stdout + rs.stderr
        new = said(rs.stdout, "gpu-a", 0).split("restarted as ")[1].split(",")[0]
        assert f"resuming from checkpoints/step-{step:08d}.pt (step {step})" in rs.stdout
        assert f"restarted as {new} with {run_id}'s config" in said(rs.stdout, "gpu-b", 1)
        restarted = [roots[h] / new for h in HOSTS]
        assert all(d.is_dir() for d in restarted)
        launch_b = json.loads((restarted[1] / "launch.json").read_text())
        assert launch_b["resumed_from"] is None and "--resume" not in launch_b["argv"]
        wait_for_step(restarted[0], timeout=180)
        log = (restarted[0] / "train.log").read_text()
        resumed = f"resumed from {dirs[0]}/checkpoints/step-{step:08d}.pt at step {step}"
        assert resumed in log, log[-3000:]
        deadline = time.monotonic() + 120
        while max(map(int, STEP.findall((restarted[0] / "train.log").read_text()))) <= step:
            assert time.monotonic() < deadline, (restarted[0] / "train.log").read_text()[-3000:]
            time.sleep(0.5)
    finally:
        k = cli("kill", "pair", "--timeout", "60", env=env, timeout=240)
    assert all(job_pids(d) == [] for d in [*dirs, *restarted]), k.stdout + k.stderr


def test_a_launch_that_fails_on_one_host_stops_the_nodes_launched(sshd, tmp_path):
    """gpu-b has nothing deployed: its launch is refused; node 0, launched on gpu-a and
    waiting at the rendezvous for a peer that never comes, is stopped, and both are said."""
    env, roots = write_config(tmp_path, sshd, f"127.0.0.1:{free_port()}")
    assert cli("deploy", "gpu-a", env=env).returncode == 0
    r = cli("launch", "pair", "--config", str(TINY), *JOB, env=env, timeout=240)
    assert r.returncode == 1, r.stdout + r.stderr
    assert "Traceback" not in r.stderr
    assert "pair: gpu-b node 1: nothing deployed in " in r.stderr, r.stderr
    run_id = said(r.stdout, "gpu-a", 0).split()[1]
    assert said(r.stdout, "gpu-a", 0).startswith(f"launched {run_id} "), r.stdout
    assert said(r.stdout, "gpu-a", 0, after=1).startswith(f"stopped {run_id}: "), r.stdout
    assert f"pair: launch of {run_id} failed on gpu-b; stopped the nodes launched on gpu-a" in (
        r.stderr
    )
    assert job_pids(roots["gpu-a"] / run_id) == []
    assert not (roots["gpu-b"] / run_id).exists()

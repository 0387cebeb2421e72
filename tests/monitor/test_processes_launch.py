"""Processes mode (issue 17) on the operator's path: `dflash-tui launch` of a config with
`runtime.mode = "processes"` starts a torchrun job (the trainer execs
trainer/distributed/torchrun_job.py, keeping the pid the wrapper recorded), `status` reads the job's
heartbeat, `kill` stops every rank at one step with a checkpoint and says so, and `restart` resumes
it in processes mode."""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path

from monitor_helpers import NO_WANDB, TINY, cli


def job_pids(run_dir: Path) -> list[int]:
    """Processes whose command line names this run dir (torchrun and its ranks)."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes()
        except OSError:  # gone meanwhile
            continue
        if str(run_dir).encode() in cmdline and b"dflash_agent" not in cmdline:
            found.append(int(proc.name))
    return found


def wait_for_step(run_dir: Path, timeout: float = 90) -> None:
    deadline = time.monotonic() + timeout
    while "step=" not in (run_dir / "train.log").read_text():
        assert time.monotonic() < deadline, (run_dir / "train.log").read_text()[-2000:]
        time.sleep(0.3)


def test_launch_status_kill_and_restart_a_processes_mode_job(tmp_path):
    remote = tmp_path / "remote"
    where = ["local", "--remote-dir", str(remote)]
    mode = ["--set", "runtime.mode=processes", "--set", NO_WANDB]
    assert cli("deploy", *where).returncode == 0
    # An eval asked for runs in processes mode too (on target 0's rank): the job's
    # heartbeat says it is set up, as a threads run's does.
    evals = ("--set", "data.held_out=8", "--set", "eval.every=50")
    r = cli(
        "launch", *where, "--config", str(TINY), *mode, *evals, "--set", "train.max_steps=100000"
    )
    assert r.returncode == 0, r.stderr
    run_id = r.stdout.split()[1]
    run_dir = remote / "runs" / run_id
    restarted: Path | None = None
    try:
        wait_for_step(run_dir)
        launch = json.loads((run_dir / "launch.json").read_text())
        log = (run_dir / "train.log").read_text()
        assert "processes mode: 4 ranks under torchrun" in log
        assert sorted(p.name for p in run_dir.glob("heartbeat-rank*.json")) == [
            f"heartbeat-rank{r}.json" for r in range(4)
        ]
        status = json.loads(cli("status", *where, "--json").stdout)
        assert status["state"]["phase"] == "training" and status["state"]["step"] > 0, status
        held_out = status["state"]["eval"]
        assert (held_out["every"], held_out["held_out"], held_out["error"]) == (50, 8, None)
        assert len(job_pids(run_dir)) >= 5  # torchrun and its four ranks
        # The pid the wrapper recorded (the one every signal is proven against) is the job's
        # torchrun: the trainer exec'd it, keeping its pid and start time.
        recorded = Path(f"/proc/{launch['pid']}/cmdline").read_bytes().split(b"\0")
        assert b"trainer.distributed.torchrun_job" in recorded, recorded

        # dump-stacks: the launcher (the proven pid) passes SIGUSR1 on to its ranks
        # (trainer/distributed/signals.py); every rank's stacks come back, headed by the rank, and
        # the job trains on (SIGUSR1's default action used to end torchrun here).
        d = cli("dump-stacks", *where, "--no-pyspy")
        assert d.returncode == 0, d.stderr
        sections = d.stdout.split("\n## ")[1:]
        heads = [s.split(" pid ")[0] for s in sections]
        roles = ["target 0", "target 1", "drafter 0", "drafter 1"]
        assert heads == [f"rank {r} ({role})" for r, role in enumerate(roles)], d.stdout[:3000]
        loops = ["_target", "_target", "_receive", "_receive"]
        for section, loop in zip(sections, loops, strict=True):
            assert 'Thread "' in section and f"in {loop}" in section, section[:3000]
        assert f"# ranks dump of pid {launch['pid']}" in d.stdout
        assert Path(f"/proc/{launch['pid']}").exists() and len(job_pids(run_dir)) >= 5

        # With py-spy (the trainer extra's, on PATH): each rank, proven the launcher's
        # child, attached to by pid (dflash_tui/agent/rank_pyspy.py); the job trains on.
        venv_bin = str(Path(sys.executable).parent)
        with_pyspy = {"PATH": f"{venv_bin}:{os.environ.get('PATH', '')}"}
        d = cli("dump-stacks", *where, env=with_pyspy)
        assert d.returncode == 0, d.stderr
        native = d.stdout.split("# py-spy dump --native\n", 1)[1]
        spied = native.split("\n## ")
        assert len(spied) == 4, native[:3000]
        for r, (section, role) in enumerate(zip(spied, roles, strict=True)):
            assert f"rank {r} ({role}) pid " in section and "py-spy dump --native" in section
            assert "Thread " in section, section[:2000]
        assert Path(f"/proc/{launch['pid']}").exists() and len(job_pids(run_dir)) >= 5

        # The monitor follows every rank: status names each, and a rank that stops
        # heartbeating (SIGSTOP: hung) is named while the job's own heartbeat, written by
        # another rank, still looks fresh.
        st = cli("status", *where)
        for r, role in enumerate(roles):
            assert f"rank {r} ({role}) pid " in st.stdout, st.stdout
        ranks = json.loads(cli("status", *where, "--json").stdout)["state"]["ranks"]
        assert [x["heartbeat"]["role"] for x in ranks] == ["target"] * 2 + ["drafter"] * 2
        hung = ranks[1]["heartbeat"]["pid"]
        os.kill(hung, signal.SIGSTOP)
        try:
            deadline = time.monotonic() + 30
            while True:
                st = cli("status", *where)
                if "rank 1 (target 1) silent" in st.stdout:
                    break
                assert time.monotonic() < deadline, st.stdout
                time.sleep(1)
        finally:
            os.kill(hung, signal.SIGCONT)

        k = cli("kill", *where, "--timeout", "30")
        assert k.returncode == 0, k.stderr
        ended = json.loads((run_dir / "exit.json").read_text())
        assert ended["exit_code"] == 0 and ended["final_phase"] == "stopped", ended
        checkpoint = f"checkpoints/step-{ended['step']:08d}.pt"
        assert (run_dir / checkpoint).is_file()
        assert k.stdout.startswith(
            f"{run_id} stopped at step {ended['step']} (SIGTERM), checkpoint {checkpoint}"
        ), k.stdout
        assert "orphans: none" in k.stdout and job_pids(run_dir) == []

        rs = cli("restart", *where, "--run", run_id, "--timeout", "30")
        assert rs.returncode == 0, rs.stderr
        assert f"resuming from {checkpoint} (step {ended['step']})" in rs.stdout, rs.stdout
        restarted = remote / "runs" / rs.stdout.split("restarted as ")[1].split(",")[0]
        wait_for_step(restarted)
        log = (restarted / "train.log").read_text()
        assert f"at step {ended['step']}" in log and "processes mode: 4 ranks" in log

        # One rank dies (SIGKILL, no word of its own): the job ends within seconds, and
        # exit.json, `runs` and `status` name that rank, not the launcher.
        victim = json.loads((restarted / "heartbeat-rank3.json").read_text())
        os.kill(victim["pid"], signal.SIGKILL)
        deadline = time.monotonic() + 60
        while not (restarted / "exit.json").exists():
            assert time.monotonic() < deadline, (restarted / "train.log").read_text()[-3000:]
            time.sleep(0.3)
        failed = json.loads((restarted / "exit.json").read_text())["failed_rank"]
        assert failed["rank"] == 3 and failed["role"] == "drafter", failed
        runs = cli("runs", *where).stdout
        line = next(ln for ln in runs.splitlines() if restarted.name in ln)
        assert "crashed" in line and "rank 3 (drafter 1)" in line, runs
    finally:
        cli("kill", *where, "--timeout", "30")
    assert job_pids(run_dir) == [] and (restarted is None or job_pids(restarted) == [])

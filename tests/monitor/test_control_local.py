"""Deploy, launch, follow, dump stacks, kill and restart a real trainer through the local link."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from monitor_helpers import NO_WANDB, TINY

from dflash_tui.control import TRAINER_DIR, build_bundle
from dflash_tui.link.link import BadInput, LinkError
from trainer.contract.codehash import code_hash
from trainer.contract.protocol import (
    ClearCompileCache,
    Deploy,
    DumpStacks,
    Kill,
    Launch,
    ListRuns,
    Restart,
)


def deploy(r):
    blob, sha, _ = build_bundle()
    import base64

    return r.request(Deploy(tar_b64=base64.b64encode(blob).decode(), sha256=sha), timeout=120)


def launch(r, *overrides, config=TINY):
    return r.request(
        Launch(
            config_toml=Path(config).read_text(),
            overrides=[NO_WANDB, *overrides],
            name="tiny-cpu",
        ),
        timeout=120,
    )


def test_the_whole_control_loop(remote_factory, local_target):
    r = remote_factory(local_target)
    r.wait(lambda s: s.hello is not None, 30, "hello")
    assert r.store.hello.gpu_backend in ("none", "nvml", "nvidia-smi")

    # deploy: the agent verifies the hash of what arrived
    d = deploy(r)
    assert d["sha256"] == code_hash(TRAINER_DIR)
    remote = Path(local_target.remote_dir)
    assert json.loads((remote / "deployed.json").read_text())["sha256"] == d["sha256"]
    assert (remote / "current" / "trainer" / "__main__.py").is_file()
    assert (remote / "current" / "dflash_agent.py").is_file()

    # launch: a fresh run dir, followed automatically, steps streaming in
    run = launch(r, "train.max_steps=100000")
    assert run["started"] is True
    run_id = run["run_id"]
    r.wait(lambda s: s.run_id == run_id, 30, "following the new run")
    r.wait(lambda s: s.heartbeat and s.heartbeat.phase == "training", 60, "training")
    r.wait(lambda s: len(s.step_lines) >= 2, 60, "two step lines")
    hb = r.store.heartbeat
    assert hb.code_sha256 == d["sha256"]  # running code = deployed code
    r.wait(lambda s: s.alive_run == run_id, 10, "the run listed alive")

    # a second launch is refused by the lock, not by a guess
    with pytest.raises(LinkError, match="is alive"):
        launch(r)

    # dump stacks: SIGUSR1, then the newest stacks file comes back
    dump = r.request(DumpStacks(pyspy=False), timeout=120)
    for name in ("drafter-0", "drafter-1", "target-0", "target-1", "prefetch-0", "heartbeat"):
        assert f'Thread "{name}"' in dump["text"]
    r.wait(lambda s: s.heartbeat.step > hb.step, 30, "training goes on after the dump")

    # kill: SIGTERM to the process group, clean exit, nothing left
    k = r.request(Kill(timeout_s=30, drain_timeout_s=10), timeout=90)
    assert k["signal"] == "SIGTERM" and k["orphans"] == [] and k["pids"]
    # Killed mid-run: stopped (schema 1 said finished), its last checkpoint in the record.
    assert k["exit"]["exit_code"] == 0 and k["exit"]["final_phase"] == "stopped"
    assert k["exit"]["step"] < k["exit"]["total_steps"]
    assert k["exit"]["checkpoint"] == f"checkpoints/step-{k['exit']['step']:08d}.pt"
    run_dir = remote / "runs" / run_id
    assert json.loads((run_dir / "exit.json").read_text())["exit_code"] == 0
    assert "trainer exited: exit code 0" in (run_dir / "launch.log").read_text()
    r.wait(lambda s: s.liveness and s.liveness.alive is False, 15, "liveness: dead")

    # restart: a new run dir with the same config
    rs = r.request(Restart(run_id=run_id, timeout_s=30), timeout=180)
    new_id = rs["launched"]["run_id"]
    assert new_id != run_id and rs["killed"] is None  # it was already stopped
    new_dir = remote / "runs" / new_id
    assert (new_dir / "launch-config.toml").read_text() == (
        run_dir / "launch-config.toml"
    ).read_text()
    assert (
        json.loads((new_dir / "launch.json").read_text())["overrides"]
        == json.loads((run_dir / "launch.json").read_text())["overrides"]
    )
    r.wait(lambda s: s.run_id == new_id and s.step_lines, 90, "the restarted run training")
    k2 = r.request(Kill(timeout_s=30, drain_timeout_s=10), timeout=90)
    assert k2["run_id"] == new_id and k2["orphans"] == []

    # runs: both listed with how they ended
    r.request(ListRuns(), timeout=120)
    runs = {x.run_id: x for x in r.store.runs}
    assert runs[run_id].exit.exit_code == 0 and runs[new_id].alive is False
    assert runs[run_id].best_tok_s > 0

    # clear cache: allowed now that nothing is alive
    c = r.request(ClearCompileCache(), timeout=120)
    assert c["path"].endswith("compile")


def test_a_run_that_dies_at_start_is_reported_at_once(remote_factory, local_target):
    r = remote_factory(local_target)
    deploy(r)
    with pytest.raises(BadInput) as e:  # bad input: the trainer's own line, exit 2
        launch(r, "train.not_a_key=1")
    (run_dir,) = [p for p in (Path(local_target.remote_dir) / "runs").iterdir() if p.is_dir()]
    assert str(e.value).startswith(f"run {run_dir.name}: config: train.not_a_key = 1: unknown")
    exit_info = json.loads((run_dir / "exit.json").read_text())
    assert exit_info["exit_code"] == 2
    assert (run_dir / "launch.log").read_text()


def test_launch_before_deploy_says_what_to_do(remote_factory, local_target):
    r = remote_factory(local_target)
    with pytest.raises(LinkError, match="dflash-tui deploy"):
        launch(r)


def test_a_bad_interpreter_is_a_clear_error(remote_factory, local_target):
    from dataclasses import replace

    r = remote_factory(replace(local_target, python="/nonexistent/python3"))
    with pytest.raises(LinkError, match="/nonexistent/python3"):
        r.call(r.link.wait_connected(5))


def test_without_inotify_the_agent_polls_and_loses_nothing(remote_factory, local_target):
    run_dir = Path(local_target.remote_dir) / "runs" / "20260101-000000-poll-0000"
    run_dir.mkdir(parents=True)
    (run_dir / "config.json").write_text('{"name": "poll"}')
    r = remote_factory(local_target, agent_extra=["--no-inotify"])
    r.wait(lambda s: s.run_id == run_dir.name, 30, "following")
    with open(run_dir / "train.log", "a") as f:
        for i in range(200):
            f.write(f"line {i}\n")
            f.flush()
    r.wait(lambda s: len(r.lines()) == 200, 30, "all lines")
    assert [e["text"] for e in r.lines()] == [f"line {i}" for i in range(200)]
    assert any("polling" in str(e.get("message")) for e in r.events if e.get("type") == "log")

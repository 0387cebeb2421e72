"""The trainer runtime on a real process: phases, unbuffered logs, heartbeat, signals, resume,
and failures in every thread role."""

from __future__ import annotations

import json
import signal
import sys
import time

import pytest

from trainer.contract.heartbeat import Heartbeat, parse_heartbeat
from trainer.contract.phases import PHASES
from trainer.contract.steplines import parse_step_line

LONG = ("--max-steps", "100000", "--set", "train.log_every=1")
PIPELINE_THREADS = {"prefetch-0", "prefetch-1", "target-0", "target-1", "drafter-0", "drafter-1"}


@pytest.mark.serial  # a time bound: not beside another test's trainer
def test_phases_advance_and_the_heartbeat_stays_fresh(start_trainer):
    p = start_trainer(*LONG)
    seen: list[str] = []
    ages = []
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        hb = p.heartbeat()
        if hb:
            assert isinstance(parse_heartbeat(hb), Heartbeat), parse_heartbeat(hb)
            if not seen or seen[-1] != hb["phase"]:
                seen.append(hb["phase"])
            ages.append(time.time() - hb["now"])
            if hb["phase"] == "training" and hb["step"] >= 5:
                break
        time.sleep(0.05)
    hb = p.heartbeat()
    assert hb["phase"] == "training", seen
    history = [h["phase"] for h in hb["phase_history"]]
    # A CPU run compiles nothing: `compiling` is a blink, and the target's weights, still
    # loading on their thread, are then waited for (loading_target again) unless already in.
    assert history[:4] == ["starting", "loading_data", "loading_target", "compiling"]
    assert history[4:] in (["warmup", "training"], ["loading_target", "warmup", "training"])
    # Observed phases appear in the order of the history (fast ones may be skipped): `seen`
    # is a subsequence of it.
    rest = iter(history)
    assert all(ph in rest for ph in seen), (seen, history)
    assert max(ages) < 2.5  # replaced at least every 2 s
    assert hb["pid"] == p.proc.pid and hb["pgid"] > 0
    assert hb["compile"]["recompiles"] == 0 and hb["compile"]["warmup_s"] is not None
    assert all(hb["compile"][k] >= 0 for k in ("cache_hits", "cache_misses", "cache_bypasses"))
    assert len(hb["code_sha256"]) == 64
    assert {t["name"] for t in hb["threads"]} >= PIPELINE_THREADS | {"heartbeat", "MainThread"}
    roles = {t["name"]: t["role"] for t in hb["threads"]}
    assert roles["target-1"] == "target" and roles["drafter-0"] == "drafter"
    assert [q["capacity"] for q in hb["queues"]["q_pre"]] == [8, 8]
    assert [q["capacity"] for q in hb["queues"]["q_hs"]] == [8, 8]
    assert hb["gil"]["samples"] > 0 and hb["gil"]["p99_ms"] >= hb["gil"]["p50_ms"] >= 0
    assert hb["tok_s"] > 0
    assert sum(t["cpu_pct"] for t in hb["threads"]) > 0
    p.signal(signal.SIGTERM)
    assert p.wait() == 0


def test_step_lines_reach_the_log_while_the_process_runs(start_trainer):
    # stdout is a file here, as under `nohup … > file`: the buffering trap.
    p = start_trainer(*LONG)
    p.wait_for(lambda: "step=3 " in p.read("train.log"), 60, "a step line")
    assert p.proc.poll() is None
    p.wait_for(lambda: "step=3 " in p.stdout_path.read_text(), 10, "a step line on stdout")
    assert p.proc.poll() is None
    lines = [ln for ln in (p.run_dir / "train.log").read_text().splitlines() if "step=" in ln]
    parsed = parse_step_line(lines[0])
    assert parsed is not None and len(parsed.q_pre) == 2 and len(parsed.q_hs) == 2
    p.signal(signal.SIGTERM)
    assert p.wait() == 0


def test_metrics_and_heartbeat_agree(start_trainer):
    p = start_trainer("--max-steps", "12", "--set", "train.log_every=3")
    assert p.wait() == 0
    hb = p.heartbeat()
    metrics = p.metrics()
    assert [m["step"] for m in metrics] == [3, 6, 9, 12]
    last = metrics[-1]
    assert hb["phase"] == "finished" and hb["exit_code"] == 0
    assert hb["step"] == last["step"] == 12
    assert hb["tokens"] == last["tokens"]
    assert hb["epoch"] == pytest.approx(last["epoch"])
    assert set(last["memory"]) == set(hb["memory"]) == {"cpu"}
    lines = [ln for ln in (p.run_dir / "train.log").read_text().splitlines() if "step=" in ln]
    for m, line in zip(metrics, lines, strict=True):
        fields = parse_step_line(line)
        assert fields is not None and fields.step == m["step"]
        assert fields.loss == pytest.approx(m["loss"], abs=5e-5)
        assert fields.q_pre == m["q_pre"] and fields.q_hs == m["q_hs"]


@pytest.mark.serial  # a time bound: not beside another test's trainer
def test_sigusr1_dumps_every_thread_without_disturbing_training(start_trainer):
    p = start_trainer(*LONG)
    hb = p.wait_step(3)
    p.signal(signal.SIGUSR1)
    t0 = time.monotonic()
    dump = p.wait_for(lambda: list(p.run_dir.glob("stacks-2*.txt")), 5, "a stack dump")[0]
    p.wait_for(lambda: "# faulthandler" in dump.read_text(), 5, "the dump to complete")
    assert time.monotonic() - t0 < 1.5
    text = dump.read_text()
    for name in PIPELINE_THREADS | {"heartbeat", "MainThread"}:
        assert f'Thread "{name}"' in text, name
    assert "role=drafter@cpu" in text
    # Training goes on.
    p.wait_step(hb["step"] + 3)
    p.signal(signal.SIGTERM)
    assert p.wait() == 0


@pytest.mark.serial  # a time bound: not beside another test's trainer
def test_sigusr1_taken_by_a_native_library_is_put_back(start_trainer):
    """On the GPU, Triton's in-process LLVM takes SIGUSR1 at the C level (Python still
    reports its handler) and swallows it: the guard puts ours back, names the taker in
    train.log, and the next dumps arrive."""
    p = start_trainer(*LONG, env={"DFLASH_FAULT": "steal_signals:3"})
    p.wait_step(5)
    line = p.wait_for(
        lambda: [x for x in (p.run_dir / "train.log").read_text().splitlines() if "taken" in x],
        5,
        "the guard's line",
    )[0]
    assert "SIGUSR1 taken over at the C level by SIG_IGN" in line and "put back" in line
    for n in range(3):
        p.signal(signal.SIGUSR1)
        t0 = time.monotonic()
        dumps = p.wait_for(lambda n=n: sorted(p.run_dir.glob("stacks-2*.txt"))[n:], 5, "a dump")
        p.wait_for(lambda d=dumps[0]: "# faulthandler" in d.read_text(), 5, "a whole dump")
        assert time.monotonic() - t0 < 1.5
        assert 'Thread "drafter-0"' in dumps[0].read_text()
    p.signal(signal.SIGTERM)
    assert p.wait() == 0


def test_a_storm_of_sigusr1s_then_a_sigterm_still_stops_the_run(start_trainer):
    """The handlers used to write the log line themselves, under the log's lock: a SIGUSR1
    landing while the previous one's line was being written waited on its own thread's lock
    for ever, and the SIGTERM after it never stopped the run (CI, 12-07). Every dump is
    whole and said once in train.log."""
    p = start_trainer(*LONG)
    p.wait_step(3)
    for _ in range(300):
        p.signal(signal.SIGUSR1)
        time.sleep(0.002)
    p.signal(signal.SIGTERM)
    assert p.wait(timeout=60) == 0
    dumps = sorted(d.name for d in p.run_dir.glob("stacks-2*.txt"))
    assert dumps and all("# faulthandler" in (p.run_dir / d).read_text() for d in dumps)
    said = [x for x in p.read("train.log").splitlines() if "SIGUSR1: thread stacks" in x]
    assert sorted(x.rsplit(" ", 1)[1] for x in said) == dumps
    assert p.heartbeat()["phase"] == "stopped"


def test_sigterm_finishes_the_step_checkpoints_and_exits_zero(start_trainer):
    p = start_trainer(*LONG)
    p.wait_step(4)
    p.signal(signal.SIGTERM)
    assert p.wait(timeout=30) == 0
    hb = p.heartbeat()
    # Stopped before its last step: `stopped`, not `finished` (schema 1 said finished).
    assert hb["phase"] == "stopped" and hb["exit_code"] == 0
    assert hb["step"] < hb["total_steps"]
    ckpts = sorted(p.run_dir.glob("checkpoints/step-*.pt"))
    assert [c.name for c in ckpts] == [f"step-{hb['step']:08d}.pt"]
    assert hb["last_checkpoint"]["path"] == f"checkpoints/step-{hb['step']:08d}.pt"
    assert hb["last_checkpoint"]["step"] == hb["step"]
    assert [h["phase"] for h in hb["phase_history"]][-3:] == [
        "stopping",
        "checkpointing",
        "stopped",
    ]
    assert not list(p.run_dir.glob("checkpoints/.*"))  # no temp file left behind


def test_sigterms_that_keep_coming_during_teardown_do_not_turn_a_stop_into_a_kill(
    start_trainer,
):
    """A second kill, or a group signal while the process shuts down: once the final
    heartbeat is written the run is over, and the exit stays clean (not death by SIGTERM,
    which the interpreter's restored default handler would make of it)."""
    p = start_trainer(*LONG)
    p.wait_step(3)
    deadline = time.monotonic() + 60
    while p.proc.poll() is None and time.monotonic() < deadline:
        p.signal(signal.SIGTERM)
        time.sleep(0.005)
    code = p.wait(timeout=5)
    assert code == 0, p.stdout_path.read_text()[-4000:] + p.read("train.log")[-4000:]
    assert p.heartbeat()["phase"] == "stopped"


def test_resume_continues_the_same_trajectory(start_trainer, tmp_path):
    """SIGTERM a run, resume it, and compare with a run never interrupted."""
    args = ("--max-steps", "400", "--set", "train.log_every=1")
    ref = start_trainer(*args, root=tmp_path / "ref")
    ref.wait_step(15)
    ref.signal(signal.SIGTERM)
    assert ref.wait() == 0

    cut = start_trainer(*args, root=tmp_path / "cut")
    cut.wait_step(4)
    cut.signal(signal.SIGTERM)
    assert cut.wait() == 0
    stopped_at = cut.heartbeat()["step"]
    assert stopped_at < 12

    resumed = start_trainer("--resume", str(cut.run_dir), root=tmp_path / "resumed")
    resumed.wait_step(15)
    resumed.signal(signal.SIGTERM)
    assert resumed.wait() == 0
    config = json.loads((resumed.run_dir / "config.json").read_text())
    assert config["run"]["parent"] == str(cut.run_dir.resolve())
    assert config["run"]["checkpoint"].endswith(f"step-{stopped_at:08d}.pt")

    expected = {m["step"]: m for m in ref.metrics()}
    got = resumed.metrics()
    assert got[0]["step"] == stopped_at + 1
    compared = 0
    for m in got:
        if m["step"] in expected and m["step"] <= 15:
            assert m["loss"] == pytest.approx(expected[m["step"]]["loss"], rel=1e-6), m["step"]
            assert m["tokens"] == expected[m["step"]]["tokens"]
            compared += 1
    assert compared >= 15 - stopped_at


@pytest.mark.parametrize(
    ("role", "thread"), [("prefetch", "prefetch-"), ("target", "target-"), ("drafter", "drafter-")]
)
def test_a_failure_in_any_thread_stops_the_run(start_trainer, role, thread):
    p = start_trainer(*LONG, env={"DFLASH_FAULT": f"{role}:3"})
    t0 = time.monotonic()
    code = p.wait(timeout=60)
    assert code == 1
    hb = p.heartbeat()
    assert hb["phase"] == "crashed" and hb["exit_code"] == 1
    assert hb["error"]["thread"].startswith(thread)
    assert "InjectedFault" in hb["error"]["traceback"]
    assert f"injected fault in {role}" in hb["error"]["message"]
    assert "error in" in (p.run_dir / "train.log").read_text()
    assert time.monotonic() - t0 < 45


def test_wandb_offline_is_recorded_and_its_absence_is_one_line(start_trainer, tmp_path):
    p = start_trainer("--max-steps", "3", "--set", "runtime.wandb_mode=offline")
    assert p.wait() == 0
    hb = p.heartbeat()
    config = json.loads((p.run_dir / "config.json").read_text())
    assert hb["wandb"]["mode"] == "offline" and hb["wandb"]["id"]
    assert config["run"]["wandb"] == hb["wandb"]

    # A stand-in that fails to import, as when wandb is not installed.
    fake = tmp_path / "no-wandb"
    fake.mkdir()
    (fake / "wandb.py").write_text("raise ImportError('No module named wandb')\n")
    q = start_trainer(
        "--max-steps",
        "3",
        "--set",
        "runtime.wandb_mode=offline",
        env={"PYTHONPATH": f"{fake}:{sys.path[0]}"},
    )
    assert q.wait() == 0
    notes = [ln for ln in (q.run_dir / "train.log").read_text().splitlines() if "wandb" in ln]
    assert len(notes) == 1 and "not installed" in notes[0]
    assert q.heartbeat()["wandb"]["mode"] == "absent"


def test_phases_are_the_contracts():
    assert PHASES[0] == "starting" and {"finished", "stopped", "crashed"} <= set(PHASES)


def test_recompiles_after_warm_up_are_reported_with_their_reason():
    """dynamo's own recompile log, caught: the heartbeat and train.log say which guard failed."""
    import torch

    from trainer.runtime.warmup import recompile_summary, watch_recompiles

    @torch.compile(backend="eager", dynamic=False)
    def scale(x):
        return x * 2

    scale(torch.ones(3))
    reasons: list[str] = []
    watch_recompiles(reasons.append)
    scale(torch.ones(3))
    assert reasons == []  # same shape: no recompile
    scale(torch.ones(5))
    assert len(reasons) == 1
    line = recompile_summary(reasons[0])
    assert line.startswith("scale in ") and "\n" not in line
    assert "size" in line or "5" in line, line

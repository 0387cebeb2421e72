"""`python -m trainer` as a user runs it: a real process, a real run dir."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / "trainer" / "configs" / "tiny-cpu.toml"

STEP_LINE = re.compile(
    r"^\[\d+m\] step=(\d+) loss=\d+\.\d{4} acc=\d\.\d{3} streak=\d+\.\d lr=\d\.\d\de[-+]\d\d "
    r"noise=\d\.\d{4} \| tgt=\d+\.\d\db/s dft=\d+\.\d\db/s \(\d+(\.\d)?[KM]?tok/s\) \| "
    r"q_pre=\[[\d, ]*\] q_hs=\[[\d, ]*\] \| epoch~\d+\.\d\d "
    r"ETA=(\d+s|\d+\.\d[mhd]|\?)$"
)


def run_trainer(*args: str, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "trainer", "--set", "runtime.wandb_mode=disabled", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=ROOT,
    )


def only_run_dir(root: Path) -> Path:
    (run_dir,) = [p for p in root.iterdir() if p.is_dir()]
    return run_dir


def test_a_short_run_fills_its_run_dir(tmp_path):
    r = run_trainer(
        "--config",
        str(TINY),
        "--run-root",
        str(tmp_path),
        "--max-steps",
        "12",
        "--set",
        "train.log_every=4",
    )
    assert r.returncode == 0, r.stderr
    run_dir = only_run_dir(tmp_path)
    assert run_dir.name.split("-")[2] == "tiny"  # <date>-<time>-tiny-cpu-<hex>
    config = json.loads((run_dir / "config.json").read_text())
    assert config["train"]["max_steps"] == 12
    assert config["run"]["run_id"] == run_dir.name
    lines = [ln for ln in (run_dir / "train.log").read_text().splitlines() if "step=" in ln]
    assert [int(STEP_LINE.match(ln).group(1)) for ln in lines] == [4, 8, 12], lines
    metrics = [json.loads(ln) for ln in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == [4, 8, 12]
    for m, line in zip(metrics, lines, strict=True):
        assert f"loss={m['loss']:.4f}" in line
        assert m["memory"]["cpu"]["allocated"] > 0
        assert {
            "acc",
            "streak",
            "lr",
            "noise",
            "tgt_bps",
            "dft_bps",
            "tok_s",
            "q_pre",
            "q_hs",
            "epoch",
            "eta_s",
            "elapsed_s",
            "time",
            "tokens",
        } <= set(m)
    assert (run_dir / "checkpoints" / "step-00000012.pt").is_file()
    # The step lines also reach stdout, as they happen.
    assert "step=12" in r.stdout


def test_every_launch_gets_a_new_run_dir(tmp_path):
    for _ in range(2):
        r = run_trainer("--config", str(TINY), "--run-root", str(tmp_path), "--max-steps", "1")
        assert r.returncode == 0, r.stderr
    dirs = sorted(p.name for p in tmp_path.iterdir() if p.is_dir())  # not the launch lock
    assert len(dirs) == 2 and dirs[0] != dirs[1]
    # The second launch reads its samples from the tokenization cache, and says so.
    first, second = (json.loads((tmp_path / d / "heartbeat.json").read_text()) for d in dirs)
    assert first["data"]["cache"] in ("miss", "hit")  # another test may have filled it
    assert second["data"]["cache"] == "hit"
    assert second["data"]["samples"] == first["data"]["samples"] == 1500
    assert "from the tokenization cache" in (tmp_path / dirs[1] / "train.log").read_text()


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--set", "train.lrr=1"], "config: train.lrr = 1: unknown key"),
        (
            ["--set", "train.batch_size=big"],
            'config: train.batch_size = "big": expected an integer',
        ),
        (["--set", "data.path=/nonexistent/data.jsonl"], "data.path"),
        (["--set", "target.path=/nonexistent/model"], "target.path"),
    ],
)
def test_bad_input_is_one_line_naming_the_culprit(tmp_path, args, needle):
    r = run_trainer("--config", str(TINY), "--run-root", str(tmp_path), *args)
    assert r.returncode == 2
    errors = [ln for ln in r.stderr.splitlines() if ln.startswith("error:")]
    assert len(errors) == 1 and needle in errors[0], r.stderr
    assert "Traceback" not in r.stderr


def test_bad_data_lines_are_skipped_with_their_line_number(tmp_path):
    src = (ROOT / "trainer" / "datasets" / "synthetic-chat.jsonl").read_text().splitlines()
    data = tmp_path / "data.jsonl"
    data.write_text("\n".join([src[0], "{not json", src[1], '{"conversations": 3}', *src[2:40]]))
    r = run_trainer(
        "--config",
        str(TINY),
        "--run-root",
        str(tmp_path / "runs"),
        "--max-steps",
        "2",
        "--set",
        f"data.path={json.dumps(str(data))}",
    )
    assert r.returncode == 0, r.stderr
    log = (only_run_dir(tmp_path / "runs") / "train.log").read_text()
    assert f"{data}:2: skipped" in log
    assert f"{data}:4: skipped" in log


def test_a_dataset_with_nothing_usable_stops_at_start(tmp_path):
    data = tmp_path / "bad.jsonl"
    data.write_text("{oops\n[1, 2]\n")
    r = run_trainer(
        "--config",
        str(TINY),
        "--run-root",
        str(tmp_path / "runs"),
        "--set",
        f"data.path={json.dumps(str(data))}",
    )
    assert r.returncode == 2
    assert "no usable sample" in r.stderr and str(data) in r.stderr


def test_the_configured_compile_cache_wins_over_an_inherited_one(tmp_path):
    """torch exports TORCHINDUCTOR_CACHE_DIR from any process that has compiled once, and the
    processes it launches inherit it: a run whose config names a compile cache uses that one
    (its caches and its compile history), not the launcher's."""
    import os

    inherited, configured = tmp_path / "inherited", tmp_path / "configured"
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(inherited / "inductor")}
    r = subprocess.run(
        [sys.executable, "-m", "trainer", "--config", str(TINY), "--run-root",
         str(tmp_path / "runs"), "--max-steps", "1", "--set", "runtime.wandb_mode=disabled",
         "--set", f"runtime.compile_cache_dir={json.dumps(str(configured))}"],
        capture_output=True, text=True, timeout=240, cwd=ROOT, env=env,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    heartbeat = json.loads((only_run_dir(tmp_path / "runs") / "heartbeat.json").read_text())
    assert heartbeat["compile"]["cache_dir"] == str(configured / "inductor")
    assert (configured / "inductor" / "history.json").is_file()
    assert not inherited.exists()

"""What held-out eval during training costs the demo run: the demo config trained with its
eval (eval.every from the config, the final one included) and without (eval.every=0, no
final), alternated, on the same machine; the time from the first step to the end of the run
(training, checkpoints and the wait for the last eval) from each run's heartbeat.

    .venv/bin/python bench/eval_cost.py [PAIRS]   (2 pairs: ~4 minutes on 2 cores)
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

from trainer.contract.heartbeat import Heartbeat, read_heartbeat
from trainer.contract.phases import phase_durations

ROOT = Path(__file__).resolve().parents[1]
DEMO = ROOT / "trainer" / "configs" / "demo-cpu.toml"
AFTER_START = ("starting", "loading_data", "loading_target", "compiling", "warmup")


def one_run(with_eval: bool) -> tuple[float, float]:
    """(seconds from the first step to the end, the eval thread's seconds)."""
    with tempfile.TemporaryDirectory() as tmp:
        sets = [] if with_eval else ["--set", "eval.every=0", "--set", "eval.final=false"]
        subprocess.run(
            [sys.executable, "-m", "trainer", "--config", str(DEMO), "--run-root", tmp,
             "--set", "runtime.wandb_mode=disabled", *sets],
            check=True, capture_output=True, cwd=ROOT,
        )  # fmt: skip
        (run,) = Path(tmp).iterdir()
        hb = read_heartbeat(run / "heartbeat.json")
        assert isinstance(hb, Heartbeat)
        took = phase_durations(hb.phase_history, hb.now, final=True)
        busy = sum(s for k, s in took.items() if k.split("#")[0] not in AFTER_START)
        return busy, hb.eval.seconds if hb.eval else 0.0


def main() -> None:
    pairs = int(sys.argv[1]) if len(sys.argv) > 1 else 2
    one_run(True)  # builds the target and its answers into the cache, if not there yet
    with_eval, without = [], []
    for _ in range(pairs):
        with_eval.append(one_run(True))
        without.append(one_run(False))
    for name, runs in (("with eval", with_eval), ("without", without)):
        print(f"{name}: " + ", ".join(f"{b:.1f}s (eval thread {e:.1f}s)" for b, e in runs))
    a = sum(b for b, _ in with_eval) / pairs
    b = sum(b for b, _ in without) / pairs
    print(f"first step -> end: {a:.1f}s with eval, {b:.1f}s without: cost {a / b - 1:+.1%}")


if __name__ == "__main__":
    main()

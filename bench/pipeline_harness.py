"""The bare pipeline on a config's own data: the harness figure the operator's path is held to.

    python3 bench/pipeline_harness.py --config trainer/configs/qwen3-8b-h200.toml \
        [--settle 15] [--measure 45] [--set KEY=VALUE ...]

Builds the run exactly as the trainer does (`trainer.runtime.setup.build_run`: the same data,
packing, target, drafters and compile), warms up, then runs `Pipeline` in this process with nothing
around it: no run dir, no heartbeat or telemetry thread, no GIL probe, no checkpoints, no
agent or monitor. Real tokens per second over `--measure` seconds after `--settle` seconds of
steps, counted as metrics.jsonl counts them. `bench/gpu_e2e.sh` runs it after the launch and
compares: what the product's path costs over the pipeline itself.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config", type=Path, required=True)
    p.add_argument("--settle", type=float, default=15.0)
    p.add_argument("--measure", type=float, default=45.0)
    p.add_argument("--set", dest="overrides", action="append", default=[])
    args = p.parse_args()

    from trainer.config import load_config
    from trainer.runtime.compile.cache import configure_compile_cache

    cfg = load_config(args.config, args.overrides)
    configure_compile_cache(cfg)

    from trainer.model.checkpoint import TrainPosition
    from trainer.reporting.runstate import RunState
    from trainer.reporting.steplog import RunLog
    from trainer.runtime.pipeline import Pipeline
    from trainer.runtime.run import set_threads_for_cpu
    from trainer.runtime.setup import build_run
    from trainer.runtime.warmup import warm_up, warm_up_targets

    set_threads_for_cpu(cfg)
    state = RunState("harness")
    t0 = time.monotonic()
    setup = build_run(cfg, warn=lambda _m: None, phase=state.set_phase, progress=state.progress)
    warmup_s = warm_up(setup, state)
    setup.finish_loading()
    warmup_s += warm_up_targets(setup)
    ready_s = time.monotonic() - t0
    with tempfile.TemporaryDirectory() as tmp:
        log = RunLog(Path(tmp), echo=False)
        pipe = Pipeline(
            setup, state, log, TrainPosition(0, 0, 0), save_checkpoint=lambda _p, _l: None
        )
        pipe.start()
        time.sleep(args.settle)
        tok0, step0, t_a = state.tokens, state.step, time.monotonic()
        time.sleep(args.measure)
        tok1, step1, t_b = state.tokens, state.step, time.monotonic()
        pipe.stop_request.set()
        outcome = pipe.wait()
    tok_s = (tok1 - tok0) / (t_b - t_a)
    step_ms = 1e3 * (t_b - t_a) / max(1, step1 - step0)
    print(
        f"HARNESS tok_s={tok_s:.0f} steps={step1 - step0} step_ms={step_ms:.1f}"
        f" warmup_s={warmup_s:.1f} ready_s={ready_s:.1f} outcome={outcome}",
        flush=True,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())

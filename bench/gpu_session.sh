#!/usr/bin/env bash
# Everything measured on the lent GPU in one call, most important first; a table at the end.
#   bench/gpu_session.sh OUTDIR
set -uo pipefail
out="${1:-/tmp/gpu_session}"; mkdir -p "$out"
export PYTHONUNBUFFERED=1 TORCHINDUCTOR_CACHE_DIR="$out/inductor-cache" BENCH_SKIP_EAGER=1
export DFLASH_CACHE_DIR="$out/dflash-cache"
python3 -m pytest -q -p no:cacheprovider tests/trainer/test_gpu.py 2>&1 | tail -2
timeout 330 python3 bench/gpu_bench.py --out "$out/results.json" --pipeline-steps 150 \
  --only peak drafter attention lm_head target pipeline 2>&1 | grep --line-buffered -v "warn(\|Warning:"
timeout 90 python3 bench/make_bench_target.py /tmp/qwen3-8b-random
# The compile cache is warm now (the bench filled it): this is a restart as operators see it.
timeout 130 python3 bench/restart_bench.py --config trainer/configs/qwen3-8b-h200.toml \
  --timeout 120 | tee "$out/restart-warm.json"
# results.json carries the restart figure too.
python3 - "$out" <<'PY'
import json, sys
out = sys.argv[1]
results = json.load(open(f"{out}/results.json"))
try:
    restart = json.loads(open(f"{out}/restart-warm.json").read().strip().splitlines()[-1])
    results["first_step_s_warm"] = restart["first_step_s"]
    results["first_step_phases_warm"] = restart["phases"]
except (OSError, ValueError, KeyError, IndexError) as e:
    results["first_step_s_warm"] = None
    print("no restart figure:", e)
json.dump(results, open(f"{out}/results.json", "w"), indent=1)
print(json.dumps({k: results.get(k) for k in ("drafter_mfu", "flex_speedup_16k",
      "pipeline_efficiency", "recompiles_after_warmup", "host_syncs_per_step",
      "first_step_s_warm", "device", "torch")}, indent=1))
PY

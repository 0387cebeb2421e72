#!/usr/bin/env bash
# Everything measured on the lent GPU in one call, most important first; a table at the end.
#   bench/gpu_session.sh OUTDIR
set -uo pipefail
out="${1:-/tmp/gpu_session}"; mkdir -p "$out"
export PYTHONUNBUFFERED=1 TORCHINDUCTOR_CACHE_DIR="$out/inductor-cache" BENCH_SKIP_EAGER=1
export DFLASH_CACHE_DIR="$out/dflash-cache"
python3 -m pytest -q -p no:cacheprovider tests/trainer/test_gpu.py 2>&1 | tail -2
timeout 330 python3 bench/gpu_bench.py --out "$out/results.json" --pipeline-steps 150 \
  --only peak drafter lm_head target pipeline 2>&1 | grep -v "warn(\|Warning:"
timeout 90 python3 bench/make_bench_target.py /tmp/qwen3-8b-random
# The compile cache is warm now (the bench filled it): this is a restart as operators see it.
timeout 130 python3 bench/restart_bench.py --config trainer/configs/qwen3-8b-h200.toml \
  --timeout 120 | tee "$out/restart-warm.json"

#!/usr/bin/env bash
# Everything measured on the lent GPU, most important first; tables at the end.
#   bench/gpu_session.sh OUTDIR [bench|restart|all]
# A device call is limited to 10 minutes and each starts on a bare machine (cold compile
# cache), so the work comes in two parts that each fit one call:
#   bench    gpu_bench.py: peak, drafter, lm_head, target, pipeline (both stream modes)
#   restart  build the 8B-shaped target, restart cold then warm, then the GPU tests
# `all` runs both and merges; split runs merge with bench/merge_results.py.
set -uo pipefail
out="${1:-/tmp/gpu_session}"; part="${2:-all}"; mkdir -p "$out"
# Compile caches outside OUTDIR (a device call returns at most 8 files from it). A cache
# carried in from an earlier call (.gpu-cache/gpu-cache.tgz.part-*, see the end) is used
# when this machine has none: a bare machine otherwise compiles for 3-5 minutes.
cache=/tmp/gpu-cache
export PYTHONUNBUFFERED=1 BENCH_SKIP_EAGER=1 DFLASH_CACHE_DIR="$cache/dflash"
export TORCHINDUCTOR_CACHE_DIR="$cache/inductor" TRITON_CACHE_DIR="$cache/triton"
if [[ ! -d $cache ]] && compgen -G ".gpu-cache/gpu-cache.tgz.part-*" >/dev/null; then
  cat .gpu-cache/gpu-cache.tgz.part-* | tar xzf - -C /tmp && echo "compile cache carried in: $(du -sh $cache | cut -f1)"
fi
t0=$(date +%s)
left() { local s=$(( $1 - ($(date +%s) - t0) )); echo $(( s > 1 ? s : 1 )); }  # seconds left of a budget of $1
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv,noheader
python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)"

if [[ $part == bench || $part == all ]]; then
  # The drafter's cold compile dominates (3-5 min); each section saves results.json as it
  # ends, so a cut-off run still returns what it measured.
  timeout "$(left 560)" python3 bench/gpu_bench.py --out "$out/results.json" --pipeline-steps 120 \
    --only peak drafter lm_head target pipeline --trace-dir "$out" 2>&1 | tee "$out/bench.log" \
    | grep --line-buffered -v "warn(\|Warning:"
fi

if [[ $part == restart || $part == all ]]; then
  budget=$([[ $part == all ]] && echo 1150 || echo 570)
  timeout "$(left "$budget")" python3 bench/make_bench_target.py /tmp/qwen3-8b-random
  # A bare machine: the first restart compiles everything, the second finds the cache warm.
  for pass in cold warm; do
    timeout "$(left "$budget")" python3 bench/restart_bench.py \
      --config trainer/configs/qwen3-8b-h200.toml --timeout 400 | tee "$out/restart-$pass.json"
  done
  timeout "$(left "$budget")" python3 -m pytest -q -p no:cacheprovider tests/trainer/test_gpu.py \
    2>&1 | tail -15 | tee "$out/test_gpu.log"
fi

if [[ $part == restart ]]; then
  # The warm cache, back to the caller in pieces a device call can return (16 MiB each).
  tar czf - -C /tmp gpu-cache | split -b 15m - "$out/gpu-cache.tgz.part-"
  echo "compile cache: $(du -sh $cache | cut -f1), $(cat "$out"/gpu-cache.tgz.part-* | wc -c) bytes packed"
fi

if [[ $part == all ]]; then
  python3 bench/merge_results.py "$out/results.json" --restart "$out" --out "$out/results.json"
fi
echo "session part '$part' done in $(( $(date +%s) - t0 ))s"

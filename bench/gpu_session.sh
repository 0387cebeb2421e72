#!/usr/bin/env bash
# Everything measured on the lent GPU, most important first; tables at the end.
#   bench/gpu_session.sh OUTDIR [PART...]      PART: tests bench restart pack (default: all)
# A device call is limited to 10 minutes and each starts on a bare machine (cold compile
# cache), so the parts are chosen to fit one call each:
#   tests    the CUDA tests (full log in OUTDIR/test_gpu.log); tests-cold: on an empty cache
#   bench    gpu_bench.py: peak, drafter, lm_head, target, stages alone, pipeline (both
#            stream modes, profiled), with Chrome traces in OUTDIR
#   restart  build the 8B-shaped target, then restart the trainer: cold when the cache is
#            empty, then warm (OUTDIR/restart-{cold,warm}.json)
#   pack     the compile cache, split into pieces a device call can return; carried into a
#            later call as .gpu-cache/gpu-cache.tgz.part-*, it saves the 3-5 min cold compile
# Merge the parts' files with bench/merge_results.py.
set -uo pipefail
out="${1:-/tmp/gpu_session}"; shift || true
parts="${*:-tests bench restart}"
mkdir -p "$out"
cache=/tmp/gpu-cache  # outside OUTDIR: a call returns at most 8 files from it
export PYTHONUNBUFFERED=1 BENCH_SKIP_EAGER=1 DFLASH_CACHE_DIR="$cache/dflash"
export TORCHINDUCTOR_CACHE_DIR="$cache/inductor" TRITON_CACHE_DIR="$cache/triton"
if [[ ! -d $cache ]] && compgen -G ".gpu-cache/gpu-cache.tgz.part-*" >/dev/null; then
  cat .gpu-cache/gpu-cache.tgz.part-* | tar xzf - -C /tmp && echo "compile cache carried in: $(du -sh $cache | cut -f1)"
fi
t0=$(date +%s)
left() { local s=$(( $1 - ($(date +%s) - t0) )); echo $(( s > 1 ? s : 1 )); }  # of a budget of $1 s
budget=570
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv,noheader
python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)"

for part in $parts; do
  echo "== $part ($(( $(date +%s) - t0 ))s)"
  case $part in
    tests|tests-cold)
      # tests-cold: an empty compile cache, as on a new machine (the cold path is where
      # threads compiling at once would hurt).
      [[ $part == tests-cold ]] && export TORCHINDUCTOR_CACHE_DIR=/tmp/cold/inductor TRITON_CACHE_DIR=/tmp/cold/triton
      timeout "$(left $budget)" python3 -m pytest -q -p no:cacheprovider tests/trainer/test_gpu.py \
        > "$out/test_gpu.log" 2>&1
      echo "tests: exit $?"; grep -E "passed|failed|Error|error:|assert" "$out/test_gpu.log" | tail -25
      export TORCHINDUCTOR_CACHE_DIR="$cache/inductor" TRITON_CACHE_DIR="$cache/triton" ;;
    bench)
      # Each section saves results.json as it ends: a cut-off run returns what it measured.
      timeout "$(left $budget)" python3 bench/gpu_bench.py --out "$out/results.json" \
        --pipeline-steps 120 --only peak drafter lm_head target pipeline --trace-dir "$out" \
        2>&1 | tee "$out/bench.log" | grep --line-buffered -v "warn(\|Warning:" ;;
    restart)
      [[ -d /tmp/qwen3-8b-random ]] || timeout "$(left $budget)" python3 bench/make_bench_target.py /tmp/qwen3-8b-random
      passes="warm"; [[ -n $(ls -A "$cache/inductor" 2>/dev/null) ]] || passes="cold warm"
      for pass in $passes; do
        timeout "$(left $budget)" python3 bench/restart_bench.py \
          --config trainer/configs/qwen3-8b-h200.toml --timeout 400 | tee "$out/restart-$pass.json"
      done ;;
    pack)
      tar czf - -C /tmp gpu-cache | split -b 15m - "$out/gpu-cache.tgz.part-"
      echo "compile cache: $(du -sh $cache | cut -f1), $(cat "$out"/gpu-cache.tgz.part-* | wc -c) bytes packed" ;;
    *) echo "unknown part: $part (tests, bench, restart, pack)" >&2; exit 2 ;;
  esac
done
echo "session parts '$parts' done in $(( $(date +%s) - t0 ))s"

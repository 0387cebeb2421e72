#!/usr/bin/env bash
# Issue 30's measurements on one H200, in parts sized for one device call each:
#   harness  gpu_bench.py's peak, the target on packed rows of the bundled data (the dense
#            mask, varlen, flex; compiled layers) and the optimizer stage's variants; then
#            bench/peer.py (SpecForge 0.2.0's DFlash step and transformers' target forward
#            against ours)
#   launch   the 8B config through `dflash-tui launch` (bench/gpu_workloads.sh's launch):
#            first with the packed target's old dense mask (target.packed_attention=mask),
#            then with this tree's defaults; each with a DFLASH_PROFILE window after the
#            measured one, split by bench/profile_report.py
#   launch-compiled  then (the same machine, warm) with target.compile = true; the GPU tests
#            of varlen and of the compiled target
#   final    this tree's defaults through launch twice (an empty compile cache, then warm),
#            each profiled; the GPU tests of varlen and the compiled target
# Usage (on the GPU machine, repo root): bench/gpu_speed.sh OUT PART...
# specforge comes from .whl/ (carried): the machine has torch and transformers.
set -uo pipefail
out="${1:-/tmp/gpu_speed}"; shift || true
parts="${*:-harness}"
mkdir -p "$out"
log="$out/summary.txt"
t0=$(date +%s)
say() { echo "== $* ($(( $(date +%s) - t0 ))s)" | tee -a "$log"; }
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD" DFLASH_CACHE_DIR=/tmp/speed/cache
export TORCHINDUCTOR_CACHE_DIR=/tmp/speed/inductor TRITON_CACHE_DIR=/tmp/speed/triton
if compgen -G ".whl/*.whl" >/dev/null; then
  python3 -m pip install -q --no-index --no-deps .whl/*.whl 2>&1 | grep -v "^WARNING" | tail -3
fi
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv,noheader | tee -a "$log"
python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)" | tee -a "$log"

remote=/tmp/speed/remote
cli=(python3 -m dflash_tui.cli)
where=(local --remote-dir "$remote")
PROFILE_AT=${PROFILE_AT:-200:4}  # DFLASH_PROFILE of each launch: after the measured window

# A launch through dflash-tui, 10 s of settling, 30 s measured (metrics.jsonl rows in the
# window: median tok/s), then the profile window's trace waited for (60 s at most), kill.
measure_launch() {  # NAME PROFILE [--set k=v ...]
  local name=$1 prof=$2; shift 2
  say "launch $name ($*)"
  local t_launch; t_launch=$(date +%s.%N)
  DFLASH_PROFILE=$prof "${cli[@]}" launch "${where[@]}" --config "${SPEED_CONFIG:-trainer/configs/qwen3-8b-h200.toml}" \
    --set runtime.wandb_mode=disabled "$@" 2>&1 | tail -1 | tee -a "$log"
  local status=starting
  for _ in $(seq 300); do
    "${cli[@]}" status "${where[@]}" --json > /tmp/speed/status.json 2>/dev/null
    status=$(python3 bench/snapshot_phase.py /tmp/speed/status.json)
    [[ $status == training || $status == crashed || $status == finished ]] && break
    sleep 1
  done
  echo "$name: launch -> $status $(python3 -c "print(round($(date +%s.%N)-$t_launch, 1))") s" | tee -a "$log"
  local run_dir; run_dir=$(ls -td "$remote"/runs/*/ | head -1)
  sleep 10
  local t_start; t_start=$(date +%s)
  sleep 30
  "${cli[@]}" status "${where[@]}" --json > "/tmp/speed/status-$name.json" 2>/dev/null
  "${cli[@]}" status "${where[@]}" 2>&1 | head -1 | tee -a "$log"
  for _ in $(seq 60); do compgen -G "$run_dir/profile/*.json.gz" >/dev/null && break; sleep 1; done
  sleep 2
  python3 - "$run_dir" "$t_start" "$name" <<'PY' | tee -a "$log"
import json, statistics, sys
run_dir, t_start, name = sys.argv[1], float(sys.argv[2]), sys.argv[3]
rows = [json.loads(x) for x in open(run_dir + "metrics.jsonl") if x.strip()]
late = [r for r in rows if r["time"] >= t_start and r["time"] <= t_start + 30]
hb = json.load(open(run_dir + "heartbeat.json"))
phases = {p["phase"]: p for p in hb.get("phase_history", [])}
tok = statistics.median(r["tok_s"] for r in late) if late else float("nan")
print(f"RESULT {name} tok_s={tok:.0f} rows={len(late)} step={hb['step']} "
      f"recompiles={(hb.get('compile') or {}).get('recompiles')} "
      f"padding={(hb.get('data') or {}).get('padding')}")
for t in hb.get("threads", []):
    st = t.get("stages_ms") or {}
    if st:
        print(f"STAGES {name} {t.get('name')}: " + ", ".join(f"{k} {v:.1f}" for k, v in st.items()))
PY
  grep -E "^profile:|^recompile|warm-up|compile cache" "$run_dir/train.log" | head -8 | tee -a "$log"
  "${cli[@]}" kill "${where[@]}" --timeout 60 2>&1 | tail -1 | tee -a "$log"
  cp "$run_dir/train.log" "$out/train-$name.log" 2>/dev/null
  local trace; trace=$(ls "$run_dir"/profile/*.json.gz 2>/dev/null | head -1)
  if [[ -n $trace ]]; then
    cp "$trace" "$out/trace-$name.json.gz"
    python3 bench/profile_report.py "$trace" | tee "$out/profile-$name.txt" | tee -a "$log"
  else
    echo "PROFILE $name: no trace" | tee -a "$log"
  fi
}

for part in $parts; do
  case $part in
    harness)
      say "gpu_bench: peak, target (unpacked, packed: mask / varlen / flex, compiled), optimizer"
      timeout 280 python3 bench/gpu_bench.py --out "$out/bench.json" \
        --only peak target target_packed optimizer 2>&1 | grep -v "Warning\|warn(" \
        | tee "$out/bench.log" | grep -E "^  |^\|" | tee -a "$log"
      say "peer: SpecForge 0.2.0 and transformers against ours"
      timeout 270 python3 bench/peer.py --steps 20 --out "$out/peer.json" 2>&1 \
        | grep -v "Warning\|warn(" | tee "$out/peer.log" | grep -E "^  |^\||Error|error" | tee -a "$log"
      ;;
    launch)
      say "build the 8B-shaped target"
      [[ -d /tmp/qwen3-8b-random ]] || python3 bench/make_bench_target.py /tmp/qwen3-8b-random 2>&1 | tail -1
      say deploy
      "${cli[@]}" deploy "${where[@]}" 2>&1 | tail -1 | tee -a "$log"
      # The old path first (the cold compile), then this tree's defaults (a warm compile
      # cache: its launch -> training is the warm cold-start figure).
      measure_launch mask "$PROFILE_AT" --set target.packed_attention=mask
      measure_launch default "$PROFILE_AT" ;;
    final)  # this tree's defaults twice: the first launch compiles cold, the second is warm
      say "build the 8B-shaped target"
      [[ -d /tmp/qwen3-8b-random ]] || python3 bench/make_bench_target.py /tmp/qwen3-8b-random 2>&1 | tail -1
      "${cli[@]}" deploy "${where[@]}" 2>&1 | tail -1 | tee -a "$log"
      measure_launch final-cold "$PROFILE_AT"
      measure_launch final-warm "$PROFILE_AT"
      say "the GPU tests of varlen and the compiled target"
      timeout 120 python3 -m pytest -q -p no:cacheprovider tests/trainer/test_gpu.py \
        -k "varlen or compiled_target" 2>&1 | tail -2 | tee -a "$log" ;;
    launch-compiled)  # after `launch`, on the same machine: its target and deploy
      [[ -d /tmp/qwen3-8b-random ]] || python3 bench/make_bench_target.py /tmp/qwen3-8b-random 2>&1 | tail -1
      [[ -d $remote/current ]] || "${cli[@]}" deploy "${where[@]}" 2>&1 | tail -1 | tee -a "$log"
      measure_launch compiled "$PROFILE_AT" --set target.compile=true
      say "the GPU tests of varlen and the compiled target"
      timeout 120 python3 -m pytest -q -p no:cacheprovider tests/trainer/test_gpu.py \
        -k "varlen or compiled_target" 2>&1 | tail -3 | tee -a "$log" ;;
    *) echo "unknown part: $part" >&2; exit 2 ;;
  esac
done
say done

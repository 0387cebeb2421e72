#!/usr/bin/env bash
# The run-dir contract on a GPU, through dflash-tui as an operator runs it: deploy, launch the
# tiny GPU config, `status --json` while it trains, `runs`, `kill` (a stop, not a finish),
# `runs` again; the run dir's contract files are kept. Then scripts/record-scenarios' fast
# scenarios on this GPU (real NVML samples). Everything lands in OUT/gpu_contract.tar.gz.
# Usage (on the GPU machine, from the repo root): bench/gpu_contract.sh OUT
set -uo pipefail
out="${1:-/tmp/gpu_contract}"
work="$out/work"
mkdir -p "$work"
export PYTHONPATH="$PWD" DFLASH_CACHE_DIR="$work/cache" PYTHONUNBUFFERED=1
remote="$work/remote"
cli=(python3 -m dflash_tui.cli)
where=(local --remote-dir "$remote")
log="$work/summary.txt"
say() { echo "== $*" | tee -a "$log"; }

nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee -a "$log"
python3 -c "import sys, torch; print('python', sys.version.split()[0], 'torch', torch.__version__)" | tee -a "$log"

say deploy
"${cli[@]}" deploy "${where[@]}" 2>&1 | tee -a "$log"
say launch
t0=$(date +%s.%N)
"${cli[@]}" launch "${where[@]}" --config trainer/configs/tiny-gpu.toml \
    --set train.max_steps=5000 --set train.checkpoint_every=100 \
    --set runtime.wandb_mode=disabled 2>&1 | tee -a "$log"
for _ in $(seq 240); do
  "${cli[@]}" status "${where[@]}" --json > "$work/status.json" 2>/dev/null
  grep -q '"phase": "training"' "$work/status.json" && break
  sleep 1
done
echo "launch -> training: $(python3 -c "print(round($(date +%s.%N)-$t0, 1))") s" | tee -a "$log"
sleep 20
say "status --json (training)"
"${cli[@]}" status "${where[@]}" --json > "$work/status-training.json"; echo "exit $?" | tee -a "$log"
say status
"${cli[@]}" status "${where[@]}" 2>&1 | tee -a "$log"
say runs
"${cli[@]}" runs "${where[@]}" 2>&1 | tee -a "$log"
say kill
"${cli[@]}" kill "${where[@]}" --timeout 30 2>&1 | tee -a "$log"
sleep 3
say "runs after the kill"
"${cli[@]}" runs "${where[@]}" 2>&1 | tee -a "$log"
say "status after the kill"
"${cli[@]}" status "${where[@]}" 2>&1 | tee -a "$log"

run_dir=$(ls -d "$remote"/runs/*/ | head -1)
mkdir -p "$work/rundir"
for f in config.json launch.json launch.log exit.json heartbeat.json telemetry.jsonl metrics.jsonl; do
  cp "$run_dir/$f" "$work/rundir/" 2>/dev/null
done
ls "$run_dir/checkpoints" > "$work/rundir/checkpoints.txt"

say "record-scenarios on this GPU"
python3 tests/infra/record_scenarios.py healthy crashed_in_thread killed_sigkill \
    --config trainer/configs/tiny-gpu.toml --out "$work/scenarios" --suffix _h200 2>&1 | tee -a "$log"

rm -rf "$work/cache" "$remote/releases"
tar -czf "$out/gpu_contract.tar.gz" -C "$work" --exclude='remote' . && echo "packed $out/gpu_contract.tar.gz"
cat "$log" | tail -60

#!/usr/bin/env bash
# Why does SIGUSR1 give no named stack dump on a live GPU run? (issue 13) On the GPU machine,
# repo root: bench/stackdump_probe.sh OUT. Launches tiny-gpu through dflash-tui with the
# sitecustomize probe (bench/sigprobe) loaded into every Python process, then records the
# signal masks of each thread, the handlers before/after, py-spy's view of the main thread
# right after SIGUSR1, and what dump-stacks answered. Everything goes into OUT/probe.txt.
set -uo pipefail
out="${1:-/tmp/probe}"; mkdir -p "$out"
work=/tmp/probe-work; rm -rf "$work"; mkdir -p "$work"
remote="$work/remote"
export PYTHONUNBUFFERED=1 SIGPROBE_LOG="$out/sigprobe.log"
export PYTHONPATH="$PWD/bench/sigprobe:$PWD"
export TORCHINDUCTOR_CACHE_DIR="$work/inductor" TRITON_CACHE_DIR="$work/triton"
cli=(python3 -m dflash_tui.cli)
log="$out/probe.txt"
say() { echo "== $*" >> "$log"; }
"${cli[@]}" deploy local --remote-dir "$remote" 2>&1 | tail -1 >> "$log"
"${cli[@]}" launch local --remote-dir "$remote" --config trainer/configs/tiny-gpu.toml \
  --set train.epochs=10000 --set runtime.wandb_mode=disabled 2>&1 | tail -2 >> "$log"
for _ in $(seq 300); do
  "${cli[@]}" status local --remote-dir "$remote" --json > "$work/status.json" 2>/dev/null
  p=$(python3 bench/snapshot_phase.py "$work/status.json")
  [[ $p == training || $p == crashed ]] && break
  sleep 1
done
say "phase $p"
run_dir=$(ls -td "$remote"/runs/*/ | head -1)
pid=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['pid'])" "$run_dir/heartbeat.json")
say "pid $pid"; grep -E "^Sig|^Shd" /proc/$pid/status >> "$log"
say "threads (name SigBlk SigPnd)"
for t in /proc/$pid/task/*; do
  echo "$(basename $t) $(cat $t/comm) $(grep SigBlk $t/status | cut -f2) $(grep SigPnd $t/status | cut -f2)" >> "$log"
done
say "py-spy before"; timeout 20 py-spy dump --pid $pid >> "$log" 2>&1
for i in 1 2 3; do
  say "dump-stacks #$i"
  t=$(date +%s.%N)
  timeout 30 "${cli[@]}" dump-stacks local --remote-dir "$remote" --no-pyspy > "$work/dump.txt" 2>&1
  echo "rc=$? in $(python3 -c "print(round($(date +%s.%N)-$t,2))") s" >> "$log"
  head -c 3000 "$work/dump.txt" >> "$log"
  say "py-spy --native right after"; timeout 20 py-spy dump --native --pid $pid >> "$log" 2>&1
  grep -E "^Sig|^Shd" /proc/$pid/status >> "$log"
done
say "run dir"; ls -la "$run_dir" >> "$log"
say "train.log tail"; tail -20 "$run_dir/train.log" >> "$log"
say "launch.log tail"; tail -40 "$run_dir"/launch.log >> "$log" 2>/dev/null
kill -USR2 $pid; sleep 1
say "SIGUSR2 file tail"; tail -60 "$run_dir/stacks-sigusr2.txt" >> "$log"
"${cli[@]}" kill local --remote-dir "$remote" --timeout 60 2>&1 | tail -1 >> "$log"
say done

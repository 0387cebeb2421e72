#!/usr/bin/env bash
# The operator's path, end to end, through dflash-tui commands only: deploy, launch the GPU
# config on the bundled realistic data, wait for training, status --json, dump-stacks (10
# times), restart (resume), kill and drain. Every figure is read from what those commands
# print and from the run dirs they leave (bench/e2e_report.py turns them into numbers).
#
#   bench/gpu_e2e.sh OUT [8b|tiny]      (on the GPU machine, repo root; tiny: any machine)
#
# Records into OUT/: summary.txt (what happened, with times), e2e.json (the figures), and
# rundirs.tgz (every run dir without its checkpoints). The compile cache starts truly empty:
# a fresh DFLASH_CACHE_DIR, nothing shipped, nothing left from earlier runs.
# Wheels the machine lacks (textual, asyncssh, fla, py-spy) come from .whl/ (carried).
set -uo pipefail
out="${1:?usage: bench/gpu_e2e.sh OUT [8b|tiny]}"
which="${2:-8b}"
mkdir -p "$out"
out=$(cd "$out" && pwd)
work="${E2E_WORK:-/tmp/e2e}"
rm -rf "$work/cache" "$work/remote"
mkdir -p "$work"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 DFLASH_CACHE_DIR="$work/cache"
unset TORCHINDUCTOR_CACHE_DIR TRITON_CACHE_DIR  # the trainer's own cache folders, as deployed
log="$out/summary.txt"
events="$out/events.jsonl"  # one {"what", "t", ...} per measured moment
: > "$log"; : > "$events"
t0=$(date +%s.%N)
now() { python3 -c "import time; print(f'{time.time():.3f}')"; }
say() { echo "== $* ($(python3 -c "print(round($(date +%s.%N) - $t0))")s)" | tee -a "$log"; }
mark() {  # WHAT [key=value ...]: a measured moment
  python3 - "$events" "$@" <<'EOF'
import json, sys, time
path, what, *kv = sys.argv[1:]
rec = {"what": what, "t": time.time()}
for item in kv:
    k, _, v = item.partition("=")
    rec[k] = v
with open(path, "a") as f:
    f.write(json.dumps(rec) + "\n")
EOF
}
if compgen -G ".whl/*.whl" >/dev/null; then
  python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>&1 | grep -v "^WARNING" | tail -3
  export PYTHONPATH="$PYTHONPATH:/tmp/site" PATH="/tmp/site/bin:$PATH"
fi
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee -a "$log"
python3 -c "import sys, torch, transformers; print('python', sys.version.split()[0], 'torch', torch.__version__, 'transformers', transformers.__version__)" | tee -a "$log"

remote="$work/remote"
cli=(python3 -m dflash_tui.cli)
where=(local --remote-dir "$remote")
case $which in
  8b)
    config=trainer/configs/qwen3-8b-h200.toml
    # Held-out τ every 100 steps (~27 s at 15K tok/s): evals inside the measured window, so
    # the launch's tok/s against the harness's includes what they cost.
    sets=(--set eval.every=100)
    if [[ ! -d /tmp/qwen3-8b-random ]]; then
      say "build the 8B-shaped target (random weights, once per machine)"
      python3 bench/make_bench_target.py /tmp/qwen3-8b-random 2>&1 | tail -1 | tee -a "$log"
    fi
    train_s=45; settle_s=15; harness_s=30 ;;
  tiny)
    config=trainer/configs/tiny-cpu.toml
    sets=(--set train.epochs=50)
    train_s=20; settle_s=5; harness_s=10 ;;
  *) echo "unknown config: $which (8b, tiny)" >&2; exit 2 ;;
esac

status_now() {  # -> "phase step" from one `dflash-tui status --json`
  "${cli[@]}" status "${where[@]}" --json > "$work/status.json" 2>/dev/null
  python3 bench/e2e_report.py phase-step "$work/status.json"
}
wait_first_step() {  # NAME: poll status until the run's first optimizer step (or its end)
  local name=$1 p s
  for _ in $(seq 900); do
    read -r p s <<< "$(status_now)"
    [[ $p == training && $s != None && $s -ge 1 ]] && break
    [[ $p == crashed || $p == finished || $p == stopped ]] && break
    sleep 0.5
  done
  mark "$name-first-step" phase="$p" step="$s"
  echo "$name: $p at step $s" | tee -a "$log"
}

say deploy
mark deploy-start
"${cli[@]}" deploy "${where[@]}" 2>&1 | tail -1 | tee -a "$log"
mark deploy-end

say "launch (empty compile cache)"
mark launch-start
if ! "${cli[@]}" launch "${where[@]}" --config "$config" "${sets[@]}" > "$work/launch.txt" 2>&1; then
  cat "$work/launch.txt" | tee -a "$log"; echo "launch failed: stopping here" | tee -a "$log"; exit 1
fi
tail -1 "$work/launch.txt" | tee -a "$log"
mark launch-end
wait_first_step cold

say "train for ${train_s}s"
sleep "$train_s"
mark train-end
"${cli[@]}" status "${where[@]}" --json > "$out/status.json" 2>/dev/null
"${cli[@]}" status "${where[@]}" 2>&1 | tail -3 | tee -a "$log"

say "dump-stacks x10"
for i in $(seq 10); do
  "${cli[@]}" dump-stacks "${where[@]}" > "$work/stacks-$i.txt" 2> "$work/stacks-$i.err"
  rc=$?
  line=$(grep -E "^# (named|faulthandler) dump of pid" "$work/stacks-$i.txt" | tail -1)
  threads=$(grep -c '^Thread "' "$work/stacks-$i.txt")
  echo "dump $i: rc=$rc ${line:-no dump: $(tail -1 "$work/stacks-$i.err")} ($threads named threads)" | tee -a "$log"
  mark dump rc="$rc" line="$line" threads="$threads"
  sleep 0.5
done
cp "$work/stacks-1.txt" "$out/stacks-example.txt"

say "restart (resume)"
mark restart-start
"${cli[@]}" restart "${where[@]}" > "$work/restart.txt" 2>&1
tail -2 "$work/restart.txt" | tee -a "$log"
mark restart-end line="$(tail -1 "$work/restart.txt")"
wait_first_step restart
sleep "$settle_s"
"${cli[@]}" status "${where[@]}" 2>&1 | tail -2 | tee -a "$log"

say kill
mark kill-start
"${cli[@]}" kill "${where[@]}" > "$work/kill.txt" 2>&1
tail -2 "$work/kill.txt" | tee -a "$log"
mark kill-end line="$(tail -1 "$work/kill.txt")"
"${cli[@]}" runs "${where[@]}" 2>&1 | tee -a "$log"

say "export the stopped run's drafter for serving"
mark export-start
"${cli[@]}" export "${where[@]}" > "$work/export.txt" 2>&1
echo "export rc=$?" | tee -a "$log"
tail -3 "$work/export.txt" | tee -a "$log"
mark export-end line="$(tail -1 "$work/export.txt")"
du -sh "$remote"/exports/* 2>/dev/null | tee -a "$log"

say "the bare pipeline on the same config and data (bench/pipeline_harness.py)"
python3 bench/pipeline_harness.py --config "$config" "${sets[@]}" --settle "$settle_s" \
  --measure "$harness_s" 2>&1 | grep -E "^HARNESS|Error|error" | tee -a "$log" | tee "$work/harness.txt"

say "a fresh host, the compile cache shipped by deploy (pull-cache, then deploy)"
"${cli[@]}" pull-cache "${where[@]}" 2>&1 | tail -2 | tee -a "$log"
fresh_cache="$work/fresh-cache"; fresh_remote="$work/fresh-remote"
rm -rf "$fresh_cache" "$fresh_remote"
# The monitor's store of pulled artifacts lives under DFLASH_CACHE_DIR; a local target shares
# it with the host, so the fresh host's store is seeded as the operator's machine would be.
mkdir -p "$fresh_cache" && cp -r "$DFLASH_CACHE_DIR/pulled-artifacts" "$fresh_cache/" 2>/dev/null
fresh_where=(local --remote-dir "$fresh_remote")
DFLASH_CACHE_DIR="$fresh_cache" "${cli[@]}" deploy "${fresh_where[@]}" 2>&1 | tail -2 | tee -a "$log"
mark shipped-launch-start
DFLASH_CACHE_DIR="$fresh_cache" "${cli[@]}" launch "${fresh_where[@]}" --config "$config" "${sets[@]}" 2>&1 | tail -1 | tee -a "$log"
where=("${fresh_where[@]}")
DFLASH_CACHE_DIR="$fresh_cache" wait_first_step shipped
DFLASH_CACHE_DIR="$fresh_cache" "${cli[@]}" kill "${fresh_where[@]}" 2>&1 | tail -1 | tee -a "$log"
grep -h "compile cache" "$fresh_remote"/runs/*/train.log | tee -a "$log"
cp -r "$fresh_remote/runs/"* "$remote/runs/" 2>/dev/null

say report
tar -C "$remote" --exclude='*.pt' -czf "$out/rundirs.tgz" runs
python3 bench/e2e_report.py report "$events" "$remote/runs" "$settle_s" "$work/harness.txt" > "$out/e2e.json"
python3 bench/e2e_report.py table "$out/e2e.json" | tee -a "$log"

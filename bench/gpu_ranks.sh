#!/usr/bin/env bash
# rank_straggler and slow_link on a GPU, through dflash-tui as an operator runs it: the tiny
# config as a processes-mode job of 4 ranks on the lent GPU(s) (stage times from CUDA events
# on each rank's stream, trainer/reporting/stages.py), no drafter compile (a bare machine's cold
# compile would take the call), one fault per scenario with DFLASH_FAULT; for each, the
# first `status --json` in which every rank is timed at step >= 25 (or the last one), and
# `status`'s text. Usage (GPU machine, repo root): bench/gpu_ranks.sh OUT [DEVICES [NAMES]]
# DEVICES: the four ranks' devices, targets then drafters (default: all on cuda:0; ranks
# that share a GPU talk through gloo, NCCL refuses one GPU twice).
set -uo pipefail
out="${1:-/tmp/gpu_ranks}"
devs=(${2:-cuda:0 cuda:0 cuda:0 cuda:0})
names="${3:-healthy slow-drafter slow-target slow-link}"
mkdir -p "$out"
if compgen -G ".whl/*.whl" >/dev/null; then
  python3 -m pip install -q --no-index --no-deps .whl/*.whl 2>&1 | grep -v "^WARNING" | tail -3
fi
export PYTHONPATH="$PWD" PYTHONUNBUFFERED=1 DFLASH_CACHE_DIR=/tmp/ranks/cache
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>&1 | tee "$out/summary.txt"
remote=/tmp/ranks/remote
cli=(python3 -m dflash_tui.cli)
where=(local --remote-dir "$remote")
"${cli[@]}" deploy "${where[@]}" 2>&1 | tail -1
t0=$(date +%s)

scenario() {  # NAME FAULT
  local name=$1 fault=$2 t_launch
  t_launch=$(date +%s)
  DFLASH_FAULT=$fault "${cli[@]}" launch "${where[@]}" --config trainer/configs/tiny-cpu.toml \
    --set runtime.mode=processes --set runtime.wandb_mode=disabled --set train.max_steps=100000 \
    --set "runtime.targets=[\"${devs[0]}\", \"${devs[1]}\"]" \
    --set "runtime.drafters=[\"${devs[2]}\", \"${devs[3]}\"]" \
    --set train.compile_drafter=false > "$out/launch-$name.txt" 2>&1
  local rc=$?
  tail -c 2000 "$out/launch-$name.txt"
  if (( rc != 0 )); then echo "== $name: launch failed ($rc)" | tee -a "$out/summary.txt"; return; fi
  for _ in $(seq 150); do
    "${cli[@]}" status "${where[@]}" --json > "$out/status-$name.json" 2>/dev/null
    python3 - "$out/status-$name.json" <<'PY' && break
import json, sys
s = json.loads(open(sys.argv[1]).read().strip().splitlines()[-1])
ranks = [r["heartbeat"] for r in s["state"].get("ranks", []) if r["heartbeat"]]
ok = len(ranks) == 4 and all(b.get("stages_ms") and b["step"] >= 25 for b in ranks)
sys.exit(0 if ok else 1)
PY
    sleep 1
  done
  "${cli[@]}" status "${where[@]}" > "$out/status-$name.txt" 2>&1
  echo "== $name ($fault): $(( $(date +%s) - t_launch )) s after launch" | tee -a "$out/summary.txt"
  python3 - "$out/status-$name.json" <<'PY' | tee -a "$out/summary.txt"
import json, sys
s = json.loads(open(sys.argv[1]).read().strip().splitlines()[-1])
for r in s["state"].get("ranks", []):
    b = r["heartbeat"] or {}
    print(f"  rank {r['rank']} {b.get('role')} {b.get('device')} step {b.get('step')}"
          f" tok/s {b.get('tok_s', 0):.0f} {b.get('stages_ms')}")
for f in s["findings"]:
    if f["code"] in ("rank_straggler", "slow_link", "rank_silent", "rank_failed"):
        print(f"  FINDING {f['code']}: {f['title']} — {f['evidence']}")
PY
  "${cli[@]}" kill "${where[@]}" --timeout 60 2>&1 | tail -1
}

declare -A faults=(
  [healthy]="" [slow-drafter]="slow:drafter:0.05:rank=3"
  [slow-target]="slow:target:0.05:rank=1" [slow-link]="slow:link:0.1"
)
for name in $names; do scenario "$name" "${faults[$name]}"; done
echo "total $(( $(date +%s) - t0 )) s" | tee -a "$out/summary.txt"

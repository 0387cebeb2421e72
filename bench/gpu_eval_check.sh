#!/usr/bin/env bash
# Held-out eval during training on a GPU, in one short call: the tiny GPU config (compiled
# flex drafters, two target threads and two drafter replicas on cuda:0) with the eval thread
# every 50 steps, then the same steps' checkpoints through `python -m trainer eval` on the GPU.
# Prints each eval line, the recompiles after warm-up, the heartbeat's eval figures, and
# online vs offline τ per step.   bench/gpu_eval_check.sh OUT
set -uo pipefail
out="${1:?usage: bench/gpu_eval_check.sh OUT}"; mkdir -p "$out"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 DFLASH_CACHE_DIR=/tmp/evc
root=/tmp/evc-runs; rm -rf "$root"
t0=$(date +%s)
python3 -m trainer --config trainer/configs/tiny-gpu.toml --run-root "$root" --max-steps 300 \
  --set runtime.wandb_mode=disabled --set data.held_out=16 --set eval.every=50 \
  --set eval.prompts=4 --set eval.new_tokens=32 --set train.checkpoint_every=100 \
  > "$out/train.out" 2>&1
echo "trainer exit $? after $(( $(date +%s) - t0 ))s"
run=$(ls -d "$root"/*/ | head -1)
grep -E "eval:|warm-up|recompile|error" "$run/train.log" | cut -c1-200
cp "$run/train.log" "$out/" ; cp "$run/heartbeat.json" "$out/"
# The steps the thread evaluated that have a checkpoint (an eval due while one ran is skipped).
steps=$(cd "$run/eval" && for f in step-*.json; do s=$((10#${f:5:8})); [[ -f "$run/checkpoints/step-$(printf %08d $s).pt" ]] && echo $s; done)
for s in $steps; do cp "$run/eval/step-$(printf %08d $s).json" "$out/online-$s.json"; done
for s in $steps; do
  timeout 60 python3 -m trainer eval "$run" --step $s --prompts 4 --new-tokens 32 --device cuda:0 2>&1 | tail -1
done
python3 - "$run" "$out" $steps <<'PY'
import json, sys
run, out, steps = sys.argv[1], sys.argv[2], [int(s) for s in sys.argv[3:]]
hb = json.load(open(f"{run}/heartbeat.json"))
ev, comp = hb["eval"], hb["compile"]
print(f"recompiles after warm-up: {comp['recompiles']}; evals {[p['step'] for p in ev['history']]}"
      f" skipped {ev['skipped']} eval thread {ev['seconds']:.1f}s snapshot {ev['snapshot_s']*1e3:.1f}ms"
      f" error {ev['error']} memory {hb['memory']}")
for s in steps:
    on = json.load(open(f"{out}/online-{s}.json"))
    off = json.load(open(f"{run}/eval/step-{s:08d}.json"))
    print(f"step {s}: online tau {on['tau']} verify {on['verify_steps']} {on['seconds']}s | "
          f"offline tau {off['tau']} verify {off['verify_steps']}")
PY

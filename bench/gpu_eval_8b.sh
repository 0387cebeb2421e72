#!/usr/bin/env bash
# Held-out τ during training on the 8B config, through dflash-tui commands only, in one short
# device call: deploy, launch trainer/configs/qwen3-8b-h200.toml with the eval thread every
# 100 steps, wait for EVALS evals (2; or MAX_S after the first step), report, kill. Prints
# each eval record, the heartbeat's eval figures, and training tok/s in the 100-step windows
# with and without an eval running, so the eval's cost to training is read from one run.
#
#   bench/gpu_eval_8b.sh OUT        (on the GPU machine, repo root; .whl/ carried)
#   CONFIG=trainer/configs/demo-cpu.toml EVERY=25 bench/gpu_eval_8b.sh OUT  (any machine)
#   SETS="eval.stream_priority=low" bench/gpu_eval_8b.sh OUT  (more --set overrides)
set -uo pipefail
out="${1:?usage: bench/gpu_eval_8b.sh OUT}"; mkdir -p "$out"; out=$(cd "$out" && pwd)
work=/tmp/e8; rm -rf "$work/remote" "$work/status.json"; mkdir -p "$work"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 DFLASH_CACHE_DIR="$work/cache"
log="$out/summary.txt"; : > "$log"
t0=$(date +%s)
say() { echo "== $* ($(( $(date +%s) - t0 ))s)" | tee -a "$log"; }
if compgen -G ".whl/*.whl" >/dev/null; then  # a wheel is a zip: unpacking is pip's 12 s in 1
  mkdir -p /tmp/site && for w in .whl/*.whl; do python3 -m zipfile -e "$w" /tmp/site; done
  export PYTHONPATH="$PYTHONPATH:/tmp/site"
fi
python3 -c "import sys, torch, transformers; print('python', sys.version.split()[0], 'torch', torch.__version__, 'transformers', transformers.__version__, torch.cuda.get_device_name(0) if torch.cuda.is_available() else 'cpu')" 2>&1 | tee -a "$log"
cli=(python3 -m dflash_tui.cli); where=(local --remote-dir "$work/remote")
config=${CONFIG:-trainer/configs/qwen3-8b-h200.toml}; every=${EVERY:-100}; 
if [[ $config == *8b* && ! -d /tmp/qwen3-8b-random ]]; then
  say "build the 8B-shaped target (random weights)"
  python3 bench/make_bench_target.py /tmp/qwen3-8b-random 2>&1 | tail -1 | tee -a "$log"
fi
say deploy
"${cli[@]}" deploy "${where[@]}" 2>&1 | tail -1 | tee -a "$log"
say launch
extra=(); for kv in ${SETS:-}; do extra+=(--set "$kv"); done  # SETS="k=v …": more overrides
"${cli[@]}" launch "${where[@]}" --config "$config" --set eval.every="$every" "${extra[@]}" > "$work/launch.txt" 2>&1 \
  || { tail -5 "$work/launch.txt" | tee -a "$log"; exit 1; }
tail -1 "$work/launch.txt" | tee -a "$log"
run=$(ls -d "$work"/remote/runs/*/ | head -1)
max_s=${MAX_S:-150}; first=""
for _ in $(seq 1200); do
  "${cli[@]}" status "${where[@]}" --json > "$work/status.json" 2>/dev/null
  read -r p s <<< "$(python3 bench/e2e_report.py phase-step "$work/status.json")"
  [[ -z $first && $p == training ]] && { first=$(date +%s); say "first step"; }
  [[ $p == crashed || $p == finished || $p == stopped ]] && break
  # EVALS written (one due while another ran is skipped, so count them, not steps)
  [[ $(ls "$run"/eval/step-*.json 2>/dev/null | wc -l) -ge ${EVALS:-2} ]] && break
  [[ -n $first && $(( $(date +%s) - first )) -ge $max_s ]] && break
  sleep 1
done
say "stop: $p at step $s"
"${cli[@]}" status "${where[@]}" 2>&1 | tail -4 | tee -a "$log"
grep -E "eval" "$run/train.log" | grep -v "^wandb" | cut -c1-220 | tail -8 | tee -a "$log"
cp -r "$run/eval" "$out/" 2>/dev/null; cp "$run/heartbeat.json" "$run/metrics.jsonl" "$run/train.log" "$out/" 2>/dev/null
python3 - "$run" <<'PY' 2>&1 | tee -a "$log"
import glob, json, statistics, sys
run = sys.argv[1]
hb = json.load(open(f"{run}/heartbeat.json"))
ev = hb.get("eval") or {}
start = [v for v in hb.get("phase_history", []) if v["ended_at"]][:6]
print("start-up: " + ", ".join(f"{v['phase']} {v['ended_at'] - v['started_at']:.1f}s" for v in start
                               if v["phase"] != "training"))
print(f"heartbeat eval: steps {[p['step'] for p in ev.get('history', [])]} skipped {ev.get('skipped')} "
      f"thread {ev.get('seconds')}s snapshot {ev.get('snapshot_s')}s error {ev.get('error')}")
evals = [json.load(open(f)) for f in sorted(glob.glob(f"{run}/eval/step-*.json"))]
spans = []
for r in evals:
    print(f"eval step {r['step']}: held_out {r['held_out']} tau {r['tau']:.3f} of {r['block_size']} "
          f"{r['prompts']}x{r['new_tokens']} tokens, {r['seconds']:.1f}s, {r['tok_s']} tok/s, per_position {[round(x, 2) for x in r['per_position'][:4]]}")
    spans.append((r["at"] - r["seconds"], r["at"]))
rows = [json.loads(l) for l in open(f"{run}/metrics.jsonl") if l.strip()]
busy = lambda t: any(a <= t <= b for a, b in spans)
during = [r["tok_s"] for r in rows if r["step"] > 20 and busy(r["time"])]
outside = [r["tok_s"] for r in rows if r["step"] > 20 and not busy(r["time"])]
med = lambda xs: round(statistics.median(xs)) if xs else None
print(f"TABLE | tok/s outside evals (median of {len(outside)} rows) | {med(outside)} |")
print(f"TABLE | tok/s while an eval ran (median of {len(during)} rows) | {med(during)} |")
for r in evals:
    print(f"TABLE | eval at step {r['step']}: tau | {r['tau']:.3f} | seconds | {r['seconds']:.1f} |")
# The eval's cost in training time: each metrics row spans log_every steps; a row that
# overlapped an eval took longer than the rows around it by what the eval cost training.
# (Medians of tok/s across rows misread it: one slow row barely moves a median.)
late = [r for r in rows if r["step"] > 20]
spans_rows = [(b["time"] - a["time"], b) for a, b in zip(late, late[1:])]
hit = lambda a, b: any(s < b and e > a for s, e in spans)
plain = [d for d, b in spans_rows if not hit(b["time"] - d, b["time"])]
if plain and evals:
    base = statistics.median(plain)
    lost = sum(max(0.0, d - base) for d, b in spans_rows if hit(b["time"] - d, b["time"]))
    n = sum(1 for r in evals if r["at"] > late[0]["time"])
    out = med(outside) or 0
    per = lost / max(n, 1)
    secs = statistics.median(r["seconds"] for r in evals)
    print(f"TABLE | a row of {late[1]['step'] - late[0]['step']} steps without an eval | {base:.2f} s |")
    print(f"TABLE | training time lost per eval ({n} evals after step 20) | {per:.2f} s = {per * out:,.0f} tokens |")
    print(f"TABLE | bound: 3 % of the eval's median {secs:.1f} s x {out} tok/s | {0.03 * secs * out:,.0f} tokens |")
PY
say "kill (a graceful stop writes its checkpoint first)"
"${cli[@]}" kill "${where[@]}" 2>&1 | tail -1 | tee -a "$log"
say done

#!/usr/bin/env bash
# Real workloads on one H200, through dflash-tui as an operator runs them (deploy, launch,
# status, kill). Parts, each sized for one device call (10 min):
#   8b        the 8B config on the bundled realistic chat data (packed), then the same config
#             on full-length 4096-token documents (warm compile cache): tok/s of each after
#             the first minute of training, their ratio, the padding share
#   hybrid    the Qwen3.6-27B-shaped target's forward (a few layers of it, random weights, no
#             disk), with and without flash-linear-attention, packed and unpacked (a harness)
#   27b       the Qwen3.6-27B-shaped config through dflash-tui launch: tok/s (target.compile on:
#             its full-attention layers compiled, a Gated DeltaNet layer's norms, gates,
#             gated norm + out_proj and MLP compiled around fla's eager kernels)
#   27b-eager the same with target.compile = false
#   27b-fp8   the same with --set target.dtype=fp8 (the decoder linears in FP8, issue 31)
#   x2        two GPUs (nvidia-h200-x2): the 8B config on the realistic data with every role
#             on cuda:0, then 1 target GPU + 1 drafter GPU (threads mode), same seed: tok/s of
#             each, GPU roles, and the loss of each step both runs reached (issue 18)
#   modes     the 8B config with every role on cuda:0 in threads mode (the cold compile), then
#             in processes mode (runtime.mode = "processes": one process per role under
#             torchrun, gloo through host memory, as NCCL refuses a GPU twice): tok/s of each,
#             their ratio, GIL p99 of each process (bench/modes_report.py), and one
#             dump-stacks of the live processes-mode job (issue 17)
#   group     one processes-mode job over two "hosts" (two local targets, two run roots, one
#             group in config.toml) through `dflash-tui launch/status/dump-stacks/kill pair`,
#             each node 1 target + 1 drafter rank on cuda:0 (issue 17)
#   fp8       the target in FP8 (target.dtype = "fp8", issue 31) against bf16 on the 8B shape
#             (random weights, in memory): features' error per read layer, the packed
#             4096-token forward eager and compiled (bench/fp8_target.py, a harness)
#   fp8-checkpoint  the 8B bench target written in transformers' FP8 format (128x128 block
#             scales, bench/make_fp8_target.py) and read back by the trainer's loader:
#             the same figures from that checkpoint
#   8b-chat   the 8b part's chat-data launch alone (bf16)
#   8b-fp8    the 8B config through dflash-tui launch with --set target.dtype=fp8: tok/s
#             (beside the 8b part's bf16 figure: run it first, on the same machine)
#   fp8-tau   the held-out τ of a drafter trained on the demo's chat target (demo-cpu.toml on
#             cuda:0, FP8_TAU_STEPS steps, its bf16 target), decoded by the bf16 target and
#             by the FP8 one: `python -m trainer eval --set target.dtype=fp8` (issue 31)
#   packed-forward  gpu_bench's target sections: the 8B target's forward on one unpacked and
#             on packed rows of the bundled data, eager and compiled as launch compiles it
#   routing53 issue 33: the 8B config with 5 targets and 3 drafters on cuda:0, fixed routing
#             then shared (runtime.routing): tok/s, each thread's waits, the queues status shows
#   processes the 8B config in processes mode alone (1 target + 1 drafter rank on cuda:0),
#             through launch: tok/s against the 12.6K of 12-03 (issue 34)
#   tiny      this script's own check on any machine (the CPU demo config, packed and not)
# Usage (on the GPU machine, repo root): bench/gpu_workloads.sh OUT PART...
# Wheels the machine lacks (textual, asyncssh, fla) come from .whl/ (carried).
set -uo pipefail
out="${1:-/tmp/gpu_workloads}"; shift || true
parts="${*:-8b}"
mkdir -p "$out"
work=/tmp/workloads
mkdir -p "$work"
export PYTHONPATH="$PWD" PYTHONUNBUFFERED=1 DFLASH_CACHE_DIR="$work/cache"
export TORCHINDUCTOR_CACHE_DIR="$work/inductor" TRITON_CACHE_DIR="$work/triton"
log="$out/summary.txt"
say() { echo "== $* ($(( $(date +%s) - t0 ))s)" | tee -a "$log"; }
t0=$(date +%s)
if compgen -G ".whl/*.whl" >/dev/null; then
  python3 -m pip install -q --no-index --no-deps .whl/*.whl 2>&1 | grep -v "^WARNING" | tail -3
fi
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee -a "$log"
python3 -c "import sys, torch, transformers; print('python', sys.version.split()[0], 'torch', torch.__version__, 'transformers', transformers.__version__)" | tee -a "$log"
python3 -c "import fla; print('fla', fla.__version__)" 2>&1 | tail -1 | tee -a "$log"

remote="$work/remote"
cli=(python3 -m dflash_tui.cli)
where=(local --remote-dir "$remote")

# A launch, its first minute of training, and the kill: tok/s from metrics.jsonl rows logged
# after `settle` seconds of training (compile and warm-up excluded), medians.
launch_and_measure() {  # NAME CONFIG SETTLE_S MEASURE_S [--set k=v ...]
  local name=$1 config=$2 settle=$3 measure=$4; shift 4
  say "launch $name"
  local t_launch; t_launch=$(date +%s.%N)
  "${cli[@]}" launch "${where[@]}" --config "$config" --set runtime.wandb_mode=disabled "$@" 2>&1 | tail -3 | tee -a "$log"
  local status=starting
  for _ in $(seq 480); do
    "${cli[@]}" status "${where[@]}" --json > "$work/status.json" 2>/dev/null
    status=$(python3 bench/snapshot_phase.py "$work/status.json")
    [[ $status == training || $status == crashed || $status == finished ]] && break
    sleep 1
  done
  echo "$name: launch -> $status $(python3 -c "print(round($(date +%s.%N)-$t_launch, 1))") s" | tee -a "$log"
  sleep "$settle"
  local t_start; t_start=$(date +%s)
  sleep "$measure"
  "${cli[@]}" status "${where[@]}" --json > "$out/status-$name.json" 2>/dev/null
  "${cli[@]}" status "${where[@]}" > "$out/status-$name.txt" 2>&1
  tail -2 "$out/status-$name.txt" | tee -a "$log"
  gpu_memory "$name"
  local run_dir; run_dir=$(ls -td "$remote"/runs/*/ | head -1)
  echo "$run_dir" >> "$work/measured-runs.txt"
  if [[ -n ${DUMP_STACKS:-} ]]; then  # the live job's stacks, as an operator asks for them
    local t_dump; t_dump=$(date +%s.%N)
    "${cli[@]}" dump-stacks "${where[@]}" > "$out/stacks-$name.txt" 2> "$out/stacks-$name.err"
    echo "$name: dump-stacks rc=$? in $(python3 -c "print(round($(date +%s.%N)-$t_dump, 2))") s," \
      "$(grep -c '^Thread "' "$out/stacks-$name.txt") named threads" | tee -a "$log"
  fi
  python3 - "$run_dir" "$t_start" "$name" <<'EOF' | tee -a "$log"
import json, statistics, sys
run_dir, t_start, name = sys.argv[1], float(sys.argv[2]), sys.argv[3]
rows = [json.loads(l) for l in open(run_dir + "metrics.jsonl") if l.strip()]
late = [r for r in rows if r["time"] >= t_start]
hb = json.load(open(run_dir + "heartbeat.json"))
pad = (hb.get("data") or {}).get("padding")
if late:
    tok = statistics.median(r["tok_s"] for r in late)
    print(f"RESULT {name} tok_s={tok:.0f} rows={len(late)} padding={pad} step={hb['step']}")
else:
    print(f"RESULT {name} no metrics rows after the settle time (rows={len(rows)}, phase={hb['phase']})")
EOF
  grep -m1 "^data:" "$run_dir/train.log" | tee -a "$log"
  "${cli[@]}" kill "${where[@]}" --timeout "${KILL_TIMEOUT:-60}" 2>&1 | tail -1 | tee -a "$log"
  cp "$run_dir/train.log" "$out/train-$name.log" 2>/dev/null
  cp "$run_dir/config.json" "$out/config-$name.json" 2>/dev/null
  cp "$run_dir/metrics.jsonl" "$out/metrics-$name.jsonl" 2>/dev/null
}

# What the whole GPU holds now (every process of the run), and per process: processes mode's
# ranks each hold their own share.
gpu_memory() {  # NAME
  local used; used=$(nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits | head -1)
  echo "MEMORY $1 gpu_used_mib=$used per_process_mib=$(nvidia-smi --query-compute-apps=used_memory --format=csv,noheader,nounits | paste -sd+)" | tee -a "$log"
}

build_27b() {  # the Qwen3.6-27B-shaped target and a deployed release, once a machine
  [[ -d /tmp/qwen3.6-27b-random ]] && [[ -d $remote/current ]] && return
  say "build the Qwen3.6-27B-shaped target"
  rm -rf /tmp/qwen3-8b-random /tmp/qwen3-8b-fp8  # the disk holds one large target at a time
  [[ -d /tmp/qwen3.6-27b-random ]] || python3 bench/make_bench_target_qwen36.py /tmp/qwen3.6-27b-random 2>&1 | tail -2 | tee -a "$log"
  [[ -d $remote/current ]] || "${cli[@]}" deploy "${where[@]}" 2>&1 | tail -1 | tee -a "$log"
}

for part in $parts; do
  case $part in
    8b)
      say "build the 8B-shaped target"
      [[ -d /tmp/qwen3-8b-random ]] || python3 bench/make_bench_target.py /tmp/qwen3-8b-random 2>&1 | tail -1
      # Full-length documents: 120 synthetic conversations (~47 tokens each) run together
      # as text, 1,500 records each longer than the 4096 bucket (truncated to it and counted:
      # no row has padding, and an epoch outlasts the measurement).
      python3 - "$work/fulldocs.jsonl" <<'EOF'
import json, random, sys
from trainer.data.synthetic import conversation_text, generate_conversations
convs = [conversation_text(c) for c in generate_conversations(6000, seed=11)]
rng = random.Random(0)
with open(sys.argv[1], "w") as f:
    for _ in range(1500):
        f.write(json.dumps({"text": "\n".join(rng.sample(convs, 120))}) + "\n")
EOF
      say deploy
      "${cli[@]}" deploy "${where[@]}" 2>&1 | tail -1 | tee -a "$log"
      # Full documents first (the cold compile), then the chat data on a warm cache: the
      # same config, the same code path (packing on), in one session.
      launch_and_measure 8b-fulldocs trainer/configs/qwen3-8b-h200.toml 15 45 --set "data.path=$work/fulldocs.jsonl"
      launch_and_measure 8b-chat trainer/configs/qwen3-8b-h200.toml 15 45
      python3 - "$log" <<'EOF' | tee -a "$log"
import re, sys
r = dict(re.findall(r"RESULT (\S+) tok_s=(\d+)", open(sys.argv[1]).read()))
if "8b-chat" in r and "8b-fulldocs" in r:
    print(f"RATIO chat/fulldocs = {int(r['8b-chat']) / int(r['8b-fulldocs']):.3f}")
EOF
      ;;
    modes)
      # MODES_CONFIG, MODES_SETTLE, MODES_MEASURE: this part's own check on a CPU machine
      # (MODES_CONFIG=trainer/configs/tiny-cpu.toml MODES_SETTLE=3 MODES_MEASURE=10).
      config=${MODES_CONFIG:-trainer/configs/qwen3-8b-h200.toml}
      settle=${MODES_SETTLE:-15} measure=${MODES_MEASURE:-40}
      if [[ $config == *qwen3-8b* ]]; then
        say "build the 8B-shaped target"
        [[ -d /tmp/qwen3-8b-random ]] || python3 bench/make_bench_target.py /tmp/qwen3-8b-random 2>&1 | tail -1
      fi
      say deploy
      "${cli[@]}" deploy "${where[@]}" 2>&1 | tail -1 | tee -a "$log"
      : > "$work/measured-runs.txt"
      launch_and_measure threads "$config" "$settle" "$measure"
      DUMP_STACKS=1 launch_and_measure processes "$config" "$settle" "$measure" --set runtime.mode=processes
      # shellcheck disable=SC2046
      python3 bench/modes_report.py --settle "$settle" $(cat "$work/measured-runs.txt") | tee "$out/modes.jsonl" | tee -a "$log"
      python3 - "$out/modes.jsonl" <<'EOF' | tee -a "$log"
import json, sys
rows = {r.get("mode"): r for r in map(json.loads, open(sys.argv[1]))}
t, p = rows.get("threads", {}), rows.get("processes", {})
if t.get("tok_s") and p.get("tok_s"):
    print(f"RATIO processes/threads = {p['tok_s'] / t['tok_s']:.3f} ({p['tok_s']:.0f} / {t['tok_s']:.0f} tok/s)")
EOF
      ;;
    routing53)
      say "build the 8B-shaped target"
      [[ -d /tmp/qwen3-8b-random ]] || python3 bench/make_bench_target.py /tmp/qwen3-8b-random 2>&1 | tail -1
      [[ -d $remote/current ]] || "${cli[@]}" deploy "${where[@]}" 2>&1 | tail -1 | tee -a "$log"
      lay=(--set 'runtime.targets=["cuda:0","cuda:0","cuda:0","cuda:0","cuda:0"]'
           --set 'runtime.drafters=["cuda:0","cuda:0","cuda:0"]')
      for routing in fixed shared; do
        launch_and_measure "53-$routing" trainer/configs/qwen3-8b-h200.toml "${SETTLE:-10}" \
          "${MEASURE:-30}" "${lay[@]}" --set "runtime.routing=$routing" ${R53_SET:+--set "$R53_SET"}
        python3 - "$out/status-53-$routing.json" <<'EOF' | tee -a "$log"
import json, sys
s = json.load(open(sys.argv[1]))["state"]
print("queues", json.dumps(s.get("queues")))
for t in s.get("stages") or []:
    waits = {x["stage"]: round(x["ms"], 1) for x in t["stages"] if x["wait"]}
    print(f"  {t['thread']}: period {t['period_ms']:.0f} ms, waits {waits}")
EOF
      done ;;
    processes)
      [[ -d /tmp/qwen3-8b-random ]] || python3 bench/make_bench_target.py /tmp/qwen3-8b-random 2>&1 | tail -1
      [[ -d $remote/current ]] || "${cli[@]}" deploy "${where[@]}" 2>&1 | tail -1 | tee -a "$log"
      launch_and_measure processes trainer/configs/qwen3-8b-h200.toml "${SETTLE:-10}" \
        "${MEASURE:-30}" --set runtime.mode=processes ;;
    hybrid)
      say "hybrid target forward, with and without fla"
      for fla in with without; do
        python3 bench/hybrid_forward.py --fla "$fla" 2>&1 | grep -v Warning | tee -a "$log"
      done ;;
    27b)
      build_27b
      launch_and_measure 27b trainer/configs/qwen3.6-27b-h200.toml "${SETTLE:-15}" "${MEASURE:-45}" ;;
    27b-eager)
      build_27b
      launch_and_measure 27b-eager trainer/configs/qwen3.6-27b-h200.toml "${SETTLE:-15}" \
        "${MEASURE:-45}" --set target.compile=false ;;
    27b-fp8)  # the 27b part with the target's decoder linears in FP8 (issue 31)
      build_27b
      launch_and_measure 27b-fp8 trainer/configs/qwen3.6-27b-h200.toml "${SETTLE:-15}" \
        "${MEASURE:-45}" --set target.dtype=fp8
      grep -m1 "target FP8:" "$out/train-27b-fp8.log" | tee -a "$log" ;;
    x2)
      [[ -d /tmp/qwen3-8b-random ]] || python3 bench/make_bench_target.py /tmp/qwen3-8b-random 2>&1 | tail -1
      [[ -d $remote/current ]] || "${cli[@]}" deploy "${where[@]}" 2>&1 | tail -1 | tee -a "$log"
      launch_and_measure 8b-1gpu trainer/configs/qwen3-8b-h200.toml 15 45
      # GPU1_FREE: a flag file another job on cuda:1 touches when it is done with it.
      while [[ -n ${GPU1_FREE:-} && ! -e $GPU1_FREE ]]; do sleep 1; done
      launch_and_measure 8b-1t1d trainer/configs/qwen3-8b-h200.toml 15 45 \
        --set 'runtime.targets=["cuda:0"]' --set 'runtime.drafters=["cuda:1"]'
      python3 - "$out" <<'EOF2' | tee -a "$log"
import json, sys
runs = {}
for name in ("8b-1gpu", "8b-1t1d"):
    try:
        rows = [json.loads(x) for x in open(f"{sys.argv[1]}/metrics-{name}.jsonl") if x.strip()]
    except OSError:
        rows = []
    runs[name] = {r["step"]: r["loss"] for r in rows}
common = sorted(set(runs["8b-1gpu"]) & set(runs["8b-1t1d"]))
if common:
    diffs = [abs(runs["8b-1gpu"][s] - runs["8b-1t1d"][s]) for s in common]
    print(f"LOSS same seed: {len(common)} common logged steps up to {common[-1]};"
          f" max |diff| {max(diffs):.4f}, at the last step {diffs[-1]:.4f}"
          f" ({runs['8b-1gpu'][common[-1]]:.4f} vs {runs['8b-1t1d'][common[-1]]:.4f})")
else:
    print("LOSS: no common logged steps")
EOF2
      ;;
    group)
      # One job over two "hosts" through `dflash-tui launch GROUP`: two local targets with
      # their own remote dirs (two agents, two run roots), node 0 and node 1 of a
      # processes-mode job, each node 1 target + 1 drafter rank on cuda:0 (4 ranks, gloo:
      # they share the GPU), the rendezvous on 127.0.0.1. GROUP_CONFIG: this part's own
      # check on a CPU machine (trainer/configs/tiny-cpu.toml).
      config=${GROUP_CONFIG:-trainer/configs/qwen3-8b-h200.toml}
      settle=${MODES_SETTLE:-15} measure=${MODES_MEASURE:-40}
      if [[ $config == *qwen3-8b* ]]; then
        [[ -d /tmp/qwen3-8b-random ]] || python3 bench/make_bench_target.py /tmp/qwen3-8b-random 2>&1 | tail -1
        per_node=(--set 'runtime.targets=["cuda:0"]' --set 'runtime.drafters=["cuda:0"]')
      else
        per_node=(--set 'runtime.targets=["cpu"]' --set 'runtime.drafters=["cpu"]')
      fi
      export XDG_CONFIG_HOME="$work/xdg"
      mkdir -p "$XDG_CONFIG_HOME/dflash-tui"
      port=$(python3 -c "import socket; s=socket.socket(); s.bind(('127.0.0.1', 0)); print(s.getsockname()[1])")
      printf '[targets.host-a]\ntarget = "local"\nremote_dir = "%s"\n\n[targets.host-b]\ntarget = "local"\nremote_dir = "%s"\n\n[groups.pair]\nhosts = ["host-a", "host-b"]\nmaster = "127.0.0.1:%s"\n' \
        "$work/host-a" "$work/host-b" "$port" > "$XDG_CONFIG_HOME/dflash-tui/config.toml"
      for h in host-a host-b; do "${cli[@]}" deploy "$h" 2>&1 | tail -1 | tee -a "$log"; done
      say "launch pair"
      t_launch=$(date +%s.%N)
      "${cli[@]}" launch pair --config "$config" --set runtime.mode=processes \
        --set runtime.wandb_mode=disabled "${per_node[@]}" 2>&1 | tail -4 | tee -a "$log"
      status=starting
      for _ in $(seq 480); do
        "${cli[@]}" status host-a --json > "$work/status.json" 2>/dev/null
        status=$(python3 bench/snapshot_phase.py "$work/status.json")
        [[ $status == training || $status == crashed || $status == finished ]] && break
        sleep 1
      done
      echo "group: launch -> $status $(python3 -c "print(round($(date +%s.%N)-$t_launch, 1))") s" | tee -a "$log"
      sleep "$settle"
      t_start=$(date +%s)
      sleep "$measure"
      "${cli[@]}" status pair --json > "$out/status-group.json" 2>/dev/null
      "${cli[@]}" status pair 2>&1 | tail -12 | tee -a "$log"
      gpu_memory group
      t_dump=$(date +%s.%N)
      "${cli[@]}" dump-stacks pair > "$out/stacks-group.txt" 2> "$out/stacks-group.err"
      echo "group: dump-stacks rc=$? in $(python3 -c "print(round($(date +%s.%N)-$t_dump, 2))") s," \
        "$(grep -c '^## rank' "$out/stacks-group.txt") rank sections" | tee -a "$log"
      run_a=$(ls -td "$work"/host-a/runs/*/ | head -1); run_b=$(ls -td "$work"/host-b/runs/*/ | head -1)
      python3 bench/group_report.py "$run_a" "$run_b" "$t_start" | tee -a "$log"
      "${cli[@]}" kill pair --timeout 60 2>&1 | tail -3 | tee -a "$log"
      sleep 2
      echo "group: after kill, GPU processes: $(nvidia-smi --query-compute-apps=pid --format=csv,noheader | wc -l)" | tee -a "$log"
      cp "$run_a/train.log" "$out/train-group-node0.log" 2>/dev/null
      cp "$run_b/train.log" "$out/train-group-node1.log" 2>/dev/null
      unset XDG_CONFIG_HOME ;;
    fp8)
      say "FP8 target forward against bf16, the 8B shape"
      python3 bench/fp8_target.py --out "$out/fp8-forward.json" 2>&1 | grep -v Warning | tee -a "$log" ;;
    fp8-checkpoint)
      [[ -d /tmp/qwen3-8b-random ]] || python3 bench/make_bench_target.py /tmp/qwen3-8b-random 2>&1 | tail -1
      say "write the 8B bench target in transformers' FP8 format"
      [[ -d /tmp/qwen3-8b-fp8 ]] || python3 bench/make_fp8_target.py /tmp/qwen3-8b-random /tmp/qwen3-8b-fp8 2>&1 | tail -1 | tee -a "$log"
      python3 bench/fp8_target.py --target /tmp/qwen3-8b-fp8 --no-compile \
        --out "$out/fp8-checkpoint.json" 2>&1 | grep -v Warning | tee -a "$log" ;;
    8b-chat)  # the 8b part's chat-data launch alone: bf16, beside 8b-fp8 in one call
      [[ -d /tmp/qwen3-8b-random ]] || python3 bench/make_bench_target.py /tmp/qwen3-8b-random 2>&1 | tail -1
      [[ -d $remote/current ]] || "${cli[@]}" deploy "${where[@]}" 2>&1 | tail -1 | tee -a "$log"
      launch_and_measure 8b-chat trainer/configs/qwen3-8b-h200.toml "${SETTLE:-15}" "${MEASURE:-45}" ;;
    8b-fp8)
      [[ -d /tmp/qwen3-8b-random ]] || python3 bench/make_bench_target.py /tmp/qwen3-8b-random 2>&1 | tail -1
      [[ -d $remote/current ]] || "${cli[@]}" deploy "${where[@]}" 2>&1 | tail -1 | tee -a "$log"
      # The FP8 layers are new graphs for the compile cache: a cold compile, as the 8b part's first.
      launch_and_measure 8b-fp8 trainer/configs/qwen3-8b-h200.toml "${SETTLE:-15}" "${MEASURE:-45}" \
        --set target.dtype=fp8
      grep -m1 "target FP8:" "$out/train-8b-fp8.log" | tee -a "$log" ;;
    fp8-tau)
      say "train the demo config on the chat target, on the GPU"
      rm -rf "$work/tau-runs"
      python3 -m trainer --config trainer/configs/demo-cpu.toml --run-root "$work/tau-runs" \
        --max-steps "${FP8_TAU_STEPS:-150}" --set runtime.wandb_mode=disabled \
        --set 'runtime.targets=["cuda:0"]' --set 'runtime.drafters=["cuda:0"]' \
        --set eval.every=0 > "$work/tau-train.txt" 2>&1 || tail -5 "$work/tau-train.txt" | tee -a "$log"
      tau_run=$(ls -d "$work"/tau-runs/*/ | head -1)
      grep -E "^step|loss" "$tau_run/train.log" | grep -v wandb | tail -2 | tee -a "$log"
      for how in bf16 fp8; do
        set_args=(); [[ $how == fp8 ]] && set_args=(--set target.dtype=fp8)
        echo "TAU $how $(python3 -m trainer eval "$tau_run" --device cuda:0 --prompts 32 \
          --new-tokens 64 --tree-nodes 0 "${set_args[@]}" 2>&1 | tail -1)" | tee -a "$log"
      done
      cp -r "$tau_run/eval" "$out/tau-eval" 2>/dev/null ;;
    packed-forward)
      python3 bench/gpu_bench.py --only target_packed --out "$out/packed-forward.json" 2>&1 \
        | grep -v Warning | tee -a "$log" ;;
    tiny)  # the script's own check, on any machine: the CPU demo config, packed vs not
      [[ -d $remote/current ]] || "${cli[@]}" deploy "${where[@]}" 2>&1 | tail -1 | tee -a "$log"
      launch_and_measure tiny-packed trainer/configs/tiny-cpu.toml 5 20
      launch_and_measure tiny-padded trainer/configs/tiny-cpu.toml 5 20 --set data.packing=false ;;
    *) echo "unknown part: $part (8b, 8b-chat, hybrid, 27b, 27b-eager, 27b-fp8, x2, modes, group, fp8, fp8-checkpoint, 8b-fp8, fp8-tau, packed-forward, tiny)" >&2; exit 2 ;;
  esac
done
say "done"
grep -E "^RESULT|^RATIO|^MEMORY|launch ->|^HYBRID|^FP8|^TAU|target FP8:|dump-stacks rc" "$log"

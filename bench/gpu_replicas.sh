#!/usr/bin/env bash
# processes mode's DDP replicas on a GPU (trainer/distributed/replica_sync.py): the tiny GPU
# config with every role on cuda:0 (4 ranks on one GPU take gloo, the gradients CUDA tensors),
# fp32 and bf16 reduce, against threads mode's 2 replicas: same batches, the losses side by side.
# Usage (on the GPU machine): bench/gpu_replicas.sh OUTDIR [STEPS]
set -uo pipefail
out="${1:-/tmp/gpu_replicas}"
steps="${2:-40}"
mkdir -p "$out"
export DFLASH_CACHE_DIR="$out/cache" PYTHONUNBUFFERED=1
python3 -c "import torch; print('torch', torch.__version__, torch.cuda.get_device_name(0))"
common=(--config trainer/configs/tiny-gpu.toml --max-steps "$steps" --set train.log_every=1
        --set runtime.wandb_mode=disabled --set train.compile_drafter=false)
timeout 400 python3 -m trainer "${common[@]}" --run-root "$out/threads" > "$out/threads.log" 2>&1
echo "threads: exit $?"
for dtype in fp32 bf16; do
  timeout 400 python3 -m torch.distributed.run --standalone --nproc-per-node 4 -m trainer \
      "${common[@]}" --set runtime.mode=processes --set "runtime.grad_reduce_dtype=$dtype" \
      --run-root "$out/$dtype" > "$out/$dtype.log" 2>&1
  echo "processes $dtype: exit $?"
done
python3 - "$out" <<'PY'
import glob, json, sys
def rows(kind):
    (path,) = glob.glob(f"{sys.argv[1]}/{kind}/*/metrics.jsonl")
    return [json.loads(ln) for ln in open(path) if ln.strip()]
t, f, b = rows("threads"), rows("fp32"), rows("bf16")
rel = lambda xs, ys: max(abs(x["loss"] - y["loss"]) / abs(y["loss"]) for x, y in zip(xs, ys))
print(f"steps {len(t)} {len(f)} {len(b)}; loss first/last: threads {t[0]['loss']:.4f}/{t[-1]['loss']:.4f}"
      f" fp32 {f[0]['loss']:.4f}/{f[-1]['loss']:.4f} bf16 {b[0]['loss']:.4f}/{b[-1]['loss']:.4f}")
print(f"max rel loss diff: fp32 vs threads {rel(f, t):.2e}; bf16 vs fp32 {rel(b, f):.2e}")
print(f"tokens equal: {[r['tokens'] for r in f] == [r['tokens'] for r in t]}")
for k, r in (("threads", t), ("fp32", f), ("bf16", b)):
    print(k, "tok/s last row", round(r[-1]["tok_s"]), "stages", json.dumps(r[-1]["stages_ms"])[:400])
PY

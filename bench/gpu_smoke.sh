#!/usr/bin/env bash
# The CUDA path of the trainer on one GPU: flex vs SDPA (fwd+bwd), then the tiny config
# twice (cold, then warm compile cache), with the heartbeat's verdict printed last.
# Usage (on the GPU machine): bench/gpu_smoke.sh OUTDIR
set -uo pipefail
out="${1:-/tmp/gpu_smoke}"
mkdir -p "$out"
export DFLASH_CACHE_DIR="$out/cache" PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)"
python3 -m pytest -q -p no:cacheprovider tests/trainer/test_gpu.py tests/trainer/test_attention.py tests/trainer/test_drafter.py 2>&1 | tail -5
for pass in cold warm; do
  start=$(date +%s.%N)
  timeout 300 python3 -m trainer --config trainer/configs/tiny-gpu.toml --run-root "$out/runs-$pass" \
      --max-steps 400 > "$out/$pass.log" 2>&1
  echo "$pass: exit $? after $(python3 -c "print(round($(date +%s.%N)-$start,1))")s"
  tail -3 "$out/$pass.log"
done
python3 - "$out" <<'PY'
import glob, json, sys
for p in ("cold", "warm"):
    (d,) = glob.glob(f"{sys.argv[1]}/runs-{p}/*/")
    hb = json.load(open(d + "heartbeat.json"))
    h = hb["phase_history"]
    first = next(x["started_at"] for x in h if x["phase"] == "training")
    print(f"{p}: phase={hb['phase']} step={hb['step']} recompiles={hb['compile']['recompiles']} "
          f"graphs={hb['compile']['graphs']} warmup_s={hb['compile']['warmup_s']:.1f} "
          f"start_to_first_step_s={first - hb['started_at']:.1f} tok_s={hb['tok_s']:.0f} "
          f"error={hb['error'] and hb['error']['message']}")
PY

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
    *) echo "unknown part: $part" >&2; exit 2 ;;
  esac
done
say done

"""Merge one GPU session's parts into results.json, and print the required keys.

    python3 bench/merge_results.py BENCH_RESULTS.json --restart DIR [--keep OLD.json] --out OUT

BENCH_RESULTS.json comes from `gpu_bench.py`; DIR holds `restart-cold.json` and
`restart-warm.json` from `restart_bench.py` (the last line of each is its JSON). With
--keep, keys that this session did not measure (the attention section, say) are carried
over from an earlier results file, and listed under "carried_over".
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

REQUIRED = (
    "drafter_mfu",
    "flex_speedup_16k",
    "pipeline_efficiency",
    "recompiles_after_warmup",
    "host_syncs_per_step",
    "first_step_s_warm",
    "device",
    "torch",
)


def last_json_line(path: Path) -> dict | None:
    try:
        lines = path.read_text().strip().splitlines()
        return json.loads(lines[-1]) if lines else None
    except (OSError, ValueError):
        return None


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("bench", type=Path)
    p.add_argument("--restart", type=Path, required=True)
    p.add_argument("--keep", type=Path)
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args()
    results = json.loads(args.bench.read_text())
    for name in ("cold", "warm"):
        restart = last_json_line(args.restart / f"restart-{name}.json")
        if restart is None or "first_step_s" not in restart:
            print(f"{args.restart}/restart-{name}.json: no restart figure", file=sys.stderr)
            results[f"first_step_s_{name}"] = None
            continue
        results[f"first_step_s_{name}"] = restart["first_step_s"]
        results[f"first_step_phases_{name}"] = restart["phases"]
        results[f"first_step_compile_{name}"] = restart.get("compile")
    if args.keep:
        old = json.loads(args.keep.read_text())
        carried = sorted(k for k in old if k not in results and k not in ("sources",))
        results.update({k: old[k] for k in carried})
        results["carried_over"] = {"from": str(args.keep), "keys": carried}
    tmp = args.out.with_suffix(".tmp")
    tmp.write_text(json.dumps(results, indent=1, default=str) + "\n")
    tmp.replace(args.out)  # atomic: a failed merge never leaves half a results file
    print(json.dumps({k: results.get(k) for k in REQUIRED}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

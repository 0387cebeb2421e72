"""A job over two hosts, from its two run dirs (bench/gpu_workloads.sh's `group` part).

python3 bench/group_report.py NODE0_RUN_DIR NODE1_RUN_DIR T_START

Prints one RESULT line: tok/s from node 0's metrics rows logged after T_START (real tokens
between the first and the last of them), whether both hosts' run dirs have the job's run id,
and which rank heartbeats each holds.
"""

from __future__ import annotations

import json
import os
import sys


def main(node0: str, node1: str, t_start: float) -> str:
    with open(os.path.join(node0, "metrics.jsonl")) as f:
        rows = [json.loads(line) for line in f if line.strip()]
    late = [r for r in rows if r["time"] >= t_start]
    same = os.path.basename(node0.rstrip("/")) == os.path.basename(node1.rstrip("/"))
    ranks = {
        f"node{i}": sorted(n for n in os.listdir(d) if n.startswith("heartbeat-rank"))
        for i, d in enumerate((node0, node1))
    }
    if len(late) < 2:
        return f"RESULT group no metrics rows after the settle ({len(rows)}) same_run_id={same}"
    tok_s = (late[-1]["tokens"] - late[0]["tokens"]) / (late[-1]["time"] - late[0]["time"])
    return f"RESULT group tok_s={tok_s:.0f} rows={len(late)} same_run_id={same} ranks={ranks}"


if __name__ == "__main__":
    print(main(sys.argv[1], sys.argv[2], float(sys.argv[3])))

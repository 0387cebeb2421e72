"""The run's phase in a `dflash-tui status --json` output (its last snapshot line), or '?'.

python3 bench/snapshot_phase.py STATUS.json
"""

from __future__ import annotations

import json
import sys


def main(path: str) -> str:
    phase = "?"
    try:
        with open(path, encoding="utf-8") as f:
            lines = f.read().splitlines()
    except OSError:
        return phase
    for line in lines:
        try:
            obj = json.loads(line)
        except ValueError:
            continue
        if isinstance(obj, dict) and obj.get("kind") == "snapshot":
            phase = str((obj.get("state") or {}).get("phase") or "?")
    return phase


if __name__ == "__main__":
    print(main(sys.argv[1]))

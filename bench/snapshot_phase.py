"""The run's phase in a `dflash-tui status --json` output (its last snapshot line), or '?'.

python3 bench/snapshot_phase.py STATUS.json
"""

from __future__ import annotations

import sys

from e2e_report import phase_step  # bench/: the one reader of status snapshots


def main(path: str) -> str:
    return phase_step(path).split()[0]


if __name__ == "__main__":
    print(main(sys.argv[1]))

"""The trainer's code hash: what deploy ships and what a run runs, compared byte for byte.

sha256 over the package's *.py files: relative path and bytes, in path order. Deploy computes
it over what it ships (dflash_tui/control.py), the agent over what arrived, before anything
from the archive is imported or run (dflash_tui/agent/deploy.py), and the trainer over what
it runs (the heartbeat's `code_sha256`): equal hashes mean the running code is the deployed code.
"""

from __future__ import annotations

import hashlib
from pathlib import Path


def code_hash(package_dir: str | Path) -> str:
    root = Path(package_dir)
    h = hashlib.sha256()
    for path in sorted(p for p in root.rglob("*.py") if "__pycache__" not in p.parts):
        h.update(path.relative_to(root).as_posix().encode())
        h.update(b"\0")
        h.update(path.read_bytes())
        h.update(b"\0")
    return h.hexdigest()

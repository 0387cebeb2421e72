"""Run dirs: one new folder per launch under the run root, never reused."""

from __future__ import annotations

import re
import secrets
import time
from pathlib import Path

_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]+")


def new_run_id(name: str, now: float | None = None) -> str:
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(now))
    safe = _UNSAFE.sub("-", name).strip("-.") or "run"
    return f"{stamp}-{safe[:40]}-{secrets.token_hex(2)}"


def create_run_dir(run_root: Path, name: str) -> Path:
    """mkdir (not makedirs) of a fresh id: if it exists, another launch owns it; pick again."""
    run_root.mkdir(parents=True, exist_ok=True)
    for _ in range(100):
        path = run_root / new_run_id(name)
        try:
            path.mkdir()
        except FileExistsError:
            continue
        return path
    raise RuntimeError(f"could not create a fresh run dir under {run_root}")


def is_run_dir(path: Path) -> bool:
    return (path / "config.json").is_file()

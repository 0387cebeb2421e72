"""Run dirs: one new folder per launch under the run root, never reused."""

from __future__ import annotations

import re
import secrets
import time
from pathlib import Path

from trainer.config import ConfigError, show_path

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


def prepare_run_dir(run_root: Path, run_dir: Path | None, name: str) -> Path:
    """The run dir a launch writes: a fresh one under `run_root`, or `run_dir` as given
    (`--run-dir`), refused in one line when it already holds a run or cannot be made."""
    if run_dir is None:
        try:
            return create_run_dir(run_root, name)
        except OSError as e:
            why = e.strerror or str(e)
            raise ConfigError(f"--run-root {show_path(run_root)}: {why}") from None
    where = f"--run-dir {show_path(run_dir)}"
    if is_run_dir(run_dir):
        raise ConfigError(f"{where}: already holds a run (run dirs are never reused)")
    if run_dir.exists() and not run_dir.is_dir():
        raise ConfigError(f"{where}: exists and is not a directory")
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ConfigError(f"{where}: cannot create it ({e.strerror or e})") from None
    return run_dir

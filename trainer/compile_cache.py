"""Where a run's compile caches live: a stable folder outside the run dir, so a restart
reuses compiled kernels (Inductor's and Triton's caches, the compile history, the portable
artifacts). The agent's `clear-cache` removes the default one (dflash_tui/agent/commands.py
follows the same DFLASH_CACHE_DIR rule)."""

from __future__ import annotations

import os
from pathlib import Path

from trainer.config import Config, bad_value


def compile_cache_dir(cfg: Config) -> Path:
    if cfg.runtime.compile_cache_dir:
        return Path(cfg.runtime.compile_cache_dir).expanduser()
    from trainer.tiny_target import cache_dir

    return cache_dir() / "compile"


def configure_compile_cache(cache_dir: Path) -> None:
    """Inductor and Triton caches in a stable folder outside the run dir, so a restart
    reuses compiled kernels. Set before torch is imported."""
    try:
        cache_dir.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        rule = f"cannot create the folder ({e.strerror or e})"
        raise bad_value("runtime.compile_cache_dir", str(cache_dir), rule) from None
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(cache_dir / "inductor"))
    os.environ.setdefault("TRITON_CACHE_DIR", str(cache_dir / "triton"))

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
    from trainer.host_cache import cache_dir

    return cache_dir() / "compile"


def configure_compile_cache(cfg: Config) -> Path:
    """Inductor and Triton caches in a stable folder outside the run dir, so a restart
    reuses compiled kernels. Set before torch is imported.

    A `runtime.compile_cache_dir` in the config wins over TORCHINDUCTOR_CACHE_DIR and
    TRITON_CACHE_DIR inherited from the launching process: torch itself exports
    TORCHINDUCTOR_CACHE_DIR from any process that has compiled once, so a run launched by
    such a process silently used that process's cache and compile history instead of the one
    its config names. With no folder in the config, torch's own variables are honoured."""
    cache_dir = compile_cache_dir(cfg)
    try:
        cache_dir.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        rule = f"cannot create the folder ({e.strerror or e})"
        raise bad_value("runtime.compile_cache_dir", str(cache_dir), rule) from None
    folders = {
        "TORCHINDUCTOR_CACHE_DIR": cache_dir / "inductor",
        "TRITON_CACHE_DIR": cache_dir / "triton",
    }
    for var, folder in folders.items():
        if cfg.runtime.compile_cache_dir:
            os.environ[var] = str(folder)
        else:
            os.environ.setdefault(var, str(folder))
    return cache_dir

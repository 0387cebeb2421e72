"""Where a host keeps what it builds once and reuses: the builtin targets and datasets, the
tokenized data and the compile caches. `DFLASH_CACHE_DIR` wins, then `$XDG_CACHE_HOME`."""

from __future__ import annotations

import os
from pathlib import Path


def cache_dir() -> Path:
    if env := os.environ.get("DFLASH_CACHE_DIR"):
        return Path(env).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME") or "~/.cache"
    return Path(xdg).expanduser() / "dflash-tui"

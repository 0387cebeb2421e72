"""Which .safetensors files hold a target folder's weights (the index's, else every one)."""

from __future__ import annotations

import json
from pathlib import Path


def checkpoint_files(path: Path) -> list[Path]:
    index = path / "model.safetensors.index.json"
    if index.is_file():
        weight_map = json.loads(index.read_text())["weight_map"]
        return [path / name for name in dict.fromkeys(weight_map.values())]
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise ValueError(f"target {path}: no .safetensors weights in it")
    return files

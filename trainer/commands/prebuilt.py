"""`python -m trainer.commands.prebuilt [OUT]`: build the demo's target and answers with this
code into a fresh cache, then ship them into the checkout's `prebuilt/` (or OUT) with their
manifest (trainer/builtins/prebuilt.py says how they are used)."""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

from trainer.builtins.prebuilt import (
    ANSWERS,
    CHECKOUT_DIR,
    MANIFEST,
    REBUILD_ENV,
    TARGET,
    builder_hash,
    file_hash,
)


def write_prebuilt(cache_root: Path, out: Path) -> dict[str, Any]:
    """Copy a cache's freshly built target and answers into `out` with their manifest."""
    files = [
        *(p for p in sorted((cache_root / TARGET).iterdir()) if p.is_file()),
        cache_root / "datasets" / ANSWERS,
    ]
    manifest: dict[str, Any] = {"builder": builder_hash(), "files": {}}
    for p in files:
        name = p.relative_to(cache_root).as_posix().removeprefix("datasets/")
        (out / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(p, out / name)
        manifest["files"][name] = file_hash(p)
    (out / MANIFEST).write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n")
    return manifest


def main(argv: list[str] | None = None) -> int:
    """Build both with this code into a fresh cache, then ship them into prebuilt/."""
    argv = sys.argv[1:] if argv is None else argv
    out = Path(argv[0]) if argv else CHECKOUT_DIR
    with tempfile.TemporaryDirectory() as cache:
        os.environ["DFLASH_CACHE_DIR"] = cache
        os.environ[REBUILD_ENV] = "1"
        from trainer.builtins.resolve import resolve_data_path

        resolve_data_path("builtin:tiny-chat-answers")
        if out.exists():
            shutil.rmtree(out)
        manifest = write_prebuilt(Path(cache), out)
    print(f"prebuilt: {len(manifest['files'])} files into {out}, builder {manifest['builder']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The demo's target and data as this project's own builder made them, shipped in the
repository's `prebuilt/` folder: a fresh clone's first demo copies them into the host's cache
in a second instead of building them (~2.5 minutes on 2 cores: issue 32).

`prebuilt/manifest.json` holds the builder's hash (sha256 over `BUILDER_FILES`: the code and
prompts that build them) and each file's sha256. They are copied only when both hold: the code
that would build them here is the code that built them, and every file is what the manifest
says; else (a change to the builder, a damaged file, `DFLASH_REBUILD_BUILTINS=1`) the host
builds them as before. The folder is the checkout's (`prebuilt/` beside `trainer/`), or
`DFLASH_PREBUILT_DIR` (the demo sets it: its trainer runs from a deployed release).

    python -m trainer.commands.prebuilt     # rebuild them with this code into prebuilt/

Standard library only: the monitor names the folder for the demo without importing torch.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

PREBUILT_ENV = "DFLASH_PREBUILT_DIR"
REBUILD_ENV = "DFLASH_REBUILD_BUILTINS"
TRAINER_DIR = Path(__file__).resolve().parents[1]
CHECKOUT_DIR = TRAINER_DIR.parent / "prebuilt"
MANIFEST = "manifest.json"
# What decides the bytes built, relative to trainer/: the tiny Qwen3 and its tokenizer, its
# chat training, the chats' generator, the answering, and the prompts answered.
BUILDER_FILES = (
    "targets/tiny.py",
    "builtins/tiny_chat.py",
    "data/synthetic.py",
    "targets/answers.py",
    "datasets/synthetic-chat.jsonl",
)
TARGET = "tiny-qwen3-chat-v1"  # the cache folder names (targets/tiny.py, tiny_chat.py)
ANSWERS = "tiny-chat-answers-v1.jsonl"


def builder_hash(trainer_dir: Path = TRAINER_DIR) -> str:
    h = hashlib.sha256()
    for name in BUILDER_FILES:
        h.update(name.encode() + b"\0" + (trainer_dir / name).read_bytes() + b"\0")
    return h.hexdigest()


def file_hash(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def prebuilt_dir() -> Path:
    return Path(os.environ.get(PREBUILT_ENV) or CHECKOUT_DIR)


def usable_manifest(folder: Path | None = None) -> dict[str, Any] | None:
    """The manifest when the prebuilt files may be used: not asked to rebuild, built by this
    very builder. Each file's hash is checked as it is copied (`_copy`)."""
    if os.environ.get(REBUILD_ENV, "") not in ("", "0"):
        return None
    folder = folder or prebuilt_dir()
    try:
        manifest = json.loads((folder / MANIFEST).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(manifest, dict) or manifest.get("builder") != builder_hash():
        return None
    files = manifest.get("files")
    return manifest if isinstance(files, dict) else None


def _copy(folder: Path, manifest: dict[str, Any], name: str, dest: Path) -> bool:
    """prebuilt/NAME to `dest` (a temp name beside it, then renamed) if its hash is the
    manifest's."""
    src = folder / name
    want = manifest["files"].get(name)
    if not src.is_file() or file_hash(src) != want:
        return False
    dest.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=dest.parent, prefix=f".{dest.name}.")
    os.close(fd)
    shutil.copyfile(src, tmp)
    os.replace(tmp, dest)
    return True


def install_target(out_dir: Path) -> bool:
    """The prebuilt builtin:tiny-qwen3-chat into `out_dir` (the cache's folder for it, the
    caller holding its build lock), whole or not at all; True when it was."""
    folder = prebuilt_dir()
    manifest = usable_manifest(folder)
    if manifest is None:
        return False
    names = sorted(n for n in manifest["files"] if n.startswith(f"{TARGET}/"))
    if not names:
        return False
    staging = Path(tempfile.mkdtemp(dir=out_dir.parent, prefix=f".{out_dir.name}."))
    try:
        for name in names:
            if not _copy(folder, manifest, name, staging / name.removeprefix(f"{TARGET}/")):
                return False
        if out_dir.exists():  # a build cut short left a folder without config.json
            shutil.rmtree(out_dir)
        os.replace(staging, out_dir)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    print(f"target: builtin:tiny-qwen3-chat copied from {folder} (prebuilt)", flush=True)
    return True


def install_answers(out: Path, target_dir: Path) -> bool:
    """The prebuilt builtin:tiny-chat-answers to `out`, only when the cache's target is the
    prebuilt one (answers are of the target that wrote them); True when it was."""
    folder = prebuilt_dir()
    manifest = usable_manifest(folder)
    if manifest is None:
        return False
    weights = target_dir / "model.safetensors"
    if not weights.is_file() or file_hash(weights) != manifest["files"].get(
        f"{TARGET}/model.safetensors"
    ):
        return False
    if not _copy(folder, manifest, ANSWERS, out):
        return False
    print(f"data: builtin:tiny-chat-answers copied from {folder} (prebuilt)", flush=True)
    return True

"""`target.path` and `data.path` as local files. A `builtin:` name is built into the host's
cache on first use (trainer/host_cache.py), once however many trainers start at once;
anything else is a path, checked to be what it must be."""

from __future__ import annotations

import fcntl
from pathlib import Path

from trainer.builtins import prebuilt
from trainer.data.samples import BUILTIN_DATASETS, DATASETS_DIR, DataError
from trainer.host_cache import cache_dir
from trainer.targets.tiny import BUILTIN_TARGETS, TRAINED, build_tiny_target


def resolve_target_path(path: str) -> Path:
    """`target.path` → a local model folder, building a builtin target on first use."""
    if path.startswith("builtin:"):
        name = path.removeprefix("builtin:")
        if name not in BUILTIN_TARGETS:
            known = ", ".join(f"builtin:{k}" for k in BUILTIN_TARGETS)
            raise ValueError(f"target.path: unknown builtin {path!r} (known: {known})")
        cached, family = BUILTIN_TARGETS[name]
        out_dir = cache_dir() / cached
        if not (out_dir / "config.json").is_file():
            out_dir.parent.mkdir(parents=True, exist_ok=True)
            # One build however many trainers start at once (a trained one takes a minute).
            with open(out_dir.parent / f".{cached}.lock", "a") as lock:
                fcntl.flock(lock, fcntl.LOCK_EX)
                if not (out_dir / "config.json").is_file() and not (
                    cached == prebuilt.TARGET and prebuilt.install_target(out_dir)
                ):
                    # stdout: stderr is for errors (bad input is one line there)
                    print(f"target: building {path} into {out_dir} (once)", flush=True)
                    _build(out_dir, family)
        return out_dir
    folder = Path(path).expanduser()
    if not (folder / "config.json").is_file():
        raise ValueError(f"target.path: {str(folder)!r} is not a model folder with config.json")
    return folder


def _build(out_dir: Path, family: str) -> None:
    if family in TRAINED:
        from trainer.builtins.tiny_chat import train_chat  # imports torch's training path

        build_tiny_target(out_dir, family=family, train=train_chat)
    else:
        build_tiny_target(out_dir, family=family)


def resolve_data_path(path: str) -> Path:
    """`data.path` → a local JSONL file, generating a builtin dataset on first use."""
    if path.startswith("builtin:"):
        name = path.removeprefix("builtin:")
        if name not in BUILTIN_DATASETS:
            known = ", ".join(f"builtin:{k}" for k in BUILTIN_DATASETS)
            raise DataError(f"data.path: unknown builtin {path!r} (known: {known})")
        if name == "synthetic-sharegpt":
            from trainer.data.sharegpt import ensure_dataset

            resolved = ensure_dataset(cache_dir())
        elif name == "tiny-chat-answers":
            from trainer.builtins.tiny_chat import CHAT_TARGET, ensure_answers

            # The target first, its own progress said; then its answers: the prebuilt ones
            # where the target is the prebuilt one (builtins/prebuilt.py), else generated.
            target_dir = resolve_target_path(CHAT_TARGET)
            shipped = cache_dir() / "datasets" / prebuilt.ANSWERS
            if not shipped.is_file():
                prebuilt.install_answers(shipped, target_dir)
            resolved = ensure_answers(cache_dir(), target_dir)
        else:
            resolved = DATASETS_DIR / BUILTIN_DATASETS[name]
    else:
        resolved = Path(path).expanduser()
    if not resolved.is_file():
        raise DataError(f"data.path: {str(resolved)!r} is not a file")
    return resolved

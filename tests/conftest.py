"""Shared fixtures. The cache is redirected for the whole session so no test writes to ~/.cache."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerFast

# `.venv/bin/pytest` does not put the repo root on sys.path (the project is not installed), so
# `import trainer` would find nothing, or tests/trainer/ as a namespace package. Setting
# `pythonpath = ["."]` in pyproject's [tool.pytest.ini_options] would make this unnecessary.
ROOT = str(Path(__file__).resolve().parents[1])
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)


@pytest.fixture(scope="session", autouse=True)
def dflash_cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    path = tmp_path_factory.mktemp("dflash-cache")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("DFLASH_CACHE_DIR", str(path))
        yield path


@pytest.fixture(scope="session")
def tiny_target_dir(dflash_cache_dir: Path) -> Path:
    """The builtin tiny Qwen3 target, built once per session into the redirected cache."""
    from trainer.tiny_target import resolve_target_path

    return resolve_target_path("builtin:tiny-qwen3")


@pytest.fixture(scope="session")
def tiny_tokenizer() -> PreTrainedTokenizerFast:
    from trainer.tiny_target import build_tokenizer

    return build_tokenizer()

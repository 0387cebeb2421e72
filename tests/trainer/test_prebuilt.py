"""The demo's prebuilt target and answers (issue 32): shipped as the builder made them, used
only when the builder's code and every file's sha256 are the manifest's, else built as before.
The real resolve path into a fresh cache; no build here (minutes on 2 cores)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from trainer.builtins import prebuilt, tiny_chat
from trainer.builtins.resolve import resolve_data_path, resolve_target_path
from trainer.targets.tiny import BUILTIN_TARGETS

SHIPPED = prebuilt.CHECKOUT_DIR


def test_the_names_are_the_caches() -> None:
    assert BUILTIN_TARGETS["tiny-qwen3-chat"][0] == prebuilt.TARGET
    assert f"{tiny_chat.ANSWERS}.jsonl" == prebuilt.ANSWERS


def test_the_shipped_files_are_this_builders() -> None:
    """Fails when the code that builds them changed: run `python -m trainer.commands.prebuilt`
    (minutes) and commit prebuilt/, or the demo's first start builds them (~2.5 min)."""
    manifest = json.loads((SHIPPED / prebuilt.MANIFEST).read_text())
    assert manifest["builder"] == prebuilt.builder_hash(), "prebuilt/ is stale: rebuild it"
    for name, sha in manifest["files"].items():
        assert prebuilt.file_hash(SHIPPED / name) == sha, name
    total = sum((SHIPPED / n).stat().st_size for n in manifest["files"])
    assert total < 10 << 20  # a few MB in the repository, no more


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("DFLASH_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv(prebuilt.REBUILD_ENV, raising=False)
    monkeypatch.delenv(prebuilt.PREBUILT_ENV, raising=False)
    return tmp_path / "cache"


def test_a_fresh_cache_gets_the_shipped_files_through_resolve(cache: Path) -> None:
    answers = resolve_data_path("builtin:tiny-chat-answers")  # builds nothing: copies
    assert answers == cache / "datasets" / prebuilt.ANSWERS
    assert answers.read_bytes() == (SHIPPED / prebuilt.ANSWERS).read_bytes()
    target = resolve_target_path("builtin:tiny-qwen3-chat")
    for name in ("config.json", "model.safetensors", "tokenizer.json"):
        assert (target / name).read_bytes() == (SHIPPED / prebuilt.TARGET / name).read_bytes()


def shipped_copy(tmp_path: Path) -> Path:
    folder = tmp_path / "prebuilt"
    shutil.copytree(SHIPPED, folder)
    return folder


def test_another_builder_a_damaged_file_or_a_rebuild_asked_for_builds_instead(
    cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = shipped_copy(tmp_path)
    monkeypatch.setenv(prebuilt.PREBUILT_ENV, str(folder))
    out = cache / prebuilt.TARGET
    out.parent.mkdir(parents=True)

    monkeypatch.setenv(prebuilt.REBUILD_ENV, "1")
    assert not prebuilt.install_target(out)
    monkeypatch.delenv(prebuilt.REBUILD_ENV)

    weights = folder / prebuilt.TARGET / "model.safetensors"
    good = weights.read_bytes()
    weights.write_bytes(good[:-1] + bytes([good[-1] ^ 1]))  # one bit
    assert not prebuilt.install_target(out)
    assert list(cache.iterdir()) == []  # nothing half-copied left behind
    weights.write_bytes(good)

    manifest = json.loads((folder / prebuilt.MANIFEST).read_text())
    (folder / prebuilt.MANIFEST).write_text(json.dumps({**manifest, "builder": "0" * 64}))
    assert not prebuilt.install_target(out)
    (folder / prebuilt.MANIFEST).write_text(json.dumps(manifest))
    assert prebuilt.install_target(out) and (out / "config.json").is_file()


def test_answers_only_for_the_target_that_wrote_them(cache: Path, tmp_path: Path) -> None:
    mine = tmp_path / "built-here"
    mine.mkdir()
    (mine / "model.safetensors").write_bytes(b"weights of a target built on this host")
    out = cache / "datasets" / prebuilt.ANSWERS
    assert not prebuilt.install_answers(out, mine) and not out.exists()
    assert prebuilt.install_answers(out, SHIPPED / prebuilt.TARGET) and out.is_file()

"""The portable compile cache's load note counts what torch really loaded: a real Inductor
compile on the CPU, saved and loaded back through torch's own mega-cache API (the H200 run
said "loaded 0 entries" while its warm-up then hit the cache 8 times)."""

from __future__ import annotations

import torch

from trainer.runtime.compile.artifacts import describe_loaded


def test_the_note_counts_the_entries_torch_loaded(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    torch._dynamo.reset()
    torch.compiler.reset()

    def f(x):
        return (x.sin() * 2).sum()

    torch.compile(f, backend="inductor")(torch.randn(16))
    saved = torch.compiler.save_cache_artifacts()
    assert saved is not None
    blob, made = saved
    info = torch.compiler.load_cache_artifacts(blob)
    assert info is not None
    said = describe_loaded(info)
    total = sum(len(v) for v in made.artifacts.values())
    assert total > 0 and said.startswith(f"{total} entries ("), said
    assert "inductor" in said, said
    assert describe_loaded(None) == "no entries"

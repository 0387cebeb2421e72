"""CUDA-only checks (skipped without a GPU; run them on the lent H200)."""

from __future__ import annotations

import pytest
import torch

from trainer.model.attention import attend, make_block_mask, make_dense_mask

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


@cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_flex_and_sdpa_agree_forward_and_backward(dtype):
    g = torch.Generator(device="cuda").manual_seed(0)
    B, N, bs, ctx, Hq, Hkv, D = 2, 24, 16, 640, 8, 2, 64
    anchors = torch.randint(1, ctx - 1, (B, N), generator=g, device="cuda").sort(dim=1).values
    anchors[0, :3] = torch.tensor([1, 200, 201], device="cuda")
    keep = torch.ones(B, N, dtype=torch.bool, device="cuda")
    keep[1, -5:] = False
    anchors[1, -5:] = 0

    def inputs():
        q = torch.randn(B, Hq, N * bs, D, generator=g, device="cuda", dtype=dtype)
        k = torch.randn(B, Hkv, ctx + N * bs, D, generator=g, device="cuda", dtype=dtype)
        v = torch.randn(B, Hkv, ctx + N * bs, D, generator=g, device="cuda", dtype=dtype)
        return q, k, v

    q, k, v = inputs()
    grad = torch.randn(B, Hq, N * bs, D, generator=g, device="cuda", dtype=dtype)
    outs = {}
    for name, mask in (
        ("sdpa", make_dense_mask(anchors, keep, ctx, bs)),
        ("flex", make_block_mask(anchors, keep, ctx, bs)),
    ):
        qq, kk, vv = (t.detach().clone().requires_grad_() for t in (q, k, v))
        out = attend(qq, kk, vv, mask)
        out.backward(grad)
        outs[name] = (out, qq.grad, kk.grad, vv.grad)
    tol = {"rtol": 2e-2, "atol": 2e-2} if dtype == torch.bfloat16 else {"rtol": 1e-4, "atol": 1e-4}
    for a, b in zip(outs["flex"], outs["sdpa"], strict=True):
        assert not a.isnan().any()
        torch.testing.assert_close(a.float(), b.float(), **tol)


@cuda
def test_compiled_chunk_loss_equals_the_plain_loss_on_gpu():
    from trainer.model.loss import dflash_loss

    g = torch.Generator(device="cuda").manual_seed(1)
    V, H, bs = 32000, 256, 16
    hidden = torch.randn(1, 64 * bs, H, generator=g, device="cuda", requires_grad=True)
    W = (torch.randn(V, H, generator=g, device="cuda") * 0.05).to(torch.bfloat16)
    labels = torch.randint(0, V, (1, 64 * bs), generator=g, device="cuda")
    weights = torch.rand(1, 64 * bs, generator=g, device="cuda")
    out = dflash_loss(hidden, W, labels, weights, bs, 16, impl="fused")
    (g_fused,) = torch.autograd.grad(out.loss, hidden)
    logits = (hidden.to(torch.bfloat16) @ W.t()).float().view(-1, V)
    ce = torch.nn.functional.cross_entropy(logits, labels.view(-1), reduction="none")
    ref = (ce * weights.view(-1)).sum() / weights.sum()
    (g_ref,) = torch.autograd.grad(ref, hidden)
    torch.testing.assert_close(out.loss, ref, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(g_fused, g_ref, rtol=2e-2, atol=1e-4)


@cuda
def test_target_stream_trains_like_the_shared_stream(tmp_path):
    """The target on its own stream must hand over finished features: a missing wait or
    a reused buffer would show as a different loss curve from the one-stream run."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    curves = {}
    graphs: list[int] = []
    for flag in ("true", "false"):
        run_root = tmp_path / flag
        r = subprocess.run(
            [sys.executable, "-m", "trainer", "--config", "trainer/configs/tiny-gpu.toml",
             "--run-root", str(run_root), "--max-steps", "60",
             "--set", "train.log_every=20", "--set", "runtime.wandb_mode=disabled",
             "--set", f"runtime.target_stream={flag}"],
            cwd=root, capture_output=True, text=True, timeout=400,
        )  # fmt: skip
        (run_dir,) = [p for p in run_root.iterdir() if p.is_dir()]
        log = (run_dir / "train.log").read_text() if (run_dir / "train.log").exists() else ""
        assert r.returncode == 0, f"target_stream={flag}: {r.stderr[-2000:]}\n{log[-4000:]}"
        lines = (run_dir / "metrics.jsonl").read_text().splitlines()
        curves[flag] = [json.loads(ln)["loss"] for ln in lines]
        hb = json.loads((run_dir / "heartbeat.json").read_text())
        compile_stats = hb["compile"]
        # Warm-up compiled every graph the threads use: a recompile in training is a stall
        # (and, with a cold cache, several threads compiling at once).
        assert compile_stats["recompiles"] == 0, compile_stats
        # Compile progress counted every forward and backward compile, and the second run
        # expected as many from the cache's history.
        assert compile_stats["done"] > 0 and compile_stats["current"] is None, compile_stats
        graphs.append(compile_stats["done"])
        if len(graphs) == 2:
            assert compile_stats["expected"] == graphs[0], compile_stats
            assert compile_stats["last_cache"] in ("cold", "partial"), compile_stats
        # Every GPU thread timed its stages on its stream.
        stages = {t["name"]: t["stages_ms"] for t in hb["threads"]}
        assert stages["target-0"]["forward"] > 0 and stages["drafter-0"]["backward"] > 0, stages
    # The second run restarted on the first one's compile cache: nothing was generated.
    assert compile_stats["cache_misses"] == 0 < compile_stats["cache_hits"], compile_stats
    assert len(curves["true"]) == 3
    # Same batches, same order: only kernel-level nondeterminism (flex backward) differs.
    for a, b in zip(curves["true"], curves["false"], strict=True):
        assert abs(a - b) <= 0.02 * abs(b), curves


@cuda
def test_packed_hybrid_forward_with_fla_equals_each_document_alone(tiny_hybrid_target_dir):
    """fla's conv and delta rule, given the documents' cu_seqlens, restart at every
    document: the packed row's features equal each document's own forward (fp32)."""
    from trainer.targets.load import default_target_layer_ids, load_target, read_target_info
    from trainer.targets.packing import fla_available

    if not fla_available():
        pytest.skip("flash-linear-attention is not installed")
    info = read_target_info(tiny_hybrid_target_dir)
    ids_read = default_target_layer_ids(info.num_layers, 2)
    target = load_target(tiny_hybrid_target_dir, ids_read, torch.float32, torch.device("cuda"))
    lengths = [70, 5, 130, 51]
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 200, (1, sum(lengths)), generator=g).cuda()
    pos = torch.cat([torch.arange(n) for n in lengths])[None].cuda()
    packed = target.features(ids, pos)
    at = 0
    for n in lengths:
        alone = target.features(ids[:, at : at + n])
        torch.testing.assert_close(packed[:, at : at + n], alone, rtol=2e-3, atol=2e-3)
        at += n
    # Without the boundaries the later documents differ: the test can fail.
    assert not torch.allclose(target.features(ids)[:, 75:], packed[:, 75:], atol=1e-2)


@cuda
def test_packed_varlen_forward_equals_each_document_alone(tiny_target_dir):
    """torch's varlen flash kernel on a packed row (bf16, the documents' boundaries from the
    host's position_ids, as the pipeline builds them): each document's features equal its
    own unpacked forward, and the mask path's, to bf16 rounding. (The hybrid's plumbing is
    checked on the CPU with a reference kernel: test_target_packing.py.)"""
    from trainer.targets.load import default_target_layer_ids, load_target, read_target_info

    folder = tiny_target_dir
    info = read_target_info(folder)
    ids_read = default_target_layer_ids(info.num_layers, 2)
    dev = torch.device("cuda")
    target = load_target(folder, ids_read, torch.bfloat16, dev, packed_attention="varlen")
    masked = load_target(folder, ids_read, torch.bfloat16, dev, packed_attention="mask")
    f = target.features
    assert f.packed_attention == "varlen" and masked.features.packed_attention == "mask"
    lengths = [70, 5, 130, 51]
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 200, (1, sum(lengths)), generator=g)
    pos = torch.cat([torch.arange(n) for n in lengths])[None]
    packed = f(ids.cuda(), pos.cuda(), f.packed_docs(pos, dev)).float()

    def rel(a: torch.Tensor, b: torch.Tensor) -> float:
        return float((a - b).norm() / b.norm())

    # bf16 through 8 layers: ~1e-2 of the features' norm apart at most.
    assert rel(packed, masked.features(ids.cuda(), pos.cuda()).float()) < 2e-2
    at = 0
    for n in lengths:
        alone = f(ids[:, at : at + n].cuda()).float()
        assert rel(packed[:, at : at + n], alone) < 2e-2, n
        at += n
    # Without the boundaries the later documents differ: the test can fail.
    assert rel(f(ids.cuda()).float()[:, 80:], packed[:, 80:]) > 0.1


@cuda
def test_compiled_target_layers_give_the_eager_features(tiny_target_dir):
    """target.compile: the packed varlen forward through the compiled layers (one graph
    break around varlen) and the unpacked one give the eager layers' features (bf16)."""
    from trainer.targets.load import default_target_layer_ids, load_target, read_target_info

    info = read_target_info(tiny_target_dir)
    ids_read = default_target_layer_ids(info.num_layers, 2)
    dev = torch.device("cuda")
    f = load_target(tiny_target_dir, ids_read, torch.bfloat16, dev, "varlen").features
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 200, (1, 256), generator=g)
    pos = torch.cat([torch.arange(n) for n in (100, 156)])[None]
    eager_packed = f(ids.cuda(), pos.cuda(), f.packed_docs(pos, dev)).float()
    eager = f(ids.cuda()).float()
    f.compile_layers()
    assert f.compiled is not None and f.compiled[0] is not f.base.layers[0]
    packed = f(ids.cuda(), pos.cuda(), f.packed_docs(pos, dev)).float()
    plain = f(ids.cuda()).float()
    for got, want in ((packed, eager_packed), (plain, eager)):
        assert float((got - want).norm() / want.norm()) < 2e-2
    assert float((packed - plain).norm() / plain.norm()) > 0.05  # the documents matter


@cuda
def test_varlen_stays_a_graph_break_in_the_compiled_layers(tiny_target_dir):
    """compile_layers makes varlen attention eager inside the compiled layers (applied there,
    not at import): packed rows whose longest document differs reuse the layers' graphs,
    where a traced varlen would specialise on max_len and recompile."""
    from torch._dynamo.utils import counters

    from trainer.targets.load import default_target_layer_ids, load_target, read_target_info
    from trainer.targets.packing import PACKED_KERNELS, varlen_attention

    info = read_target_info(tiny_target_dir)
    dev = torch.device("cuda")
    ids_read = default_target_layer_ids(info.num_layers, 2)
    f = load_target(tiny_target_dir, ids_read, torch.bfloat16, dev, "varlen").features
    f.compile_layers()
    assert PACKED_KERNELS["varlen"] is not varlen_attention
    ids = torch.randint(0, 200, (1, 256), generator=torch.Generator().manual_seed(0)).cuda()
    graphs = []
    for lengths in ((100, 156), (50, 206), (30, 30, 196)):
        pos = torch.cat([torch.arange(n) for n in lengths])[None]
        f(ids, pos.cuda(), f.packed_docs(pos, dev))
        graphs.append(int(counters["stats"]["unique_graphs"]))
    assert graphs[0] > 0 and graphs[1:] == [graphs[0], graphs[0]], graphs


@cuda
def test_compiled_hybrid_target_gives_the_eager_features(tiny_hybrid_target_dir):
    """target.compile on a Qwen3.5 hybrid: its full-attention layers are compiled whole, a
    Gated DeltaNet layer's norms and MLP around fla's eager kernels on a packed row, and the
    features equal the eager ones (bf16), unpacked and packed."""
    from trainer.targets.load import default_target_layer_ids, load_target, read_target_info

    info = read_target_info(tiny_hybrid_target_dir)
    ids_read = default_target_layer_ids(info.num_layers, 2)
    dev = torch.device("cuda")
    f = load_target(tiny_hybrid_target_dir, ids_read, torch.bfloat16, dev, "varlen").features
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 200, (1, 256), generator=g).cuda()
    pos = torch.cat([torch.arange(n) for n in (100, 156)])[None]
    eager = f(ids).float()
    eager_packed = f(ids, pos.cuda(), f.packed_docs(pos, dev)).float()
    f.compile_layers()
    assert f.compiled is not None and f.hybrid_parts is not None
    kinds = {layer is f.base.layers[i] for i, layer in enumerate(f.compiled)}
    assert kinds == {True, False}  # some layers compiled, the linear ones not
    assert [p is not None for p in f.hybrid_parts] == f.linear  # their parts instead
    got = f(ids).float()
    packed = f(ids, pos.cuda(), f.packed_docs(pos, dev)).float()
    errors = [float((h - w).norm() / w.norm()) for h, w in ((got, eager), (packed, eager_packed))]
    assert max(errors) < 2e-2, errors
    # The documents matter: the second one's features, packed, are not the unpacked row's
    # (its first 100 tokens are the same either way), by more than compiling moves them.
    second = slice(100, 256)
    apart = float((packed[:, second] - got[:, second]).norm() / got[:, second].norm())
    assert apart > 2 * max(errors), (apart, errors)


@cuda
def test_artifacts_one_host_saved_warm_a_fresh_ones_first_compile(tmp_path):
    """A run saves its compile caches as one portable blob after the warm-up; a run on a
    fresh cache (a new container) given that blob, as deploy ships it, compiles nothing new."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]

    def run(name: str, **env: str) -> tuple[str, dict]:
        out = tmp_path / name
        r = subprocess.run(
            [sys.executable, "-m", "trainer", "--config", "trainer/configs/tiny-gpu.toml",
             "--run-root", str(out), "--max-steps", "5", "--set", "runtime.wandb_mode=disabled"],
            cwd=root, capture_output=True, text=True, timeout=400,
            env={**os.environ, **env},
        )  # fmt: skip
        (run_dir,) = [p for p in out.iterdir() if p.is_dir()]
        log = (run_dir / "train.log").read_text()
        assert r.returncode == 0, r.stderr[-2000:] + log[-3000:]
        return log, json.loads((run_dir / "heartbeat.json").read_text())["compile"]

    first_cache, fresh_cache = tmp_path / "host-a", tmp_path / "host-b"
    log, first = run("a", DFLASH_CACHE_DIR=str(first_cache))
    blobs = list((first_cache / "compile" / "artifacts").glob("*.bin"))
    assert len(blobs) == 1 and "portable artifacts" in log, log[-2000:]
    assert first["cache_misses"] > 0
    log, fresh = run(
        "b", DFLASH_CACHE_DIR=str(fresh_cache), DFLASH_COMPILE_ARTIFACTS=str(blobs[0].parent)
    )
    assert "shipped by deploy" in log and "entries" in log, log[-2000:]
    assert fresh["cache_misses"] == 0 < fresh["cache_hits"], (first, fresh)


def _decode_parts(tiny_target_dir):
    """The tiny Qwen3 in fp32 on the GPU, a drafter over it, prompts of different lengths."""
    from test_batched_decode import BS, PROMPTS, make_drafter
    from transformers import AutoModelForCausalLM

    from trainer.targets.load import default_target_layer_ids, read_target_info

    info = read_target_info(tiny_target_dir)
    model = AutoModelForCausalLM.from_pretrained(tiny_target_dir, dtype=torch.float32)
    model = model.cuda().eval()
    layer_ids = default_target_layer_ids(info.num_layers, 2)
    drafter = make_drafter(model, layer_ids, info).cuda()
    return model, layer_ids, drafter, PROMPTS, BS


@cuda
def test_the_batched_step_replayed_as_a_cuda_graph_decodes_as_the_reference(tiny_target_dir):
    """Captured on the eval's own stream while another thread allocates and waits on the GPU
    (as training's threads do): thread-local capture holds; the replays decode what the
    per-prompt loop decodes, token for token, run after run."""
    import threading

    from trainer.contract.graphs import GraphInfo
    from trainer.evaluation.batched import BatchedDecoder, DrafterBlocks
    from trainer.evaluation.graphs import GraphedStep
    from trainer.evaluation.speculative import drafter_proposer, speculative_decode

    model, layer_ids, drafter, prompts, bs = _decode_parts(tiny_target_dir)
    new = 30
    ref = [speculative_decode(model, layer_ids, drafter_proposer(drafter), p, new, bs)
           for p in prompts]  # fmt: skip
    info = GraphInfo(enabled=True)
    decoder = BatchedDecoder(
        model, layer_ids, DrafterBlocks(drafter), prompts, new, bs,
        graph=GraphedStep(torch.device("cuda"), info),
    )  # fmt: skip
    stop = threading.Event()

    def busy() -> None:
        s = torch.cuda.Stream()
        with torch.cuda.stream(s):
            while not stop.is_set():
                x = torch.randn(1 << 20, device="cuda")
                float(x.sum())  # a host wait on its own stream

    other = threading.Thread(target=busy, daemon=True)
    other.start()
    try:
        with torch.cuda.stream(torch.cuda.Stream(priority=-1)):
            runs = [decoder.run(), decoder.run()]
    finally:
        stop.set()
        other.join()
    for got in runs:
        assert got.tokens == [out for out, _ in ref]
        assert [r.accepted for r in got.rows] == [s.accepted for _, s in ref]
    steps = max(len(s.accepted) for _, s in ref)
    assert (info.captured, info.failed, info.eager_runs) == (1, 0, 0), info.failures
    assert info.replays == 2 * steps


@cuda
def test_a_capture_that_fails_runs_the_step_eagerly_and_says_why():
    from trainer.contract.graphs import GraphInfo
    from trainer.evaluation.graphs import GraphedStep

    x = torch.arange(4.0, device="cuda")
    info = GraphInfo(enabled=True)
    logged: list[str] = []
    step = GraphedStep(torch.device("cuda"), info, logged.append)

    def syncs() -> torch.Tensor:
        scale = float(x.sum())  # a host wait: a graph cannot hold it
        return x * scale

    step.bind(syncs)
    for run in range(2):
        step.new_run()
        assert step().tolist() == [0.0, 6.0, 12.0, 18.0]
        assert step().tolist() == [0.0, 6.0, 12.0, 18.0]  # eager for the rest of the run
        assert (info.failed, info.eager_runs, info.captured) == (run + 1, run + 1, 0)
    assert len(info.failures) == 2 and info.failures[0].reason
    assert logged[0].startswith("eval: CUDA graph capture failed, this eval runs eagerly: ")
    assert (x + 1).sum().item() == 10.0  # the device is usable after it

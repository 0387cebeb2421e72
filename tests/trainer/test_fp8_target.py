"""`target.dtype = "fp8"` (issue 31): the decoder linears as row-scaled FP8.

On the CPU: the quantisers' round trips, transformers' FP8 checkpoint format written and read
back (and refused when a scale does not fit its weight), which modules go FP8 and which stay
bf16, the refusal of FP8 where it cannot run, and the features of the tiny target in FP8
against bf16 (torch's CPU `_scaled_mm` runs the same op). On a GPU (skipped without one): the
features' error per layer the drafter reads, Fp8Linear against the bf16 linear on the
shapes the pipeline and the eval give it, compiled as `target.compile` does, and a short
training run with a held-out eval in FP8.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from test_bad_input import phases_visited, the_one_line
from test_trainer_cli import run_trainer
from torch import Tensor, nn

from trainer.targets import fp8
from trainer.targets.load import LoadedTarget, default_target_layer_ids, load_target
from trainer.targets.whole import whole_target

ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / "trainer" / "configs" / "tiny-cpu.toml"
cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
# One linear in FP8 on Gaussian data is ~3.7 % of its output's norm off (e4m3 rounds each
# operand ~2.4 %; measured 3.3-3.9 % over shapes on the CPU); a trained-like target's
# features through a few layers stay within this of bf16 (the tiny one: 0.9-3 %).
LINEAR_TOLERANCE = 0.05
FEATURE_TOLERANCE = 0.06


def rel(a: Tensor, b: Tensor) -> float:
    a, b = a.detach().float(), b.detach().float()
    return float((a - b).norm() / b.norm())


def per_layer(features: Tensor, hidden: int) -> list[Tensor]:
    return list(features.split(hidden, dim=-1))


# -- the quantisers ------------------------------------------------------------------------------


def test_row_quantisation_round_trips_within_fp8_precision_and_exactly_on_its_own_grid() -> None:
    g = torch.Generator().manual_seed(0)
    w = torch.randn(96, 160, generator=g)
    w[3] *= 1000  # one row's outlier must not cost the other rows their precision
    q, scale = fp8.quantize_rows(w)
    assert q.dtype == fp8.FP8 and scale.shape == (96,)
    back = fp8.dequantize_rows(q, scale)
    errors = [rel(back[i], w[i]) for i in range(96)]
    assert max(errors) < 0.05 and sum(errors) / len(errors) < 0.035, max(errors)
    # Each row's largest magnitude lands on FP8's largest: nothing clips, nothing wasted.
    assert torch.allclose(q.float().abs().amax(dim=1), torch.full((96,), fp8.FP8_MAX))
    # A weight already on its FP8 grid comes back bit for bit.
    q2, scale2 = fp8.quantize_rows(back)
    assert torch.equal(fp8.dequantize_rows(q2, scale2), back)
    # Quantising is not the identity: an error this test can see.
    assert rel(back, w) > 1e-3


def test_block_quantisation_has_a_scale_per_128_block_partial_ones_included() -> None:
    g = torch.Generator().manual_seed(1)
    w = torch.randn(200, 300, generator=g)
    w[:128, :128] *= 1e6  # one block's magnitude stays in that block
    q, scale_inv = fp8.quantize_blocks(w)
    assert q.shape == w.shape and q.dtype == fp8.FP8
    assert scale_inv.shape == (2, 3) == fp8.block_scale_shape((200, 300))
    back = fp8.dequantize_blocks(q, scale_inv)
    assert rel(back[:128, :128], w[:128, :128]) < 0.04
    assert rel(back[128:, 128:], w[128:, 128:]) < 0.04  # not ruined by the big block
    assert rel(back, w) > 1e-3
    # One scale over those whole rows would have flushed the small blocks to (near) zero,
    # below FP8's smallest magnitude: the block scale is what keeps them.
    rows = fp8.dequantize_rows(*fp8.quantize_rows(w))
    assert rel(rows[:128, 128:], w[:128, 128:]) > 0.5
    assert rel(back[:128, 128:], w[:128, 128:]) < 0.04


def test_fp8_linear_is_the_bf16_linear_within_fp8_precision_on_the_cpu() -> None:
    g = torch.Generator().manual_seed(2)
    linear = nn.Linear(128, 64, bias=True)
    with torch.no_grad():
        linear.weight.copy_(torch.randn(64, 128, generator=g) * 0.05)
        linear.bias.copy_(torch.randn(64, generator=g))
    linear = linear.to(torch.bfloat16)
    f = fp8.Fp8Linear.from_weight(linear.weight.data, linear.bias.data)
    for shape in ((1, 128), (3, 17, 128), (2, 256, 128)):  # rows not in 16s, batched
        x = torch.randn(*shape, generator=g).to(torch.bfloat16)
        got, want = f(x), linear(x)
        assert got.shape == want.shape and got.dtype == torch.bfloat16
        assert rel(got, want) < LINEAR_TOLERANCE, shape
    assert not list(f.parameters())  # buffers: nothing for an optimizer or requires_grad


# -- checkpoints in transformers' FP8 format ------------------------------------------------------


@pytest.fixture(scope="module")
def fp8_dir(tiny_target_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("fp8") / "tiny-qwen3-fp8"
    fp8.write_block_scaled(tiny_target_dir, out)
    return out


def test_a_written_fp8_checkpoint_is_in_transformers_format(fp8_dir: Path) -> None:
    from safetensors import safe_open

    config = json.loads((fp8_dir / "config.json").read_text())
    q = config["quantization_config"]
    assert q["quant_method"] == "fp8" and q["weight_block_size"] == [128, 128]
    assert (fp8_dir / "tokenizer.json").is_file()
    with safe_open(str(fp8_dir / "model.safetensors"), framework="pt") as f:
        keys = set(f.keys())
        w = f.get_tensor("model.layers.0.self_attn.q_proj.weight")
        s = f.get_tensor("model.layers.0.self_attn.q_proj.weight_scale_inv")
        assert w.dtype == fp8.FP8 and s.dtype == torch.float32
        assert tuple(s.shape) == fp8.block_scale_shape(tuple(w.shape))
        assert f.get_tensor("model.embed_tokens.weight").dtype != fp8.FP8
        # The head (tied to the embedding in the tiny target) is never quantised.
        assert all(f.get_tensor(k).dtype != fp8.FP8 for k in keys if "lm_head" in k)
    # 8 layers x 7 linears, each with its scale; nothing else quantised.
    assert fp8.check_block_scaled(fp8_dir) == 56
    assert sum(k.endswith(fp8.SCALE_SUFFIX) for k in keys) == 56


def _features(target: LoadedTarget, ids: Tensor) -> list[Tensor]:
    return per_layer(target.features(ids), target.info.hidden_size)


def test_the_fp8_checkpoint_loads_dequantised_or_in_fp8_close_to_bf16(
    tiny_target_dir: Path, fp8_dir: Path
) -> None:
    layer_ids = [1, 3, 5]
    cpu = torch.device("cpu")
    ref = load_target(tiny_target_dir, layer_ids, torch.bfloat16, cpu, "mask")
    ids = torch.randint(0, ref.info.vocab_size, (2, 48), generator=torch.Generator().manual_seed(0))
    want = _features(ref, ids)
    for use_fp8 in (False, True):
        t = load_target(fp8_dir, layer_ids, torch.bfloat16, cpu, "mask", fp8=use_fp8)
        got = _features(t, ids)
        errors = [rel(a, b) for a, b in zip(got, want, strict=True)]
        assert max(errors) < FEATURE_TOLERANCE, (use_fp8, errors)
        assert min(errors) > 1e-4, errors  # the scales were applied, not the identity
        converted = sum(isinstance(m, fp8.Fp8Linear) for m in t.model.modules())
        assert converted == (6 * 7 if use_fp8 else 0)
    # Loaded the way HF would load it unscaled (the float8 values alone): far off. Our
    # reader is what makes the difference.
    t = load_target(fp8_dir, layer_ids, torch.bfloat16, cpu, "mask")
    for _, _, _, linear in fp8._linears(t.model.model.layers):
        linear.weight.data = torch.randn_like(linear.weight) * 0.02
    assert max(rel(a, b) for a, b in zip(_features(t, ids), want, strict=True)) > 0.2


def _tamper(src: Path, dst: Path, key: str, value: Tensor | None) -> None:
    import shutil

    from safetensors.torch import load_file, save_file

    shutil.copytree(src, dst)
    tensors = load_file(str(src / "model.safetensors"))
    if value is None:
        del tensors[key]
    else:
        tensors[key] = value
    save_file(tensors, str(dst / "model.safetensors"), metadata={"format": "pt"})


def test_scales_that_do_not_match_their_weights_are_named(fp8_dir: Path, tmp_path: Path) -> None:
    key = "model.layers.2.mlp.up_proj.weight_scale_inv"
    bad = tmp_path / "bad-shape"
    _tamper(fp8_dir, bad, key, torch.ones(5, 5))
    with pytest.raises(ValueError, match=r"FP8 scale model\.layers\.2\.mlp\.up_proj") as e:
        fp8.check_block_scaled(bad)
    assert "[5, 5]" in str(e.value) and "[3, 1]" in str(e.value) and "\n" not in str(e.value)
    gone = tmp_path / "no-scale"
    _tamper(fp8_dir, gone, key, None)
    with pytest.raises(ValueError, match=r"FP8 weight model\.layers\.2\.mlp\.up_proj\.weight"):
        fp8.check_block_scaled(gone)


def test_a_bad_fp8_checkpoint_is_one_line_through_the_trainer(
    fp8_dir: Path, tmp_path: Path
) -> None:
    """Refused before any data is read or model built: exit 2, one line naming the tensor."""
    bad = tmp_path / "bad"
    _tamper(fp8_dir, bad, "model.layers.0.self_attn.o_proj.weight_scale_inv", torch.ones(1, 2))
    root = tmp_path / "runs"
    path = f"target.path={json.dumps(str(bad))}"
    r = run_trainer("--config", str(TINY), "--run-root", str(root), "--set", path)
    line = the_one_line(r)
    assert "model.layers.0.self_attn.o_proj.weight_scale_inv" in line, line
    assert not {"loading_data", "compiling", "warmup", "training"} & set(phases_visited(root))


# -- what goes FP8 --------------------------------------------------------------------------------


def test_only_the_decoder_linears_go_fp8(tiny_target_dir: Path) -> None:
    ids = default_target_layer_ids(8, 2)
    t = load_target(tiny_target_dir, ids, torch.bfloat16, torch.device("cpu"), "mask", fp8=True)
    model = t.model
    assert t.fp8 is not None and not t.fp8.kept
    assert len(t.fp8.converted) == 7 * (max(ids) + 1)
    assert "0.self_attn.q_proj" in t.fp8.converted and "0.mlp.down_proj" in t.fp8.converted
    for name, module in model.named_modules():
        if isinstance(module, nn.Linear):  # what is left as nn.Linear: the head alone
            assert name == "lm_head", name
    # The drafter's shared tensors stay bf16, and are the model's own.
    assert t.embed_weight.dtype == t.lm_head_weight.dtype == torch.bfloat16
    assert t.embed_weight is model.model.embed_tokens.weight
    assert t.lm_head_weight is model.lm_head.weight
    assert model.model.norm.weight.dtype == torch.bfloat16
    # Features within FP8's error of the bf16 target's, per layer the drafter reads.
    ref = load_target(tiny_target_dir, ids, torch.bfloat16, torch.device("cpu"), "mask")
    x = torch.randint(0, t.info.vocab_size, (2, 64), generator=torch.Generator().manual_seed(3))
    errors = [rel(a, b) for a, b in zip(_features(t, x), _features(ref, x), strict=True)]
    assert max(errors) < FEATURE_TOLERANCE and min(errors) > 1e-4, errors


def test_the_verifying_target_is_fp8_in_every_layer_and_predicts_as_bf16(
    tiny_target_dir: Path, fp8_dir: Path
) -> None:
    """The held-out eval's whole target (the training one plus its dropped layers): the
    dropped layers go FP8 too, from either source, and its greedy tokens are bf16's."""
    cpu = torch.device("cpu")
    ids = [1, 3]  # layers 4..7 dropped in training, loaded for verification
    bf16 = load_target(tiny_target_dir, ids, torch.bfloat16, cpu, "mask")
    ref = whole_target(bf16, torch.bfloat16, cpu)
    x = torch.randint(0, bf16.info.vocab_size, (2, 40), generator=torch.Generator().manual_seed(4))
    want = ref(x).logits.float()
    for folder in (tiny_target_dir, fp8_dir):
        t = load_target(folder, ids, torch.bfloat16, cpu, "mask", fp8=True)
        whole = whole_target(t, torch.bfloat16, cpu)
        assert len(whole.model.layers) == 8
        assert sum(isinstance(m, fp8.Fp8Linear) for m in whole.modules()) == 8 * 7
        got = whole(x).logits.float()
        assert rel(got, want) < FEATURE_TOLERANCE, folder
        assert (got.argmax(-1) == want.argmax(-1)).float().mean() > 0.9, folder


def test_the_offline_eval_reads_an_fp8_checkpoint_and_runs_an_fp8_run_on_a_cpu(
    tiny_target_dir: Path, fp8_dir: Path
) -> None:
    """`python -m trainer eval` and `regenerate` load the whole target themselves: an FP8
    checkpoint through our reader (HF's own wants accelerate), and an FP8 run's config on a
    CPU in bf16 rather than refused."""
    from trainer.targets.answers import load_whole_model

    cpu = torch.device("cpu")
    ref = load_whole_model(tiny_target_dir, "bfloat16", torch.bfloat16, cpu)
    x = torch.randint(0, 448, (1, 40), generator=torch.Generator().manual_seed(5))
    want = ref(x).logits.float()
    for name in ("bfloat16", "fp8"):
        model = load_whole_model(fp8_dir, name, torch.bfloat16, cpu)
        assert not fp8.has_fp8(model)  # dequantised: a CPU runs no FP8 target
        got = model(x).logits.float()
        assert 1e-4 < rel(got, want) < FEATURE_TOLERANCE, name
    assert not fp8.has_fp8(load_whole_model(tiny_target_dir, "fp8", torch.bfloat16, cpu))


def test_the_hybrids_linears_go_fp8_where_their_shape_allows(tiny_hybrid_target_dir: Path) -> None:
    cpu = torch.device("cpu")
    t = load_target(tiny_hybrid_target_dir, [1, 3], torch.bfloat16, cpu, "mask", fp8=True)
    assert t.fp8 is not None
    # The tiny hybrid's beta/decay projections have 4 outputs (its value heads): not in 16s.
    assert t.fp8.kept and all(n.split(".")[-1] in ("in_proj_a", "in_proj_b") for n in t.fp8.kept)
    assert any("linear_attn.in_proj_qkv" in n for n in t.fp8.converted)
    assert any("self_attn.q_proj" in n for n in t.fp8.converted)
    assert "bf16 (not in 16s" in t.fp8.line()


# -- where it may run --------------------------------------------------------------------------


def test_fp8_on_a_cpu_is_refused_in_one_line_before_any_work(tmp_path: Path) -> None:
    root = tmp_path / "runs"
    r = run_trainer("--config", str(TINY), "--run-root", str(root), "--set", "target.dtype=fp8")
    line = the_one_line(r)
    assert line == (
        "error: target.dtype: 'fp8': FP8 matmuls need a CUDA GPU (the target is on cpu);"
        " use 'auto' or 'bfloat16'"
    ), line
    assert not {"loading_data", "compiling", "warmup", "training"} & set(phases_visited(root))


def test_fp8_is_a_choice_and_other_quantisations_are_refused(tmp_path: Path) -> None:
    from trainer.config import ConfigError, load_config

    assert load_config(TINY, ["target.dtype=fp8"]).target.dtype == "fp8"
    with pytest.raises(ConfigError, match="fp8"):  # the choices name it
        load_config(TINY, ["target.dtype=fp4"])
    gptq = {"quantization_config": {"quant_method": "gptq"}}
    (tmp_path / "config.json").write_text(json.dumps(gptq))
    with pytest.raises(ValueError, match="'gptq' is not supported"):
        fp8.quantization_config(tmp_path)
    (tmp_path / "config.json").write_text(
        json.dumps({"quantization_config": {"quant_method": "fp8", "weight_block_size": [64, 64]}})
    )
    with pytest.raises(ValueError, match=r"weight_block_size \[64, 64\]"):
        fp8.quantization_config(tmp_path)


# -- on a GPU ----------------------------------------------------------------------------------


@cuda
def test_fp8_runs_where_the_gpu_has_it() -> None:
    dev = torch.device("cuda")
    if torch.cuda.get_device_capability(dev) < (8, 9):
        assert "compute capability" in str(fp8.fp8_unsupported(dev))
        return
    assert fp8.fp8_unsupported(dev) is None


@cuda
def test_fp8_linear_on_the_gpu_is_the_bf16_linear_within_fp8_precision() -> None:
    """The pipeline's packed rows (4096 tokens), the eval's decode steps (a few rows), rows
    not in 16s; eager and compiled (`target.compile` compiles the layers around it)."""
    if fp8.fp8_unsupported(torch.device("cuda")) is not None:
        pytest.skip("this GPU has no FP8 matmuls")
    g = torch.Generator(device="cuda").manual_seed(0)
    for k, n in ((4096, 12288), (12288, 4096), (128, 64)):
        w = (torch.randn(n, k, generator=g, device="cuda") * 0.02).to(torch.bfloat16)
        f = fp8.Fp8Linear.from_weight(w)
        compiled = torch.compile(f, dynamic=False)
        for m in (4096, 8 * 16, 17, 1):
            x = torch.randn(m, k, generator=g, device="cuda").to(torch.bfloat16)
            want = x @ w.t()
            got = f(x)
            assert got.dtype == torch.bfloat16 and got.shape == want.shape
            assert rel(got, want) < LINEAR_TOLERANCE, (k, n, m)
            if (k, m) in ((4096, 4096), (4096, 17)):  # two graphs: compiling takes seconds
                # Fused, the activations' scaling may round a few elements to the next FP8
                # value: the same op within that, not bit for bit.
                assert rel(compiled(x), got) < 0.03, (k, n, m)


@cuda
def test_fp8_features_on_the_gpu_per_layer_the_drafter_reads(
    tiny_target_dir: Path, fp8_dir: Path
) -> None:
    """A packed row through varlen attention, as the pipeline runs it, bf16 against FP8 from
    both sources, eager and compiled: each read layer's features within FP8's error."""
    dev = torch.device("cuda")
    if fp8.fp8_unsupported(dev) is not None:
        pytest.skip("this GPU has no FP8 matmuls")
    layer_ids = default_target_layer_ids(8, 3)
    ref = load_target(tiny_target_dir, layer_ids, torch.bfloat16, dev, "varlen")
    lengths = [100, 37, 119]
    ids = torch.randint(0, 200, (1, sum(lengths)), generator=torch.Generator().manual_seed(0))
    pos = torch.cat([torch.arange(n) for n in lengths])[None]

    def feats(t: LoadedTarget) -> list[Tensor]:
        f = t.features
        out = f(ids.to(dev), pos.to(dev), f.packed_docs(pos, dev))
        return per_layer(out, t.info.hidden_size)

    want = feats(ref)
    for folder in (tiny_target_dir, fp8_dir):
        t = load_target(folder, layer_ids, torch.bfloat16, dev, "varlen", fp8=True)
        eager = feats(t)
        errors = [rel(a, b) for a, b in zip(eager, want, strict=True)]
        assert max(errors) < FEATURE_TOLERANCE and min(errors) > 1e-4, (folder, errors)
        t.features.compile_layers()
        compiled = feats(t)
        # Compiled, the bf16 ops around the linears fuse (on the CPU the tiny target's FP8
        # features moved 1.1-1.3 % so): still within FP8's error of bf16.
        errors = [rel(a, b) for a, b in zip(compiled, want, strict=True)]
        assert max(errors) < FEATURE_TOLERANCE, (folder, "compiled", errors)
        assert max(rel(a, b) for a, b in zip(compiled, eager, strict=True)) < FEATURE_TOLERANCE
    # The offline eval's whole target of an FP8 run is FP8 on a GPU that runs it.
    from trainer.targets.answers import load_whole_model

    assert fp8.has_fp8(load_whole_model(fp8_dir, "fp8", torch.bfloat16, dev))


@cuda
def test_a_run_trains_and_evaluates_with_an_fp8_target(tmp_path: Path) -> None:
    """The tiny GPU config in FP8 through the real trainer: compiled target layers, the
    held-out eval's whole target (its dropped layers FP8 too, CUDA-graphed decode)."""
    if fp8.fp8_unsupported(torch.device("cuda")) is not None:
        pytest.skip("this GPU has no FP8 matmuls")
    root = tmp_path / "runs"
    r = run_trainer(
        "--config", "trainer/configs/tiny-gpu.toml", "--run-root", str(root),
        "--max-steps", "20", "--set", "target.dtype=fp8", "--set", "target.compile=true",
        "--set", "data.held_out=8", "--set", "eval.every=20", "--set", "eval.prompts=4",
        "--set", "eval.new_tokens=16", timeout=600,
    )  # fmt: skip
    (run_dir,) = [p for p in root.iterdir() if p.is_dir()]
    log = (run_dir / "train.log").read_text()
    assert r.returncode == 0, f"{r.stderr[-2000:]}\n{log[-4000:]}"
    assert "target FP8: " in log and "decoder linears row-scaled FP8" in log, log[-3000:]
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert rows and all(torch.isfinite(torch.tensor(row["loss"])) for row in rows)
    result = json.loads((run_dir / "eval" / "step-00000020.json").read_text())
    assert result["tau"] >= 1.0, result

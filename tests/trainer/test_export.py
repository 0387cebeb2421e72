"""Export for serving, proved with SpecForge's own `DFlashDraftModel` (the module SGLang's
loader mirrors), on a drafter a real trainer run trained:

- `python -m trainer export` of the run's checkpoint loads with `from_pretrained` and gives
  our drafter's outputs on the same inputs (fp32, CPU, tight tolerance), for a block drafted
  after a prefix as at inference and for the training mask;
- the reverse: a folder SpecForge saved seeds our drafter (`drafter.init_from`), and a run
  warm-started from an export starts where the exported run ended, not at a fresh loss;
- bad input is one line and exit 2; nothing is overwritten.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from trainer.evaluation.export import ExportError, check_draft_config, warm_start
from trainer.model.attention import dense_dflash_mask, make_dense_mask
from trainer.model.blocks import block_positions, block_token_ids
from trainer.model.checkpoint import load_checkpoint
from trainer.model.drafter import DFlashDrafter, DrafterArch
from trainer.targets.load import LoadedTarget, load_target, read_target_info

ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / "trainer" / "configs" / "tiny-cpu.toml"

dflash = pytest.importorskip(
    "specforge.modeling.draft.dflash", reason="scripts/setup installs specforge for the tests"
)


def trainer(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "trainer", *args],
        capture_output=True,
        text=True,
        timeout=240,
        cwd=ROOT,
    )


def train(root: Path, *sets: str, steps: int = 40) -> Path:
    r = trainer(
        "--config", str(TINY), "--run-root", str(root), "--max-steps", str(steps),
        "--set", "runtime.wandb_mode=disabled", "--set", "train.log_every=5",
        *[a for s in sets for a in ("--set", s)],
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    (run_dir,) = [p for p in root.iterdir() if p.is_dir()]
    return run_dir


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory, tiny_target_dir: Path) -> Path:
    """A run dir that really trained (its last checkpoint is at step 40)."""
    return train(tmp_path_factory.mktemp("trained"))


def ours_from(run_dir: Path, target_dir: Path) -> tuple[DFlashDrafter, DrafterArch, LoadedTarget]:
    data = load_checkpoint(sorted((run_dir / "checkpoints").glob("step-*.pt"))[-1])
    arch = DrafterArch.from_dict(data["arch"])
    target = load_target(
        target_dir, list(arch.target_layer_ids), torch.float32, torch.device("cpu")
    )
    model = DFlashDrafter(arch, target.embed_weight, target.lm_head_weight).eval()
    model.load_state_dict(data["model"], strict=False)
    return model, arch, target


def test_an_export_loads_in_specforge_and_drafts_what_ours_drafts(
    trained, tiny_target_dir, tmp_path
):
    out = tmp_path / "drafter-fp32"
    r = trainer("export", str(trained), "--out", str(out), "--dtype", "float32")
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("exported step 40 (25 tensors")
    sf = dflash.DFlashDraftModel.from_pretrained(out).eval()
    ours, arch, target = ours_from(trained, tiny_target_dir)
    assert sf.target_layer_ids == list(arch.target_layer_ids)
    assert (sf.mask_token_id, sf.block_size) == (arch.mask_token_id, arch.block_size)

    torch.manual_seed(0)
    B, S, bs = 2, 48, arch.block_size
    ids = torch.randint(0, arch.mask_token_id, (B, S))
    with torch.no_grad():
        feats = target.features.forward(ids)  # [B, S, n*H]
        # At inference: one block after a prefix of P tokens, the context is the prefix.
        P = 20
        block = torch.full((1, bs), arch.mask_token_id)
        block[0, 0] = ids[0, P]
        ctx = ours.fuse_context(feats[:1, :P])
        mine = ours(block, P + torch.arange(bs)[None], ctx, None)
        theirs = sf(
            position_ids=torch.arange(P + bs)[None],
            attention_mask=None,
            noise_embedding=F.embedding(block, target.embed_weight),
            target_hidden=feats[:1, :P],
        )
        assert (mine - theirs).abs().max().item() < 1e-5
        assert torch.equal(ours.logits(mine).argmax(-1), ours.logits(theirs).argmax(-1))
        # In training: blocks at several anchors, each seeing the context before its anchor.
        anchors = torch.tensor([[3, 17, 30], [0, 9, 25]])
        keep = torch.ones_like(anchors, dtype=torch.bool)
        blk_ids = block_token_ids(ids, anchors, bs, arch.mask_token_id)
        blk_pos = block_positions(anchors, bs)
        mine = ours(
            blk_ids, blk_pos, ours.fuse_context(feats), make_dense_mask(anchors, keep, S, bs)
        )
        theirs = sf(
            position_ids=torch.cat([torch.arange(S).expand(B, S), blk_pos], 1),
            attention_mask=dense_dflash_mask(anchors, keep, S, bs)[:, None],
            noise_embedding=F.embedding(blk_ids, target.embed_weight),
            target_hidden=feats,
        )
        assert (mine - theirs).abs().max().item() < 1e-5

    # The default export is bf16 for serving, with the target named in its README.
    served = tmp_path / "drafter"
    assert trainer("export", str(trained), "--out", str(served)).returncode == 0
    cfg = json.loads((served / "config.json").read_text())
    assert cfg["architectures"] == ["DFlashDraftModel"] and cfg["dtype"] == "bfloat16"
    assert cfg["num_target_layers"] == read_target_info(tiny_target_dir).num_layers
    assert cfg["dflash_config"]["mask_token_id"] == arch.mask_token_id
    prov = json.loads((served / "dflash_export.json").read_text())
    assert prov["run_id"] == trained.name and prov["step"] == 40
    assert prov["target"]["path"] == "builtin:tiny-qwen3"
    assert prov["target"]["config_sha256"] in (served / "README.md").read_text()
    bf16 = dflash.DFlashDraftModel.from_pretrained(served, torch_dtype=torch.bfloat16)
    assert next(bf16.parameters()).dtype == torch.bfloat16


def test_a_specforge_folder_seeds_our_drafter(trained, tiny_target_dir, tmp_path):
    _, arch, target = ours_from(trained, tiny_target_dir)
    src = tmp_path / "specforge-drafter"
    assert trainer("export", str(trained), "--out", str(src), "--dtype", "float32").returncode == 0
    sf = dflash.DFlashDraftModel.from_pretrained(src)
    with torch.no_grad():  # SpecForge's own weights now, not ours: move every one
        for p in sf.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    resaved = tmp_path / "saved-by-specforge"
    sf.save_pretrained(resaved)  # transformers 5 writes rope_parameters only
    fresh = DFlashDrafter(arch, target.embed_weight, target.lm_head_weight).eval()
    assert warm_start(fresh, arch, resaved) == 25
    for name, value in sf.state_dict().items():
        assert torch.equal(fresh.state_dict()[name], value), name

    wrong = json.loads((resaved / "config.json").read_text())
    wrong["layer_types"] = ["sliding_attention"] * arch.num_layers
    with pytest.raises(ExportError, match="sliding-window layers"):
        check_draft_config(wrong, arch, "x")
    wrong = {**json.loads((resaved / "config.json").read_text()), "head_dim": 8}
    with pytest.raises(ExportError, match=f"head_dim = 8, this run's drafter has {arch.head_dim}"):
        check_draft_config(wrong, arch, "x")


def test_a_run_warm_started_from_an_export_starts_where_it_ended(trained, tmp_path):
    out = tmp_path / "drafter"
    assert trainer("export", str(trained), "--out", str(out)).returncode == 0
    warm = train(tmp_path / "warm", f"drafter.init_from={json.dumps(str(out))}", steps=5)
    assert f"warm start: 25 drafter tensors from {out}" in (warm / "train.log").read_text()
    row = lambda d: [json.loads(x) for x in (d / "metrics.jsonl").read_text().splitlines()]  # noqa: E731
    ended = row(trained)[-1]["loss"]
    fresh_first = row(trained)[0]["loss"]
    warm_first = row(warm)[0]["loss"]
    # bf16 weights and a new warm-up of the LR: near where it ended, far from a fresh start.
    assert warm_first < ended + 0.5 * (fresh_first - ended), (warm_first, ended, fresh_first)


def test_bad_input_is_one_line_and_nothing_is_overwritten(trained, tmp_path):
    out = tmp_path / "taken"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    run, new = str(trained), lambda name: str(tmp_path / name)
    cases = [
        (["export", run, "--out", str(out)], "already exists; an export never overwrites"),
        (["export", run, "--out", new("a"), "--step", "7"], "no checkpoint at step 7"),
        (["export", new("nope"), "--out", new("b")], "no such run dir"),
        (["export", run, "--out", new("c"), "--dtype", "int8"], "--dtype 'int8'"),
        (["export", run], "--out"),
    ]
    for args, needle in cases:
        r = trainer(*args)
        assert r.returncode == 2, (args, r.stderr)
        assert len(r.stderr.strip().splitlines()) == 1 and needle in r.stderr, r.stderr
        assert "Traceback" not in r.stderr
    assert (out / "keep.txt").read_text() == "mine"
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no partial left

    bad = tmp_path / "bad-init"
    bad.mkdir()
    (bad / "config.json").write_text("{}")
    r = trainer("--config", str(TINY), "--run-root", str(tmp_path / "runs"), "--max-steps", "1",
                "--set", "runtime.wandb_mode=disabled",
                "--set", f"drafter.init_from={json.dumps(str(bad))}")  # fmt: skip
    assert r.returncode == 2, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and "drafter.init_from" in r.stderr, r.stderr

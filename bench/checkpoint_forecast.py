"""The trainer's checkpoint-size forecast (trainer/model/checkpoint.py `forecast_bytes`, what
`disk_short` warns with before the first save) for the bundled GPU configs, their drafters
built on the meta device as bench/scaling.py builds them (nothing allocated), against the
checkpoint files the H200 really wrote.

    .venv/bin/python bench/checkpoint_forecast.py

The 8B config's real file: 12.58 GB, its SIGTERM checkpoint through `dflash-tui restart` on
the H200 (bench/README.md, "The operator's path on the H200"). The 27B-shaped config's was
never written whole: its stop checkpoint failed at 14.8 GB written on the 64 GiB disk (issue
33), so its row has the forecast alone."""

from __future__ import annotations

import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))
sys.path.insert(0, str(BENCH.parent))

REAL = {"qwen3-8b-h200": 12.58e9}  # bytes as `kill` reported them (1 GB = 1e9 B)


def main() -> int:
    import scaling  # bench/

    from trainer.model.checkpoint import forecast_bytes, size

    rows = []
    for name, info in (
        ("qwen3-8b-h200", scaling.target_info_8b()),
        ("qwen3.6-27b-h200", scaling.target_info_27b()),
    ):
        config = BENCH.parent / "trainer" / "configs" / f"{name}.toml"
        cfg, arch, model, _ = scaling.meta_drafter(config, info)
        trainable = [p for p in model.parameters() if p.requires_grad]
        each = forecast_bytes(trainable, arch.to_dict(), cfg.to_dict())
        params = sum(p.numel() for p in trainable)
        real = REAL.get(name)
        vs = f"{size(real)} real, forecast/real {each / real:.3f}" if real else "no real file"
        rows.append((name, params, each, vs, cfg.train.keep_checkpoints))
        print(f"{name}: {params / 1e9:.3f}B trainable, forecast {size(each)} ({vs})")
    print("\n| config | trainable | forecast | against the real file | keep_checkpoints |")
    print("|---|---|---|---|---|")
    for name, params, each, vs, keep in rows:
        print(f"| {name} | {params / 1e9:.3f}B | {size(each)} | {vs} | {keep or 'all'} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())

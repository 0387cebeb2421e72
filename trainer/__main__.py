"""`python -m trainer`: train a DFlash drafter into a fresh run dir.

    python -m trainer --config trainer/configs/tiny-cpu.toml --run-root runs [--max-steps N]
    python -m trainer --resume runs/<run_id> [--set train.max_steps=2000]

Exit codes: 0 finished (or stopped by SIGTERM after a checkpoint), 1 crashed, 2 bad input.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import time
from pathlib import Path
from typing import Any

from trainer.config import Config, ConfigError, apply_overrides, config_from_dict, load_config
from trainer.fsutil import atomic_write_json
from trainer.run_dir import create_run_dir, is_run_dir


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m trainer", description=__doc__.splitlines()[0])
    p.add_argument("--config", type=Path, help="TOML config (see trainer/configs/)")
    p.add_argument("--run-root", type=Path, default=Path("runs"), help="parent of run dirs")
    p.add_argument(
        "--run-dir",
        type=Path,
        help="use this new, empty folder as the run dir (a launcher made it)",
    )
    p.add_argument("--max-steps", type=int, help="stop after N optimizer steps")
    p.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a config key, e.g. --set train.lr=3e-4 (repeatable)",
    )
    p.add_argument(
        "--resume", type=Path, metavar="RUN_DIR", help="continue a run's latest checkpoint"
    )
    return p.parse_args(argv)


def resolve_config(args: argparse.Namespace) -> tuple[Config, dict[str, Any]]:
    """The config to run, and the run-dir metadata that says where it came from."""
    overrides = list(args.overrides)
    if args.max_steps is not None:
        overrides.append(f"train.max_steps={args.max_steps}")
    meta: dict[str, Any] = {}
    if args.resume is not None:
        parent = args.resume
        try:
            saved = json.loads((parent / "config.json").read_text())
        except FileNotFoundError:
            raise ConfigError(f"--resume {parent}: no config.json (not a run dir)") from None
        except json.JSONDecodeError as e:
            raise ConfigError(f"--resume {parent}/config.json: not valid JSON ({e})") from None
        cfg = load_config(args.config) if args.config else config_from_dict(saved)
        # Overrides go on top of whichever config the run resumes with.
        apply_overrides(cfg, overrides)
        meta["parent"] = str(parent.resolve())
        return cfg, meta
    if args.config is None:
        raise ConfigError("--config is required (or --resume RUN_DIR)")
    return load_config(args.config, overrides), meta


def compile_cache_dir(cfg: Config) -> Path:
    if cfg.runtime.compile_cache_dir:
        return Path(cfg.runtime.compile_cache_dir).expanduser()
    from trainer.tiny_target import cache_dir

    return cache_dir() / "compile"


def configure_compile_cache(cache_dir: Path) -> None:
    """Inductor and Triton caches in a stable folder outside the run dir, so a restart
    reuses compiled kernels. Set before torch is imported."""
    cache_dir.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(cache_dir / "inductor"))
    os.environ.setdefault("TRITON_CACHE_DIR", str(cache_dir / "triton"))


def prepare_run_dir(args: argparse.Namespace, cfg: Config) -> Path:
    if args.run_dir is None:
        return create_run_dir(args.run_root, cfg.name)
    run_dir: Path = args.run_dir
    if is_run_dir(run_dir):
        raise ConfigError(f"--run-dir {run_dir}: already holds a run (run dirs are never reused)")
    run_dir.mkdir(parents=True, exist_ok=True)
    return run_dir


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    started = time.time()
    try:
        cfg, meta = resolve_config(args)
        checkpoint = None
        if args.resume is not None:
            from trainer.checkpoint import latest_checkpoint

            checkpoint = latest_checkpoint(args.resume)
            if checkpoint is None:
                raise ConfigError(f"--resume {args.resume}: no checkpoint in it")
            meta["checkpoint"] = str(checkpoint.resolve())
        run_dir = prepare_run_dir(args, cfg)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2

    meta.update(
        run_id=run_dir.name,
        created=started,
        host=socket.gethostname(),
        pid=os.getpid(),
        argv=sys.argv,
    )
    # Written first, before anything slow can fail: the run dir explains itself.
    atomic_write_json(run_dir / "config.json", {**cfg.to_dict(), "run": meta})
    print(f"run dir: {run_dir}", flush=True)

    configure_compile_cache(compile_cache_dir(cfg))
    from trainer.run import run_training  # imports torch: after the cache is configured

    return run_training(cfg, run_dir, meta, checkpoint)


if __name__ == "__main__":
    sys.exit(main())

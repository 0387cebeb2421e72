"""`python -m trainer`: train a DFlash drafter into a fresh run dir.

    python -m trainer --config trainer/configs/tiny-cpu.toml --run-root runs [--max-steps N]
    python -m trainer --resume runs/<run_id> [--set train.max_steps=2000]
    python -m trainer export runs/<run_id> --out DIR [--step N]   (trainer/commands/export.py)
    python -m trainer eval runs/<run_id> [--step N] [--prompts K]  (trainer/commands/eval.py)
    python -m trainer regenerate --config CFG --out FILE.jsonl      (trainer/commands/regenerate.py)

Exit codes: 0 finished (or stopped by SIGTERM after a checkpoint), 1 crashed, 2 bad input.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import time
import zipfile
from pathlib import Path
from typing import Any, NoReturn

from trainer.commands.args import OneLineParser
from trainer.config import (
    Config,
    ConfigError,
    apply_overrides,
    config_from_dict,
    error_lines,
    load_config,
    one_line,
    show_path,
)
from trainer.fsutil import atomic_write_json
from trainer.runtime import launch_lock
from trainer.runtime.compile.cache import configure_compile_cache
from trainer.runtime.run_dir import prepare_run_dir


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = OneLineParser(prog="python -m trainer", description=__doc__.splitlines()[0])
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
        saved = read_saved_config(parent)
        source = f"--resume {show_path(parent / 'config.json')}"
        cfg = load_config(args.config) if args.config else config_from_dict(saved, source)
        # Overrides go on top of whichever config the run resumes with.
        apply_overrides(cfg, overrides)
        meta["parent"] = str(parent.resolve())
        return cfg, meta
    if args.config is None:
        raise ConfigError("--config is required (or --resume RUN_DIR)")
    return load_config(args.config, overrides), meta


def read_saved_config(parent: Path) -> Any:
    """A run dir's config.json, as JSON; anything unreadable is one ConfigError line."""
    where = f"--resume {show_path(parent)}"
    try:
        raw = (parent / "config.json").read_bytes()
    except FileNotFoundError:
        raise ConfigError(f"{where}: no config.json (not a run dir)") from None
    except OSError as e:  # a directory, a file given as RUN_DIR, no permission
        raise ConfigError(f"{where}: cannot read config.json ({e.strerror or e})") from None
    try:
        return json.loads(raw)
    except (ValueError, RecursionError) as e:  # bad JSON or UTF-8, an int over 4300 digits
        why = one_line(str(e)) if isinstance(e, ValueError) else "nested too deep"
        raise ConfigError(f"{where}: config.json is not valid JSON ({why})") from None


def resume_checkpoint(run_dir: Path) -> Path:
    """The run's newest good checkpoint (trainer/contract/checkpoints.py's rule); the ones
    passed over are said on stderr, and none good is bad input."""
    from trainer.model.checkpoint import choose_good_checkpoint

    where = f"--resume {show_path(run_dir)}"
    try:
        choice = choose_good_checkpoint(run_dir)
    except OSError as e:
        raise ConfigError(f"{where}: cannot read its checkpoints ({e.strerror or e})") from None
    if choice.name is None:
        why = "; ".join(f"{n}: {w}" for n, w in choice.skipped)
        raise ConfigError(f"{where}: no good checkpoint in it" + (f" ({why})" if why else ""))
    checkpoint = run_dir / choice.name
    if not zipfile.is_zipfile(checkpoint):  # torch.save writes a zip archive
        raise ConfigError(f"--resume: {show_path(checkpoint)} is not a torch checkpoint")
    if choice.skipped:
        print(f"resume: {choice.describe()}", file=sys.stderr, flush=True)
    return checkpoint


def exec_torchrun(cfg: Config, argv: list[str]) -> NoReturn:
    """This process becomes torchrun with one rank per role on this host: `--standalone`, or
    one node of a multi-host job (trainer/distributed/nodes.py)."""
    ranks = len(cfg.runtime.targets) + len(cfg.runtime.drafters)
    # A builtin target or dataset not in the cache yet is built here, once, before the
    # ranks start: four ranks building it at once collided on a cold cache (one read the
    # folder as another renamed its build into place).
    if cfg.target.path.startswith("builtin:"):
        from trainer.builtins.resolve import resolve_target_path

        resolve_target_path(cfg.target.path)
    if cfg.data.path.startswith("builtin:"):
        from trainer.builtins.resolve import resolve_data_path

        resolve_data_path(cfg.data.path)
    from trainer.distributed.nodes import torchrun_node_args

    cmd = [
        sys.executable,
        "-m",
        "trainer.distributed.torchrun_job",
        *torchrun_node_args(os.environ),
    ]
    cmd += ["--nproc-per-node", str(ranks), "-m", "trainer", *argv]
    print(f"processes mode: {ranks} ranks under torchrun", flush=True)
    os.execv(sys.executable, cmd)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["export"]:
        from trainer.commands.export import main as export_main

        return export_main(argv[1:])
    if argv[:1] == ["eval"]:
        from trainer.commands.eval import main as eval_main

        return eval_main(argv[1:])
    if argv[:1] == ["regenerate"]:
        from trainer.commands.regenerate import main as regenerate_main

        return regenerate_main(argv[1:])
    args = parse_args(argv)
    started = time.time()
    try:
        cfg, meta = resolve_config(args)
        configure_compile_cache(cfg)
        checkpoint = None
        if args.resume is not None:
            checkpoint = resume_checkpoint(args.resume)
            meta["checkpoint"] = str(checkpoint.resolve())
        processes = cfg.runtime.mode == "processes"
        # The launch lock, as the agent's launch holds it (a launched trainer has it
        # already); a torchrun rank leaves it to its launcher, which holds it.
        lock = None
        if "WORLD_SIZE" not in os.environ:
            if args.run_dir:
                lock = launch_lock.hold(args.run_dir.parent, "the parent of --run-dir")
            else:
                lock = launch_lock.hold(args.run_root)
        # A torchrun job's run dir is made by one rank (trainer/distributed/layout.py).
        if not processes:
            run_dir = prepare_run_dir(args.run_root, args.run_dir, cfg.name)
            if lock is not None:
                launch_lock.name_active(run_dir.parent, run_dir.name)
    except ConfigError as e:
        for line in error_lines(e):  # one per bad --set
            print(f"error: {line}", file=sys.stderr)
        return 2
    if processes:
        if "WORLD_SIZE" not in os.environ:
            # Started as every run is (`dflash-tui launch`, or by hand): become the job's
            # torchrun. exec keeps this pid, its start time, its process group and the
            # launch lock the wrapper handed down, so the agent's identity rule, kill and
            # restart act on the job as on any run (torchrun passes SIGTERM to every rank).
            try:
                exec_torchrun(cfg, argv)
            except (ValueError, ConfigError) as e:  # a bad builtin or node variable: one line
                print(f"error: {one_line(str(e))}", file=sys.stderr)
                return 2
        from trainer.distributed.run import main_processes  # imports torch, as run_training does

        return main_processes(args, cfg, meta)

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

    from trainer.runtime.run import run_training  # imports torch: after the cache is configured

    return run_training(cfg, run_dir, meta, checkpoint)


if __name__ == "__main__":
    sys.exit(main())

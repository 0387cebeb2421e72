"""Where the demo keeps its runs, and the plain commands' fall-back to them (issue 32).

`dflash-tui demo` trains under its own folder (XDG_STATE_HOME), not under `~/dflash`: a demo
never mixes with real runs. Right after it, plain `dflash-tui`, `status` and `runs` would look
in `~/dflash/runs` and find nothing. When nothing says where to look (no TARGET, no
--run-root or --remote-dir, no `[targets.local]` in config.toml) and the default root has no
runs while the demo's has, they read the demo's root, and say so in one line naming it and
the `--run-root` that reads it on purpose.
"""

from __future__ import annotations

import argparse
import os
import stat
from pathlib import Path

from dflash_tui.commands import oneshot
from dflash_tui.targets import Target, load_user_targets, resolve_target
from trainer.contract.records import RUN_FILES


def demo_remote_dir() -> str:
    """The demo's remote dir: the trainer it deploys, its runs under `runs/`."""
    base = os.environ.get("XDG_STATE_HOME") or os.path.expanduser("~/.local/state")
    return str(Path(base) / "dflash-tui" / "demo")


def has_runs(root: str) -> bool:
    """A real folder under `root` with a run's own file (the agent's rule: agent/runs.py)."""
    try:
        names = os.listdir(os.path.expanduser(root))
    except OSError:
        return False
    for name in names:
        d = os.path.join(os.path.expanduser(root), name)
        try:
            if not stat.S_ISDIR(os.lstat(d).st_mode):
                continue
        except OSError:
            continue
        if any(os.path.isfile(os.path.join(d, f)) for f in RUN_FILES):
            return True
    return False


def or_demo(args: argparse.Namespace, target: Target) -> Target:
    """`target`, or the demo's local root where nothing named one and only it has runs."""
    named = (
        args.target is not None
        or args.run_root is not None
        or args.remote_dir is not None
        or getattr(args, "pct", None) is not None
        or getattr(args, "exec_prefix", None) is not None
    )
    if named or target.kind != "local" or target.exec_prefix or "local" in load_user_targets():
        return target
    if has_runs(target.effective_run_root):
        return target
    demo = resolve_target("local", remote_dir=demo_remote_dir(), python=args.python)
    root = demo.effective_run_root
    if not has_runs(root):
        return target
    oneshot.err(f"no runs under {target.effective_run_root}: the demo's runs (--run-root {root})")
    return demo

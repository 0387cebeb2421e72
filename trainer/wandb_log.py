"""Optional Weights & Biases logging: offline by default, absent is fine."""

from __future__ import annotations

from pathlib import Path
from typing import Any


class WandbLog:
    def __init__(self, run: Any, mode: str) -> None:
        self._run = run
        self.mode = mode

    @property
    def info(self) -> dict[str, Any]:
        if self._run is None:
            return {"mode": self.mode, "id": None, "url": None}
        return {"mode": self.mode, "id": self._run.id, "url": self._run.url}

    def log(self, metrics: dict[str, Any], step: int) -> None:
        if self._run is not None:
            flat = {k: v for k, v in metrics.items() if isinstance(v, int | float)}
            self._run.log(flat, step=step)

    def finish(self, exit_code: int = 0) -> None:
        if self._run is not None:
            self._run.finish(exit_code=exit_code)
            self._run = None


def start_wandb(
    mode: str, project: str, run_dir: Path, run_id: str, config: dict[str, Any], say: Any
) -> WandbLog:
    if mode == "disabled":
        return WandbLog(None, "disabled")
    try:
        import wandb
    except ImportError:
        say("wandb: not installed, metrics stay in metrics.jsonl (pip install wandb to add it)")
        return WandbLog(None, "absent")
    init: Any = wandb.init
    run = init(mode=mode, project=project, name=run_id, dir=str(run_dir), config=config)
    return WandbLog(run, mode)

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
            self._run.log(flatten(metrics), step=step)

    def finish(self, exit_code: int = 0) -> None:
        if self._run is not None:
            self._run.finish(exit_code=exit_code)
            self._run = None


def flatten(metrics: dict[str, Any]) -> dict[str, float]:
    """The numbers of a metrics row, the held-out eval's as `eval/tau`, `eval/accept_1` …"""
    flat = {k: v for k, v in metrics.items() if isinstance(v, int | float)}
    ev = metrics.get("eval")
    if isinstance(ev, dict):
        flat.update(
            {f"eval/{k}": v for k, v in ev.items() if isinstance(v, int | float) and k != "at"}
        )
        for k, share in enumerate(ev.get("per_position") or [], start=1):
            flat[f"eval/accept_{k}"] = share
    return flat


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

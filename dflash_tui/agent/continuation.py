"""A finished run continued for N more steps (`restart --more-steps N`): the overrides that
make its final checkpoint train on, and the words that say what the learning rate does.

The new run resumes the final checkpoint (step, data position and optimizer state carry on)
with train.max_steps raised by N. The LR schedule (trainer/model/optim.py: warmup, cosine
down to lr * min_lr_ratio over [schedule_start, schedule_start + schedule_steps), held after)
is pinned to the parent's, so the LR holds its final value; `new_schedule` starts a fresh
warmup and cosine over the N new steps instead. Read from the parent's files: its
config.json's train section (as the trainer resolved it) and its total step count (exit.json,
else the heartbeat).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from dflash_tui.agent.errors import CommandError

MAX_MORE_STEPS = 100_000_000


@dataclasses.dataclass
class Continuation:
    overrides: list[str]  # appended to the parent's overrides (later ones win)
    max_steps: int
    lr: str  # what the learning rate does, in words


def _number(train: dict[str, Any], key: str, default: float) -> float:
    value = train.get(key, default)
    # config.json is the host's file: a value of another type is the default, not a crash
    if isinstance(value, bool) or not isinstance(value, int | float):
        return default
    return float(value)


def continuation(
    resume_step: int, parent_total: int | None, train: dict[str, Any], more: int, new: bool
) -> Continuation:
    """The overrides that continue a run whose final checkpoint is at `resume_step` and whose
    total was `parent_total` steps, with `train` its config.json's train section."""
    if not 1 <= more <= MAX_MORE_STEPS:
        raise CommandError(f"more steps: {more}: must be an integer in [1, {MAX_MORE_STEPS}]")
    total = max(parent_total or 0, resume_step)
    max_steps = total + more
    lr = _number(train, "lr", 0.0)
    floor = lr * _number(train, "min_lr_ratio", 0.0)
    if new:
        warmup = int(_number(train, "warmup_steps", 0))
        overrides = [f"train.schedule_start={resume_step}", f"train.schedule_steps={more}"]
        words = (
            f"a new schedule: warmup {warmup} steps to {lr:.3g}, cosine down to {floor:.3g} "
            f"at step {resume_step + more}"
        )
    else:
        # The parent's own schedule, made explicit so that raising max_steps leaves it be:
        # past its end the lr holds its final value.
        start = int(_number(train, "schedule_start", 0))
        steps = int(_number(train, "schedule_steps", 0)) or max(1, total - start)
        overrides = [f"train.schedule_start={start}", f"train.schedule_steps={steps}"]
        words = f"the learning rate holds the schedule's final value ({floor:.3g})"
    return Continuation([*overrides, f"train.max_steps={max_steps}"], max_steps, words)

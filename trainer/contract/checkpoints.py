"""Checkpoints in a run dir, and the one rule for which of them a restart resumes from.

    checkpoints/step-00000500.pt     the drafter, its optimizer and the data position (torch)
    checkpoints/step-00000500.json   `CheckpointMeta`, written once the .pt is complete

The sidecar says, without torch, whether the checkpoint is *good*: its trained weights and
optimizer moments were all finite, and so was the loss of the steps just before it. A run that
went NaN writes checkpoints that are not good; a restart resumes from the newest good one
(`choose_resume`), which is from before the run diverged. A .pt with no sidecar (a trainer from
before sidecars, or a crash between the two writes) is a candidate the trainer checks itself
when it loads it (trainer/model/checkpoint.py), so the agent, which has no torch, and the trainer
apply the same rule.

Standard library only, Python >= 3.10: the agent carries this module to the training host.
"""

from __future__ import annotations

import dataclasses
import math
import re

from trainer.contract.typed import Invalid, Unreadable, decode, parse_json

CHECKPOINTS = "checkpoints"
PT_NAME = re.compile(r"^step-(\d{1,12})\.pt$")
MAX_META_BYTES = 1 << 16


def pt_name(step: int) -> str:
    return f"step-{step:08d}.pt"


def meta_name(step: int) -> str:
    return f"step-{step:08d}.json"


def step_of(name: str) -> int | None:
    """The step a checkpoint file name holds, or None for any other name."""
    m = PT_NAME.match(name)
    return int(m.group(1)) if m else None


@dataclasses.dataclass
class CheckpointMeta:
    step: int
    file: str  # the .pt beside it
    finite: bool  # every trained weight and optimizer moment was finite
    loss: float | None = None  # mean loss of the last steps before it; None: no step logged yet
    bytes: int = 0
    written_at: float = 0.0
    seconds: float = 0.0  # the write, from the snapshot to the rename

    def why_not_good(self) -> str | None:
        """None for a good checkpoint, else why a restart skips it."""
        if not self.finite:
            return "weights or optimizer state not finite"
        if self.loss is not None and not math.isfinite(self.loss):
            return f"loss was {self.loss} before it"
        return None


@dataclasses.dataclass
class CheckpointFailure:
    """A checkpoint that could not be written (the heartbeat's `checkpoints.failed`): the
    previous one stays the resume point and no part of this one is left on disk."""

    step: int
    message: str  # "disk full (needed 22.1 GB, free 14.1 GB)", or the error in one line
    at: float = 0.0


@dataclasses.dataclass
class CheckpointPlan:
    """What the run's checkpoints will take, published by the trainer before its first save
    (the heartbeat's `checkpoints`, optional under schema 2): the monitor's disk_short can
    warn while there is no checkpoint on disk yet to measure."""

    forecast_bytes: (
        int  # one checkpoint: weights, AdamW's two moments, the rest (model/checkpoint.py)
    )
    every: int = 0  # train.checkpoint_every (0: only at the end)
    keep: int = 0  # train.keep_checkpoints (0: every one kept)
    failed: CheckpointFailure | None = None  # the newest save that failed, until one succeeds

    def invalid(self) -> str | None:
        """Why these numbers cannot be a run's (the heartbeat is untrusted)."""
        if self.forecast_bytes < 0 or self.every < 0 or self.keep < 0:
            return (
                f"checkpoints: forecast {self.forecast_bytes} bytes, every {self.every}, "
                f"keep {self.keep}: not a run's"
            )
        return None


@dataclasses.dataclass
class CheckpointUse:
    """A run's checkpoints as its disk holds them (the runs list's `RunInfo.checkpoints`): what
    the checkpoints still to come will need. The trainer prunes old ones only when
    train.keep_checkpoints says so (`CheckpointPlan.keep`, `files_to_come`)."""

    count: int  # checkpoints/step-N.pt files
    newest_step: int
    newest_bytes: int  # that file's size: each of the next ones is about as large
    # config.json train.checkpoint_every (0: only at the end); None: config.json did not say
    every: int | None = None

    def invalid(self) -> str | None:
        """Why these numbers cannot be a run's (they come from the host: untrusted)."""
        every = self.every or 0
        if self.count < 1 or self.newest_step < 0 or self.newest_bytes < 0 or every < 0:
            return (
                f"checkpoints: {self.count} files, newest step {self.newest_step} of "
                f"{self.newest_bytes} bytes, every {self.every}: not a run's"
            )
        return None

    def _periodic_to_come(self, total_steps: int) -> int:
        """Checkpoints every `every` steps after the newest and before the last step (none
        counted when config.json did not say how often)."""
        c, e = self.newest_step, self.every or 0
        return max(0, (total_steps - 1) // e - c // e) if e > 0 else 0

    def count_to_come(self, total_steps: int) -> int:
        """Checkpoints still to be written after the newest, to `total_steps`: one every
        `every` steps before the last, and the last step's (trainer/runtime/pipeline.py, run.py)."""
        if self.newest_step >= total_steps:
            return 0
        return self._periodic_to_come(total_steps) + 1

    def files_to_come(self, total_steps: int, keep: int) -> int:
        """How many checkpoints' worth of disk the ones still to come take beyond what is on
        disk now. Keeping all (`keep` 0): every one. Keeping the last `keep` and the best
        τ's: the files grow to keep + 1, and one more is written before the pruning that
        follows each save (trainer/runtime/retention.py)."""
        to_come = self.count_to_come(total_steps)
        if keep <= 0:
            return to_come
        return min(to_come, max(1, keep + 2 - self.count))

    def step_to_come(self, k: int, total_steps: int) -> int | None:
        """The step of the k-th checkpoint still to come (1: the next), or None."""
        periodic = self._periodic_to_come(total_steps)
        if 1 <= k <= periodic and self.every:
            return (self.newest_step // self.every + k) * self.every
        if k == periodic + 1 and self.newest_step < total_steps:
            return total_steps
        return None


def parse_meta(raw: bytes, what: str) -> CheckpointMeta | Unreadable:
    data = parse_json(raw, what, MAX_META_BYTES)
    if isinstance(data, Unreadable):
        return data
    try:
        meta = decode(CheckpointMeta, data, what)
    except Invalid as e:
        return Unreadable(what, str(e))
    return meta


@dataclasses.dataclass(frozen=True)
class ResumeChoice:
    """Where a restart continues: `name` (relative to the run dir) at `step`, and the newer
    checkpoints it passed over with the reason for each."""

    name: str | None  # None: no good checkpoint, start fresh
    step: int | None
    verified: bool  # a sidecar said it is good (False: the trainer checks it when it loads)
    skipped: tuple[tuple[str, str], ...] = ()

    def describe(self) -> str:
        skipped = "; ".join(f"skipped {n}: {why}" for n, why in self.skipped)
        if self.name is None:
            what = "no good checkpoint: starting fresh from step 0"
        else:
            what = f"resuming from {self.name} (step {self.step})"
        return what + (f" ({skipped})" if skipped else "")


@dataclasses.dataclass
class Skipped:
    name: str  # relative to the run dir
    why: str


@dataclasses.dataclass
class ResumePoint:
    """A `ResumeChoice` as a record that travels: in the runs list (`RunInfo.resume`: where a
    restart of that run would continue) and in restart's answer (where it did). `run_id` is
    the run whose checkpoint it is."""

    run_id: str
    name: str | None = None  # None: no good checkpoint, a restart starts at step 0
    step: int | None = None
    verified: bool = False
    skipped: list[Skipped] = dataclasses.field(default_factory=list)

    @classmethod
    def of(cls, run_id: str, choice: ResumeChoice) -> ResumePoint:
        skipped = [Skipped(n, why) for n, why in choice.skipped]
        return cls(run_id, choice.name, choice.step, choice.verified, skipped)

    def choice(self) -> ResumeChoice:
        skipped = tuple((s.name, s.why) for s in self.skipped)
        return ResumeChoice(self.name, self.step, self.verified, skipped)

    def describe(self) -> str:
        return self.choice().describe()


def choose_resume(candidates: dict[int, CheckpointMeta | Unreadable | None]) -> ResumeChoice:
    """{step: its sidecar (None: none)} -> the newest good checkpoint. A sidecar that cannot
    be read counts as no sidecar: the .pt itself is still checked when loaded."""
    skipped: list[tuple[str, str]] = []
    for step in sorted(candidates, reverse=True):
        meta = candidates[step]
        name = f"{CHECKPOINTS}/{pt_name(step)}"
        if isinstance(meta, CheckpointMeta):
            why = why_not_good(meta, step)
            if why is not None:
                skipped.append((name, why))
                continue
            return ResumeChoice(name, step, True, tuple(skipped))
        return ResumeChoice(name, step, False, tuple(skipped))
    return ResumeChoice(None, None, False, tuple(skipped))


def why_not_good(meta: CheckpointMeta, step: int) -> str | None:
    if meta.step != step:
        return f"its sidecar is for step {meta.step}"
    return meta.why_not_good()

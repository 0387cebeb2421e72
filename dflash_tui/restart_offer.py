"""What restart offers in the followed run's state, and what the operator chose. Pure Python:
the store and the launch record in, an `Offer` out (the dialog, widgets/restart_dialog.py,
draws it; app_control.py sends the choice through control.restart).

- alive: resume from where it stops (it checkpoints as it stops), or step 0;
- stopped, crashed or killed with a good checkpoint: resume from it, or step 0;
- no good checkpoint: step 0 only (one choice, not two that do the same);
- died before start: step 0 with the launch's overrides, each one kept, edited or dropped,
  and one more added (the one the error names marked): a relaunch as it was would die the
  same way; the list is checked against the launch's config before anything is sent;
- finished: continue N more steps (a new run resuming the final checkpoint), or a new run
  from step 0; never a "resume" that trains nothing.

A step-0 choice discards what was trained, so the dialog asks for a typed word (`fresh`);
a resume or a continue may be confirmed with Enter.
"""

from __future__ import annotations

import dataclasses
import json

from dflash_tui.diagnosis.process import died_before_start
from dflash_tui.state import Store
from trainer.contract.outcomes import DIED, FINISHED
from trainer.contract.records import LaunchRecord, named_overrides, parse_launch
from trainer.contract.typed import Unreadable

ALIVE, RESUME, NO_CHECKPOINT, DIED_BEFORE_START, CONTINUE = (
    "alive",
    "resume",
    "no_checkpoint",
    "died_before_start",
    "finished",
)
FRESH_WORD = "fresh"  # typed to confirm a start from step 0


@dataclasses.dataclass
class Offer:
    state: str  # one of the five above
    run_id: str
    question: str
    resume_label: str = ""  # the Enter choice (resume, or continue); "": none
    detail: str = ""  # what the resume continues, or why there is none
    fresh_label: str = "Start fresh from step 0"
    overrides: list[str] | None = None  # the launch's, editable (died before start)
    offending: list[int] = dataclasses.field(default_factory=list)  # indexes the error names
    error: str = ""  # the run's error line (died before start)
    config_toml: str | None = None  # its launch-config.toml: the edited overrides checked
    steps: int = 0  # a finished run's last step (the default of more steps)
    lr_held: str = ""  # a continue's lr, held (words)
    lr_new: str = ""  # … with a new schedule, for N steps: format(n=N, end=step)


@dataclasses.dataclass
class Choice:
    """What the dialog answers: sent as control.restart's arguments."""

    fresh: bool = False
    overrides: list[str] | None = None  # None: the parent's
    more_steps: int = 0
    new_schedule: bool = False


def launch_record(text: str | None) -> LaunchRecord | None:
    """launch.json's text as the agent read it (the host's file: untrusted), decoded through
    the contract; None when absent or unreadable."""
    if text is None:
        return None
    record = parse_launch(text)
    return None if isinstance(record, Unreadable) else record


def offending(overrides: list[str], error: str) -> list[int]:
    """The indexes of the overrides whose key the error line names (`train.lr: …`,
    `config: train.lr = abc: …`): the agent's rule too, as a plain restart is refused."""
    return named_overrides(overrides, error)


def error_line(s: Store) -> str:
    """The trainer's one-line `error: …` (bad input), else exit.json's error."""
    lines = [ln for ln in list(s.log_lines)[-8:] + list(s.launch_log)[-4:] if ln.strip()]
    errors = [ln for ln in lines if ln.startswith("error") or ln.startswith("config:")]
    if errors:
        return errors[-1]
    ex = s.exit_info()
    return (ex.error or "") if ex else ""


def lr_words(config_text: str | None) -> tuple[str, str]:
    """(the held lr's words, a new schedule's words as a format of n and end) from
    config.json's train section (the host's text: a bad value is left unsaid)."""
    train: object = {}
    try:
        data = json.loads(config_text) if config_text else {}
        train = data.get("train", {}) if isinstance(data, dict) else {}
    except (ValueError, RecursionError):
        pass
    train = train if isinstance(train, dict) else {}
    lr, ratio, warmup = train.get("lr"), train.get("min_lr_ratio"), train.get("warmup_steps")
    numbers = all(isinstance(v, int | float) and not isinstance(v, bool) for v in (lr, ratio))
    if not numbers:
        return (
            "the learning rate holds the schedule's final value",
            "a new schedule: warmup, then cosine over the {n} new steps to step {end}",
        )
    assert isinstance(lr, int | float) and isinstance(ratio, int | float)
    floor = lr * ratio
    w = warmup if isinstance(warmup, int) and not isinstance(warmup, bool) else "?"
    return (
        f"the learning rate holds the schedule's final value ({floor:.3g})",
        f"a new schedule: warmup {w} steps to {lr:.3g}, cosine down to {floor:.3g} at step {{end}}",
    )


def offer(s: Store, launch: LaunchRecord | None, config_text: str | None = None) -> Offer:
    """What restart offers for the followed run in its state now."""
    run_id = s.run_id or "?"
    question = f"Restart run {run_id}?"
    if s.process_alive():
        step = s.heartbeat.step if s.heartbeat else None
        where = f" (step {step} now)" if step is not None else ""
        return Offer(
            ALIVE,
            run_id,
            f"{question} It is stopped first (SIGTERM) and checkpoints as it stops.",
            f"Resume from where it stops{where}",
            "The new run continues from its newest good checkpoint, in a new run dir.",
        )
    outcome = s.outcome()
    run = s.current_run()
    point = run.resume if run else None
    # Died before its first step, as the diagnosis says it (died_at_start): also a run that
    # wrote a heartbeat and then failed reading the target or building the model.
    if outcome is not None and (outcome.kind == DIED or died_before_start(s)):
        overrides = list(launch.overrides) if launch is not None else None
        error = error_line(s)
        return Offer(
            DIED_BEFORE_START,
            run_id,
            f"Run {run_id} died before its first step: relaunching it as it was dies the same "
            "way. Keep, edit or drop each override (or add one), then relaunch from step 0.",
            fresh_label="Relaunch from step 0 with the overrides below",
            overrides=overrides,
            offending=offending(overrides or [], error),
            error=error,
        )
    if outcome is not None and outcome.kind == FINISHED:
        steps = outcome.step or (s.heartbeat.step if s.heartbeat else 0) or 0
        held, new = lr_words(config_text)
        where = f" from {point.name}" if point is not None and point.name else ""
        return Offer(
            CONTINUE,
            run_id,
            f"Run {run_id} finished at step {steps}. Continue it (a new run resuming its final "
            f"checkpoint{where}, the data position carried on), or start a new run?",
            "Continue",
            fresh_label="New run from step 0",
            steps=steps,
            lr_held=held,
            lr_new=new,
        )
    if point is None:  # the runs list has not said yet: the agent chooses as it restarts
        return Offer(
            RESUME, run_id, f"{question} (launch the same config in a new run dir)",
            "Resume from its newest good checkpoint",
        )  # fmt: skip
    if point.name is not None:
        of = f" of {point.run_id}" if point.run_id != s.run_id else ""
        return Offer(
            RESUME,
            run_id,
            f"{question} (launch the same config in a new run dir)",
            f"Resume from step {point.step}",
            point.describe() + of,
        )
    return Offer(
        NO_CHECKPOINT,
        run_id,
        f"{question} It has no good checkpoint: the new run starts at step 0.",
        detail=point.describe(),
        fresh_label="Restart from step 0",
    )

"""How a run ended, settled once from its files: every view and rule says the same word.

running            the run's lock is held (or its process lives)
finished           reached its last step
stopped            SIGTERM/SIGINT before the last step; checkpointed, resumable (a final
                   checkpoint that failed is said, with the step a restart resumes from)
crashed            an exception (the heartbeat names the thread) or a non-zero exit
killed             a signal ended the process (SIGKILL, the OOM killer), or it vanished
                   without an exit record; said `killed (SIGKILL)`
died_before_start  it exited before it was a run: no heartbeat (bad config, missing
                   interpreter, import error); only launch.json/launch.log/exit.json exist
"""

from __future__ import annotations

import dataclasses
from typing import Any

from trainer.contract.checkpoints import ResumePoint, step_of
from trainer.contract.heartbeat import Heartbeat
from trainer.contract.phases import CRASHED, FINAL_PHASES, STOPPED
from trainer.contract.phases import FINISHED as FINISHED_PHASE
from trainer.contract.records import ExitRecord

RUNNING, FINISHED, STOPPED_EARLY, CRASH, KILLED, DIED, UNKNOWN = (
    "running",
    "finished",
    "stopped",
    "crashed",
    "killed",
    "died_before_start",
    "unknown",
)
OUTCOMES = (RUNNING, FINISHED, STOPPED_EARLY, CRASH, KILLED, DIED, UNKNOWN)
EXIT_COULD_NOT_START = 127  # the wrapper could not exec the trainer
STOP_SIGNALS = ("SIGTERM", "SIGINT")


@dataclasses.dataclass(frozen=True)
class Outcome:
    kind: str  # one of OUTCOMES
    summary: str  # one line for a person: "stopped at step 51 of 400, checkpoint …"
    step: int | None = None
    total_steps: int | None = None
    exit_code: int | None = None
    signal: str | None = None
    thread: str | None = None  # the thread that raised (crashed)
    checkpoint: str | None = None  # the latest checkpoint, relative to the run dir
    # Where a restart continues, when the sidecars were read (the agent): the newest *good*
    # checkpoint, which after a NaN is older than `checkpoint`, or in the run it resumed from.
    resume: ResumePoint | None = None

    @property
    def word(self) -> str:
        """The outcome in a word or two, as a status line shows it: `killed (SIGKILL)`."""
        if self.kind == KILLED and self.signal:
            return f"killed ({self.signal})"
        return self.kind.replace("_", " ")

    @property
    def resumable(self) -> bool:
        if self.kind not in (STOPPED_EARLY, CRASH, KILLED):
            return False
        if self.resume is not None:
            return self.resume.name is not None
        return self.checkpoint is not None


# A step past this is no real run's (a hostile or torn file): said as such, not as 400 digits.
PLAUSIBLE_STEP = 10**12


def _step(n: int) -> str:
    return str(n) if 0 <= n <= PLAUSIBLE_STEP else f"{'>1e12' if n > 0 else '<0'} (implausible)"


def _at(step: int | None, total: int | None) -> str:
    if step is None:
        return ""
    return f" at step {_step(step)}" + (f" of {_step(total)}" if total else "")


def _resume_words(latest: str | None, resume: ResumePoint | None, run_id: str | None) -> str:
    """ ", checkpoint X: resumable", or what a restart will really do when the newest
    checkpoint is not good."""
    if resume is None:
        return f", checkpoint {latest}: resumable" if latest else ""
    if resume.name is None:
        return ", no good checkpoint: restart starts at step 0" if latest or resume.skipped else ""
    if run_id is not None and resume.run_id != run_id:
        return f", resumable from {resume.name} of {resume.run_id}"
    if latest is not None and latest != resume.name:
        return f", checkpoint {latest} not good: resumable from {resume.name}"
    return f", checkpoint {resume.name}: resumable"


def outcome_of(
    alive: bool,
    heartbeat: Heartbeat | None,
    exit_record: ExitRecord | None,
    checkpoint: str | None = None,
    last_words: str = "",
    resume: ResumePoint | None = None,
) -> Outcome:
    """`checkpoint`: the newest checkpoint file (relative path), if any; `last_words`: the
    logs' last line that is not a step line, for runs that recorded no error; `resume`:
    where a restart would continue (the agent read the sidecars), None when not known."""
    hb = heartbeat
    step = exit_record.step if exit_record and exit_record.step is not None else None
    if step is None and hb is not None:
        step = hb.step
    total = (exit_record.total_steps if exit_record else None) or (hb.total_steps if hb else None)
    checkpoint = (
        (exit_record.checkpoint if exit_record else None)
        or (hb.last_checkpoint.path if hb and hb.last_checkpoint else None)
        or checkpoint
    )
    facts = Outcome(UNKNOWN, "", step=step, total_steps=total, checkpoint=checkpoint, resume=resume)

    def said(kind: str, summary: str, **more: Any) -> Outcome:
        return dataclasses.replace(facts, kind=kind, summary=summary, **more)

    if alive:
        phase = hb.phase if hb else "starting"
        return said(RUNNING, f"running ({phase}){_at(step, total)}")
    if exit_record is None and hb is None:
        return said(UNKNOWN, "no heartbeat and no exit record")

    code = exit_record.exit_code if exit_record else hb.exit_code if hb else None
    signal = exit_record.signal if exit_record else None
    final = (exit_record.final_phase if exit_record else None) or (hb.phase if hb else None)
    error = (hb.error.message if hb and hb.error else None) or (
        exit_record.error if exit_record else None
    )
    facts = dataclasses.replace(facts, exit_code=code, signal=signal)
    run_id = hb.run_id if hb else exit_record.run_id if exit_record else None
    resumable = _resume_words(checkpoint, resume, run_id)
    # A stop signal that lands after the trainer wrote its final heartbeat (a second kill, a
    # group signal during teardown) ends the process, not the run: the run says how it ended.
    late_stop = (
        signal in STOP_SIGNALS
        and hb is not None
        and hb.phase in (STOPPED, FINISHED_PHASE)
        and hb.exit_code == 0
    )

    if hb is None:  # it never wrote a heartbeat: it was not a run yet
        how = f"killed by {signal}" if signal else f"exit code {code}"
        words = error or last_words
        return said(DIED, f"died before start ({how})" + (f": {words}" if words else ""))
    if signal and not late_stop:
        return said(KILLED, f"killed ({signal}){_at(step, total)}{resumable}")
    if code is None and final not in FINAL_PHASES:
        return said(
            KILLED,
            f"vanished{_at(step, total)} with no exit record (last phase {final}){resumable}",
        )
    if code not in (0, None) or final == CRASHED:
        thread = hb.error.thread if hb.error else None
        where = f" in {thread}" if thread else ""
        words = error or last_words or f"exit code {code}"
        if exit_record is not None and exit_record.failed_rank is not None:
            where, words = "", exit_record.failed_rank.describe()  # the cause, not this rank
        return said(CRASH, f"crashed{where}{_at(step, total)}: {words}", thread=thread)
    # A clean exit: schema 1 said `finished` for a stop too, so the step settles it.
    failed = _final_failure(hb, step, checkpoint, resume)
    if final == STOPPED or (step is not None and total and step < total):
        return said(STOPPED_EARLY, f"stopped{_at(step, total)}{failed or resumable}")
    return said(FINISHED, f"finished{_at(step, total)}{failed}")


def _final_failure(
    hb: Heartbeat, step: int | None, latest: str | None, resume: ResumePoint | None
) -> str:
    """ "; final checkpoint failed: WHY; resumes from step M" for a run whose last save
    failed (its previous checkpoint is where a restart continues), else ""."""
    plan = hb.checkpoints
    if plan is None or plan.failed is None or plan.failed.step != step:
        return ""
    if resume is not None:
        at = resume.step if resume.name is not None else None
    else:
        at = step_of(latest.rsplit("/", 1)[-1]) if latest else None
    then = f"resumes from step {at}" if at is not None else "no checkpoint: a restart starts at 0"
    if resume is not None and at is not None and resume.run_id != hb.run_id:
        then += f" of {resume.run_id}"
    return f"; final checkpoint failed: {plan.failed.message}; {then}"

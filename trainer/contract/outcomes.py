"""How a run ended, settled once from its files: every view and rule says the same word.

running            the run's lock is held (or its process lives)
finished           reached its last step
stopped            SIGTERM/SIGINT before the last step; checkpointed, resumable
crashed            an exception (the heartbeat names the thread) or a non-zero exit
killed             a signal ended the process (SIGKILL, the OOM killer), or it vanished
                   without an exit record
died_before_start  it exited before it was a run: no heartbeat (bad config, missing
                   interpreter, import error); only launch.json/launch.log/exit.json exist
"""

from __future__ import annotations

import dataclasses
from typing import Any

from trainer.contract.heartbeat import Heartbeat
from trainer.contract.phases import CRASHED, FINAL_PHASES, STOPPED
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

    @property
    def resumable(self) -> bool:
        return self.checkpoint is not None and self.kind in (STOPPED_EARLY, CRASH, KILLED)


def _at(step: int | None, total: int | None) -> str:
    if step is None:
        return ""
    return f" at step {step}" + (f" of {total}" if total else "")


def outcome_of(
    alive: bool,
    heartbeat: Heartbeat | None,
    exit_record: ExitRecord | None,
    checkpoint: str | None = None,
    last_words: str = "",
) -> Outcome:
    """`checkpoint`: the newest checkpoint file (relative path), if any; `last_words`: the
    logs' last line that is not a step line, for runs that recorded no error."""
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
    facts = Outcome(UNKNOWN, "", step=step, total_steps=total, checkpoint=checkpoint)

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
    resume = f", checkpoint {checkpoint}: resumable" if checkpoint else ""

    if hb is None:  # it never wrote a heartbeat: it was not a run yet
        how = f"killed by {signal}" if signal else f"exit code {code}"
        words = error or last_words
        return said(DIED, f"died before start ({how})" + (f": {words}" if words else ""))
    if signal:
        return said(KILLED, f"killed by {signal}{_at(step, total)}{resume}")
    if code is None and final not in FINAL_PHASES:
        return said(
            KILLED, f"vanished{_at(step, total)} with no exit record (last phase {final}){resume}"
        )
    if code not in (0, None) or final == CRASHED:
        thread = hb.error.thread if hb.error else None
        where = f" in {thread}" if thread else ""
        words = error or last_words or f"exit code {code}"
        return said(CRASH, f"crashed{where}{_at(step, total)}: {words}", thread=thread)
    # A clean exit: schema 1 said `finished` for a stop too, so the step settles it.
    if final == STOPPED or (step is not None and total and step < total):
        return said(STOPPED_EARLY, f"stopped{_at(step, total)}{resume}")
    return said(FINISHED, f"finished{_at(step, total)}")

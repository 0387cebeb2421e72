"""A plain restart relaunches the run's own overrides: refused when the run died of one.

A run that died before its first step with an error naming one of its `--set` keys (a key
that passes the config's own rules but fails once the target is read or the model is built:
`drafter.target_layer_ids = [99]: the target has layers 0..7`) dies the same way when it
is launched again as it was. The restart is refused before anything is stopped or
launched, a line per override the error names, with the `--drop KEY` that relaunches
without it. The error is the run's own (heartbeat, exit.json, else its logs' last words):
host files, so it is bounded to one line here and sanitized where it is printed.
"""

from __future__ import annotations

import os

from dflash_tui.agent.errors import CommandError
from dflash_tui.agent.files import tail_or_empty
from dflash_tui.agent.runs import last_words
from trainer.contract.heartbeat import Heartbeat, read_heartbeat
from trainer.contract.records import (
    HEARTBEAT,
    TRAIN_LOG,
    ExitRecord,
    named_overrides,
    override_key,
    read_exit,
)

ERROR_CHARS = 200  # of the run's error, quoted in the refusal
LOG_TAIL_BYTES = 16 << 10  # where the trainer's closing `error:` lines are


def died_of(run_dir: str, overrides: list[str]) -> list[str]:
    """The error lines a run that died before its first step recorded that name one of
    `overrides`; none when the run did not die so (alive, trained, ended cleanly) or its
    error names none of them (a restart as it was may well start: an OOM, a lost host)."""
    ended = read_exit(run_dir)
    if not isinstance(ended, ExitRecord) or (ended.exit_code == 0 and not ended.error):
        return []
    hb = read_heartbeat(os.path.join(run_dir, HEARTBEAT))
    hb = hb if isinstance(hb, Heartbeat) else None
    if ended.step or (hb is not None and hb.step):
        return []  # it trained: the model its overrides made was built
    recorded = (hb.error.message if hb and hb.error else None) or ended.error
    errors = [recorded] if recorded else _closing_errors(run_dir) or [last_words(run_dir)]
    return [e for e in errors if e and named_overrides(overrides, e)]


def _closing_errors(run_dir: str) -> list[str]:
    """The `error:` lines train.log ends with: the trainer refuses bad overrides a line
    each (trainer/config.py OverrideErrors), so the last line alone names only one. Only
    train.log: the wrapper opens it before the trainer starts (agent/wrap.py) and gives it
    the trainer's stdout and stderr, so launch.log never holds the trainer's own words."""
    lines = tail_or_empty(run_dir, TRAIN_LOG, LOG_TAIL_BYTES).splitlines()
    closing: list[str] = []
    for raw in reversed(lines):
        if not raw.startswith("error: "):
            break
        closing.insert(0, raw.strip())
    return closing


def refuse_reused(run_id: str, run_dir: str, overrides: list[str]) -> None:
    """CommandError (bad input: exit 2), a line per override the run died of, when a restart
    would launch `overrides` (the run's own, reused) again."""
    lines: list[str] = []
    named: set[int] = set()
    for error in died_of(run_dir, overrides):
        said = " ".join(error.split()).removeprefix("ConfigError: ").removeprefix("error: ")
        said = said if len(said) <= ERROR_CHARS else said[: ERROR_CHARS - 3] + "..."
        for i in named_overrides(overrides, error):
            if i in named:
                continue
            named.add(i)
            key = override_key(overrides[i])
            lines.append(
                f"restart: {run_id} died before its first step of --set {overrides[i]} "
                f"({said}); as it was it dies again: restart --drop {key} (or --set {key}=VALUE)"
            )
    if lines:
        raise CommandError("\n".join(lines), bad_input=True)

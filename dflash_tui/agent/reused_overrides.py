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
from dflash_tui.agent.runs import last_words
from trainer.contract.heartbeat import Heartbeat, read_heartbeat
from trainer.contract.records import (
    HEARTBEAT,
    ExitRecord,
    named_overrides,
    override_key,
    read_exit,
)

ERROR_CHARS = 200  # of the run's error, quoted in the refusal


def died_of(run_dir: str, overrides: list[str]) -> str | None:
    """The error a run that died before its first step recorded, when it names one of
    `overrides`; None when the run did not die so (alive, trained, ended cleanly) or its
    error names none of them (a restart as it was may well start: an OOM, a lost host)."""
    ended = read_exit(run_dir)
    if not isinstance(ended, ExitRecord) or (ended.exit_code == 0 and not ended.error):
        return None
    hb = read_heartbeat(os.path.join(run_dir, HEARTBEAT))
    hb = hb if isinstance(hb, Heartbeat) else None
    if ended.step or (hb is not None and hb.step):
        return None  # it trained: the model its overrides made was built
    error = (hb.error.message if hb and hb.error else None) or ended.error or last_words(run_dir)
    return error if error and named_overrides(overrides, error) else None


def refuse_reused(run_id: str, run_dir: str, overrides: list[str]) -> None:
    """CommandError (bad input: exit 2), a line per override the run died of, when a restart
    would launch `overrides` (the run's own, reused) again."""
    error = died_of(run_dir, overrides)
    if error is None:
        return
    said = " ".join(error.split()).removeprefix("ConfigError: ")  # its own words follow
    said = said if len(said) <= ERROR_CHARS else said[: ERROR_CHARS - 3] + "..."
    lines = []
    for i in named_overrides(overrides, error):
        key = override_key(overrides[i])
        lines.append(
            f"restart: {run_id} died before its first step of --set {overrides[i]} ({said}); "
            f"as it was it dies again: restart --drop {key} (or --set {key}=VALUE)"
        )
    raise CommandError("\n".join(lines), bad_input=True)

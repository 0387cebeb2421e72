"""Restart's edits to a launch's overrides: `restart --set KEY=VALUE --drop KEY` and the
dialog's. A run that died before its first step (a bad `--set`) dies the same way when it
is launched again as it was: the operator drops or replaces the offending override first.

`edit` is the rule (the launch's list in, the new run's out); `edited_for` reads what it
needs of the run through the agent (launch.json's overrides, launch-config.toml's text) and
checks the new list as the trainer will, so a bad edit is refused before anything is
stopped or launched: one line per bad key, `config: KEY = VALUE: rule` as launch says it.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from dflash_tui import control
from dflash_tui.control import ControlError
from trainer.contract.records import (
    LAUNCH,
    LAUNCH_CONFIG,
    named_overrides,
    override_key,
    parse_launch,
)
from trainer.contract.typed import Unreadable

if TYPE_CHECKING:
    from dflash_tui.state import Store


def edit(launched: list[str], sets: list[str], drops: list[str]) -> list[str]:
    """The launch's overrides with each `drops` key removed, then each `sets` override put
    in the place of that key's (its first; a later duplicate goes) or added at the end.
    A drop of a key the run was not launched with, or a set that is not KEY=VALUE, is a
    line of the ControlError, every one of them."""
    bad = drop_errors(launched, drops) + set_errors(sets)
    if bad:
        raise ControlError("\n".join(bad))
    dropped = {d.strip() for d in drops}
    out = [o for o in launched if override_key(o) not in dropped]
    for s in sets:
        at = [i for i, o in enumerate(out) if override_key(o) == override_key(s)]
        if not at:
            out.append(s)
            continue
        out[at[0]] = s
        out = [o for i, o in enumerate(out) if i not in at[1:]]
    return out


def drop_errors(launched: list[str], drops: list[str]) -> list[str]:
    """A line for each `--drop` key the run was not launched with."""
    keys = [override_key(o) for o in launched]
    had = ", ".join(dict.fromkeys(keys)) or "none"
    return [
        f"config: --drop {k}: the run was not launched with it (its overrides: {had})"
        for k in dict.fromkeys(d.strip() for d in drops)
        if k not in keys
    ]


def set_errors(sets: list[str]) -> list[str]:
    """What is wrong with each `--set` that is not one line of KEY=VALUE (its value is
    checked against the run's config by `edited_for`)."""
    from trainer.config import show  # the trainer's quoting, as its own lines have it

    bad = [f"config: --set {show(s)}: one line, no newline in it" for s in sets if "\n" in s]
    return bad + [
        f"config: --set {show(s)}: expected section.key=value"
        for s in sets
        if "\n" not in s and ("=" not in s or not override_key(s))
    ]


@dataclasses.dataclass
class Edited:
    run_id: str
    overrides: list[str]  # the new run's
    launched: list[str]  # the parent's, as launch.json has them


async def edited_for(
    link: control.Requester,
    store: Store,
    run_id: str | None,
    sets: list[str],
    drops: list[str],
) -> Edited:
    """The run restart acts on (`run_id`, else the alive run, else the latest: the agent's
    own rule), its launch's overrides edited and checked against its launch-config.toml."""
    run_id = run_id or await which_run(link, store)
    record = parse_launch((await control.read_file(link, LAUNCH, run_id)).text)
    if isinstance(record, Unreadable):
        raise ControlError(f"run {run_id}: {LAUNCH} unreadable ({record.why}): nothing to edit")
    launched = list(record.overrides)
    # Every bad key is said at once: the drops and sets that are wrong in themselves, then
    # what the trainer would refuse in the list the good ones make.
    bad = drop_errors(launched, drops) + set_errors(sets)
    good_drops = [d for d in drops if not drop_errors(launched, [d])]
    overrides = edit(launched, [s for s in sets if not set_errors([s])], good_drops)
    config_toml = (await control.read_file(link, LAUNCH_CONFIG, run_id)).text
    try:
        control.check_overrides(overrides, config_toml)
    except ControlError as e:
        bad += str(e).split("\n")
    if bad:
        raise ControlError("\n".join(bad))
    return Edited(run_id, overrides, launched)


async def which_run(link: control.Requester, store: Store) -> str:
    """The alive run, else the latest, as the agent's restart picks it (runs.target_run)."""
    runs = await control.list_runs(link, store)
    if store.alive_run == "?":
        raise ControlError("cannot tell which run is alive: name it with --run")
    if store.alive_run is not None:
        return store.alive_run
    if not runs:
        raise ControlError("no runs to restart")
    return runs[-1].run_id


def problems(
    overrides: list[str], config_toml: str | None, died_of: list[str] | None = None
) -> list[str]:
    """What the trainer would refuse in `overrides` launched with `config_toml` (None: the
    run's config is not known here; each is checked as one line of KEY=VALUE only), a line
    each: the restart dialog says them and relaunches nothing. Each of `died_of` (the
    overrides the run's error names) kept as it was is a line too, unless said already: a
    key the config's rules pass may still fail once the target is read, and only the run's
    error tells (the agent refuses a plain restart so: agent/reused_overrides.py)."""
    bad = set_errors(overrides)
    if not bad and config_toml is not None:
        try:
            control.check_overrides(overrides, config_toml)
        except ControlError as e:
            bad = str(e).split("\n")
    kept = [o for o in dict.fromkeys(died_of or []) if o in overrides]
    said = set(named_overrides(kept, "\n".join(bad)))
    return bad + [
        f"config: {o}: the run died of it before its first step: drop it or edit it"
        for i, o in enumerate(kept)
        if i not in said
    ]

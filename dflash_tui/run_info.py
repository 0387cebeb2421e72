"""One run's record as the run-info screen (`i`) says it: how it ended and its exit, where a
restart continues, its environment and fast-kernel path, the overrides it was launched with
(launch.json: the `--set`s, the one its error names marked), and its whole config. Pure
Python: the runs list's `RunInfo`, launch.json's and config.json's text (as the agent read
them) in, lines out (host strings still raw: the screen shows them through widgets/safe.py)."""

from __future__ import annotations

import datetime
import json

from dflash_tui import control
from dflash_tui.compare import flatten
from dflash_tui.facts import run_outcome
from dflash_tui.fmt import count
from dflash_tui.restart_offer import error_line, launch_record, offending
from dflash_tui.state import Store
from trainer.contract.protocol import RunInfo


def _when(t: float | None) -> str:
    if not t:
        return "—"
    return datetime.datetime.fromtimestamp(t, datetime.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def launch_lines(launch_text: str | None, why_no_launch: str, error: str) -> list[str]:
    """The launch's overrides, one `--set` a line; the ones `error` names marked."""
    lines = ["launch overrides (launch.json)"]
    if launch_text is None:
        return [*lines, f"  — {why_no_launch or 'not written'} (not launched by dflash-tui?)"]
    record = launch_record(launch_text)
    if record is None:
        return [*lines, "  unreadable"]
    named = set(offending(record.overrides, error))
    for i, o in enumerate(record.overrides):
        lines.append(f"  --set {o}" + ("   <- the error names this key" if i in named else ""))
    if not record.overrides:
        lines.append("  (none)")
    if record.resumed_from:
        lines.append(f"  resumed from {record.resumed_from}, {record.checkpoint or '?'}")
    return lines


def describe(
    run: RunInfo | None,
    run_id: str,
    config_text: str | None,
    why_no_config: str = "",
    launch: list[str] | None = None,
) -> list[str]:
    """`launch`: launch_lines' (None: not read)."""
    lines = [f"run      {run_id}"]
    if run is None:
        lines.append("(not in the runs list yet)")
    else:
        outcome = run_outcome(run)
        lines += [
            f"name     {run.name or '—'}",
            f"created  {_when(run.created)}",
            f"outcome  {outcome.summary}",
            f"steps    {count(run.steps)}" + (f" (phase {run.phase})" if run.phase else ""),
        ]
        if run.best_tok_s:
            lines.append(
                f"tok/s    best {count(run.best_tok_s, sep=',')}"
                + (f", last {count(run.last_tok_s, sep=',')}" if run.last_tok_s else "")
            )
        e = run.exit
        if e is not None:
            how = [e.describe()]
            if e.ended_at:
                how.append(f"ended {_when(e.ended_at)}")
            if e.final_phase or e.step is not None:
                of = f" of {e.total_steps}" if e.total_steps else ""
                step = f" at step {e.step}{of}" if e.step is not None else ""
                how.append(f"in {e.final_phase or '?'}{step}")
            if e.checkpoint:
                how.append(f"last checkpoint {e.checkpoint}")
            lines.append("exit     " + "; ".join(how))
        elif run.alive:
            lines.append("exit     — (alive)")
        if run.resume is not None:
            lines.append(f"restart  {run.resume.describe()}")
        lines.append("")
        lines.append("environment")
        lines.append(
            "  "
            + (
                run.environment.describe()
                if run.environment
                else "— (not recorded: an older trainer, or it died before)"
            )
        )
        if run.preflight is not None:
            lines.append(f"  kernels ({run.preflight.device}): {run.preflight.summary()}")
    if launch is not None:
        lines += ["", *launch]
    lines.append("")
    lines.append("config (config.json)")
    if config_text is None:
        lines.append(f"  — {why_no_config or 'not written'}")
        return lines
    try:
        config = json.loads(config_text)
    except ValueError as e:
        lines.append(f"  unreadable: {e}")
        return lines
    if not isinstance(config, dict):
        lines.append("  unreadable: not an object")
        return lines
    for key, value in flatten(config).items():
        lines.append(f"  {key} = {json.dumps(value)}")
    return lines


async def _read(link: control.Requester, name: str, run_id: str) -> tuple[str | None, str]:
    """(the file's text, or None and why not)."""
    try:
        return (await control.read_file(link, name, run_id)).text, ""
    except Exception as e:  # the agent's refusal: no such file, refused (a symlink)
        return None, str(e)


async def fetch(link: control.Requester, store: Store, run_id: str) -> list[str]:
    """The run-info lines of `run_id`: its runs-list entry, its launch.json and config.json,
    read by the agent (a run dead before it wrote one says why)."""
    run = next((r for r in store.runs if r.run_id == run_id), None)
    launch_text, why_launch = await _read(link, "launch.json", run_id)
    text, why = await _read(link, "config.json", run_id)
    error = error_line(store) if run_id == store.run_id else ""
    return describe(run, run_id, text, why, launch_lines(launch_text, why_launch, error))

"""Comparing runs: what differs between their configs and environments, and a summary of
each (steps, final loss and acc, median tok/s, outcome, best held-out τ), for the compare
screen (widgets/compare.py) and `dflash-tui compare` (its text and `--json`).

Pure Python, no textual: it reads records (the runs list's `RunInfo`, config.json as the
agent read it, metrics.jsonl rows). Fetching them is `fetch_runs`, over any link.
"""

from __future__ import annotations

import json
import math
import statistics
from dataclasses import dataclass, field
from typing import Any

from dflash_tui import control
from dflash_tui.evaluation import best_tau
from dflash_tui.facts import run_outcome
from dflash_tui.fmt import count, implausible
from trainer.contract.protocol import RunInfo
from trainer.contract.records import MetricsRow, parse_metrics_line

# The last this many bytes of each run's metrics.jsonl are read (a few thousand rows): the
# final figures and the curves' recent part, bounded whatever the run's length (and, JSON
# escaped in the answer, well under the contract's MAX_LINE_BYTES).
METRICS_BYTES = 2 << 20
# config.json's `run` holds what differs between every two runs (id, pid, argv, times) and
# the environment, which is compared on its own (Environment.differences).
CONFIG_SKIP = ("run",)


class UnknownRun(control.ControlError):
    """A run id that is not under the run root."""


@dataclass
class RunData:
    info: RunInfo
    config: dict[str, Any] = field(default_factory=dict)
    config_error: str | None = None  # why config.json was not read (a run dead before it)
    metrics: list[MetricsRow] = field(default_factory=list)


@dataclass
class Summary:
    run_id: str
    steps: int
    final_loss: float | None
    final_acc: float | None
    median_tok_s: float | None
    outcome: str
    best_tau: str


def flatten(config: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """`{"train": {"lr": 1e-3}}` as `{"train.lr": 1e-3}`; lists stay values."""
    out: dict[str, Any] = {}
    for key, value in config.items():
        name = f"{prefix}{key}"
        if not prefix and key in CONFIG_SKIP:
            continue
        if isinstance(value, dict):
            out.update(flatten(value, name + "."))
        else:
            out[name] = value
    return out


def config_differences(runs: list[RunData]) -> dict[str, list[Any]]:
    """Each config key whose value is not the same in every run that has a config: key ->
    the value per run (None where a run's config lacks it, or it has none: a run dead before
    it wrote config.json is named apart, not counted as differing in every key)."""
    flat = [flatten(r.config) for r in runs]
    keys = sorted(set().union(*flat)) if flat else []
    out = {}
    for key in keys:
        values = [f.get(key) for f in flat]
        seen = {
            json.dumps(v, sort_keys=True) for v, r in zip(values, runs, strict=True) if r.config
        }
        if len(seen) > 1:
            out[key] = values
    return out


def environment_differences(runs: list[RunData]) -> dict[str, list[str]]:
    """Each later run's environment against the first's ("torch 2.5.1 → 2.6.0"); a run
    without a fingerprint (an older trainer, a run dead before it) is said to lack one."""
    if not runs:
        return {}
    base = runs[0].info.environment
    out: dict[str, list[str]] = {}
    for r in runs[1:]:
        env = r.info.environment
        if base is None or env is None:
            if base is not env:
                lacks = runs[0].info.run_id if base is None else r.info.run_id
                out[r.info.run_id] = [f"{lacks} has no environment recorded"]
            continue
        diffs = env.differences(base)
        if diffs:
            out[r.info.run_id] = diffs
    return out


def summarize(run: RunData) -> Summary:
    rows = run.metrics
    last = rows[-1] if rows else None
    toks = [r.tok_s for r in rows if r.tok_s > 0]
    # The last step it took (the heartbeat's), not only the last one logged to metrics.jsonl.
    steps = max(run.info.step or 0, run.info.steps, last.step if last else 0)
    return Summary(
        run_id=run.info.run_id,
        steps=steps,
        final_loss=last.loss if last else None,
        final_acc=last.acc if last else None,
        median_tok_s=statistics.median(toks) if toks else None,
        outcome=run_outcome(run.info).summary,
        best_tau=best_tau(run.info),
    )


def _finite(x: Any) -> Any:
    """A NaN or infinite loss as the string JSON has no number for ("nan"), else as is."""
    return str(x) if isinstance(x, float) and not math.isfinite(x) else x


def to_json(runs: list[RunData]) -> dict[str, Any]:
    return {
        "runs": [{k: _finite(v) for k, v in summarize(r).__dict__.items()} for r in runs],
        "config_differences": config_differences(runs),
        "environment_differences": environment_differences(runs),
    }


def _num(x: float | None, fmt: str) -> str:
    """A figure in its column; one no run can have (1e308 tok/s) said bounded, not in full."""
    if x is None:
        return "—"
    return implausible(x, negative=True) or format(x, fmt)


def describe(runs: list[RunData]) -> list[str]:
    """The comparison as text lines (host strings still raw: the caller sanitizes)."""
    head = f"{'RUN ID':45s} {'STEPS':>6} {'LOSS':>6} {'ACC':>6} {'MED TOK/S':>10} {'BEST τ':>8}"
    lines = [head + "  OUTCOME"]
    for r in runs:
        s = summarize(r)
        lines.append(
            f"{s.run_id[:45]:45s} {count(s.steps):>6} {_num(s.final_loss, '6.3f'):>6} "
            f"{_num(s.final_acc, '6.3f'):>6} {_num(s.median_tok_s, ',.0f'):>10} "
            f"{s.best_tau:>8}  {s.outcome}"
        )
    diffs = config_differences(runs)
    lines.append("")
    lines.append("config differences" + ("" if diffs else ": none"))
    for key, values in diffs.items():
        shown = "  ".join(
            json.dumps(v) if r.config else "—" for v, r in zip(values, runs, strict=True)
        )
        lines.append(f"  {key}: {shown}")
    for r in runs:
        if r.config_error:
            lines.append(f"  ({r.info.run_id}: {r.config_error})")
    env = environment_differences(runs)
    if all(r.info.environment is None for r in runs):
        lines.append("environment differences: not recorded (trainers from before the fingerprint)")
        return lines
    lines.append("environment differences" + ("" if env else ": none"))
    for run_id, what in env.items():
        lines.append(f"  {run_id} vs {runs[0].info.run_id}: {'; '.join(what)}")
    return lines


async def fetch_runs(link: control.Requester, runs: list[RunInfo], ids: list[str]) -> list[RunData]:
    """Each named run's config.json and the end of its metrics.jsonl, read by the agent
    (`read_file`, through open_in). An id not in `runs` raises UnknownRun naming it."""
    by_id = {r.run_id: r for r in runs}
    for run_id in ids:
        if run_id not in by_id:
            raise UnknownRun(f"no run {run_id!r} under the run root")
    out = []
    for run_id in ids:
        data = RunData(by_id[run_id])
        try:
            text = (await control.read_file(link, "config.json", run_id)).text
            parsed = json.loads(text)
            data.config = parsed if isinstance(parsed, dict) else {}
        except ValueError as e:
            data.config_error = f"config.json: {e}"
        except Exception as e:  # the agent's refusal (a run dead before it wrote one)
            data.config_error = str(e)
        try:
            text = (await control.read_file(link, "metrics.jsonl", run_id, METRICS_BYTES)).text
        except Exception:  # a run dead before its first step has none
            text = ""
        lines = text.splitlines()
        if len(text.encode()) >= METRICS_BYTES and lines:
            lines = lines[1:]  # the first may be cut by the byte bound
        for line in lines:
            row = parse_metrics_line(line)
            if isinstance(row, MetricsRow):
                data.metrics.append(row)
        out.append(data)
    return out

"""Diagnosis: rules that read the store and say what is wrong, with evidence and a fix.

Pure Python, shared by the headless view and the TUI. Each rule is a function of the store
(and the time) returning findings; `diagnose()` runs them all, most severe first.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from dflash_tui.state import Store

SEVERITY_ORDER = {"critical": 0, "warning": 1, "info": 2}
HEARTBEAT_MAX_INTERVAL_S = 2.0  # the contract: replaced every <= 2 s


@dataclass(frozen=True)
class Finding:
    severity: str  # critical | warning | info
    code: str
    title: str
    evidence: str
    action: str


Rule = Callable[[Store, float], list[Finding]]
RULES: list[Rule] = []


def rule(fn: Rule) -> Rule:
    RULES.append(fn)
    return fn


def _fmt_s(seconds: float) -> str:
    if seconds < 90:
        return f"{seconds:.0f}s"
    if seconds < 5400:
        return f"{seconds / 60:.0f}m"
    return f"{seconds / 3600:.1f}h"


@rule
def unreachable(s: Store, now: float) -> list[Finding]:
    if s.link.state in ("refused",):
        return [
            Finding(
                "critical",
                "link_refused",
                "connection refused",
                s.link.detail,
                "fix the SSH settings named above; dflash-tui will not retry",
            )
        ]
    if s.link.state in ("reconnecting", "connecting") and s.link.attempt > 0:
        return [
            Finding(
                "critical",
                "unreachable",
                f"cannot reach {s.target}",
                s.link.detail,
                "check the host and network; retrying with backoff",
            )
        ]
    return []


@rule
def crashed(s: Store, now: float) -> list[Finding]:
    hb = s.heartbeat or {}
    exit_info = s.exit_info() or {}
    if hb.get("phase") != "crashed" and not (
        exit_info and (exit_info.get("exit_code") not in (0, None) or exit_info.get("signal"))
    ):
        return []
    err = hb.get("error") or {}
    message = err.get("message") or exit_info.get("error") or ""
    where = f" in {err['thread']}" if err.get("thread") else ""
    how = (
        f"killed by {exit_info['signal']}"
        if exit_info.get("signal")
        else f"exit code {exit_info.get('exit_code', hb.get('exit_code'))}"
    )
    last_tb = (err.get("traceback") or "").strip().splitlines()[-1:] or [""]
    return [
        Finding(
            "critical",
            "crashed",
            f"run crashed{where} ({how})",
            message or last_tb[0],
            "read the traceback (heartbeat error / train.log), fix, then restart (r)",
        )
    ]


@rule
def died_before_log(s: Store, now: float) -> list[Finding]:
    exit_info = s.exit_info()
    if not exit_info or s.step_lines:
        return []
    if exit_info.get("exit_code") == 0 and not exit_info.get("error"):
        return []
    tail = [ln for ln in list(s.launch_log)[-3:] + list(s.log_lines)[-3:] if ln.strip()]
    return [
        Finding(
            "critical",
            "died_at_start",
            "the run exited before its first step",
            " | ".join(tail[-4:]) or str(exit_info),
            "see launch.log and train.log in the run dir; fix and relaunch",
        )
    ]


@rule
def stale_heartbeat(s: Store, now: float) -> list[Finding]:
    hb = s.heartbeat
    if not hb or hb.get("phase") in ("finished", "crashed"):
        return []
    age = s.heartbeat_age(now)
    if age is None or age <= 3 * HEARTBEAT_MAX_INTERVAL_S:
        return []
    alive = s.process_alive()
    what = "process dead" if alive is False else "process hung or dead"
    return [
        Finding(
            "critical",
            "stale_heartbeat",
            what,
            f"heartbeat is {_fmt_s(age)} old (pid {hb.get('pid')}, phase "
            f"{hb.get('phase')}); it is rewritten every <= 2 s by its own thread",
            "dump stacks (d); if nothing answers, kill (k) and restart (r)",
        )
    ]


@rule
def stalled_loop(s: Store, now: float) -> list[Finding]:
    hb = s.heartbeat
    if not hb or hb.get("phase") != "training" or not hb.get("last_step_at"):
        return []
    if (s.heartbeat_age(now) or 0) > 3 * HEARTBEAT_MAX_INTERVAL_S:
        return []  # the process itself is stale: stale_heartbeat says it
    since_step = float(hb["now"]) - float(hb["last_step_at"])
    threshold = 120.0
    if since_step < threshold:
        return []
    threads = [
        t for t in hb.get("threads") or [] if t.get("role") in ("drafter", "target", "prefetch")
    ]
    stuck = max(
        threads, key=lambda t: float(hb["now"]) - float(t.get("since", hb["now"])), default=None
    )
    where = (
        f"{stuck['name']} ({stuck.get('state')} for "
        f"{_fmt_s(float(hb['now']) - float(stuck.get('since', hb['now'])))})"
        if stuck
        else "an unknown thread"
    )
    return [
        Finding(
            "critical",
            "loop_stalled",
            f"training loop stalled in {where}",
            f"heartbeat fresh, but no step for {_fmt_s(since_step)} (step {hb.get('step')})",
            "dump stacks (d) to see where it waits",
        )
    ]


@rule
def output_buffered(s: Store, now: float) -> list[Finding]:
    hb = s.heartbeat
    if not hb or hb.get("phase") != "training" or not s.follow_received:
        return []
    step = int(hb.get("step") or 0)
    last_line_step = s.step_lines[-1]["step"] if s.step_lines else 0
    if step - last_line_step < 2:
        return []
    reference = s.last_step_line_at
    if reference is None:
        started = [h for h in hb.get("phase_history") or [] if h.get("phase") == "training"]
        reference = float(started[-1]["started_at"]) if started else None
    if reference is None or s.remote_now(now) - reference < 60:
        return []
    return [
        Finding(
            "warning",
            "output_buffered",
            "output buffered: steps advance, no step line",
            f"heartbeat at step {step}, train.log's last step line is "
            f"{'step ' + str(last_line_step) if s.step_lines else 'none'}",
            "run python with -u or PYTHONUNBUFFERED=1, or print(..., flush=True)",
        )
    ]


def diagnose(s: Store, now: float | None = None) -> list[Finding]:
    now = time.time() if now is None else now
    found: list[Finding] = []
    for r in RULES:
        found.extend(r(s, now))
    return sorted(found, key=lambda f: SEVERITY_ORDER.get(f.severity, 9))

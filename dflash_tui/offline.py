"""What the views say while there is no connection, and which controls they refuse.

Without a live agent session the panes' own empty states lie ("no run under the run root
yet", "waiting for GPU samples…"): nothing was asked. Every pane says instead that it is not
connected, why, and when the link tries again; a control key is refused at once with the same
reason, not sent into a link that cannot carry it (an error toast 30 s later). With a
connection but no run, a control that needs a run says there is none, under which root.

Pure: reads the store only (no textual), for the TUI's panes and its control keys.
"""

from __future__ import annotations

from dflash_tui.state import Store

# The control actions (RunControl.start's names, app_control.py) that need a run: the alive
# one (what they signal when no run is named), or the followed one (what restart launches
# again).
NEEDS_ALIVE_RUN = ("kill", "dump stacks")
NEEDS_RUN = ("restart",)


def not_connected(s: Store, now: float | None = None) -> str | None:
    """`not connected to gpu-box: connection refused (retrying in 4 s)`; None when connected.
    The text quotes the link's detail (the host's words): a view shows it through `safe`."""
    link = s.link
    if link.state == "connected":
        return None
    why = link.failure or link.detail
    if link.state == "refused":
        return f"not connected to {s.target}: {why} (not retrying)"
    if link.state == "reconnecting" and link.retry_in is not None:
        now = s.clock() if now is None else now
        left = max(0.0, link.retry_in - (now - link.since))
        return f"not connected to {s.target}: {why} (retrying in {left:.0f} s)"
    if link.state == "connecting" and link.failure:
        return f"not connected to {s.target}: {why} (trying again)"
    if link.state == "closed":
        return f"not connected to {s.target}: the link is closed"
    return f"not connected to {s.target}: connecting ({link.detail or s.target})…"


def run_root(s: Store) -> str:
    """The run root the agent searched (its own, with ~ expanded); '' before its hello."""
    return s.hello.run_root if s.hello is not None else ""


def no_run(s: Store) -> str:
    root = run_root(s)
    return f"no run under {root} yet" if root else "no run under the run root yet"


def control_refusal(s: Store, action: str, now: float | None = None) -> str | None:
    """Why control `action` cannot be sent now, in one line; None when it can."""
    offline = not_connected(s, now)
    if offline is not None:
        return f"{action}: {offline}"
    if action in NEEDS_RUN and s.run_id is None:
        return f"{action}: {no_run(s)}"
    # Alive by the runs list, or by the followed run's own liveness (a trainer the agent did
    # not launch: its heartbeat's pid): the agent's rule decides the rest, as it did before.
    # Refused here only when known dead: in the seconds after attaching, before the runs list
    # and the liveness have come, the header already says `training`, and a refusal then
    # would contradict it (the agent proves the pid is the run's before it signals anything).
    alive = s.alive_run is not None or s.process_alive() is True
    unknown = not s.runs_received and s.process_alive() is None
    if action in NEEDS_ALIVE_RUN and not alive and not unknown:
        if s.run_id is None:
            return f"{action}: {no_run(s)}"
        outcome = s.outcome()
        how = f" ({s.run_id}: {outcome.summary})" if outcome is not None else ""
        return f"{action}: no run is alive under {run_root(s) or 'the run root'}{how}"
    return None

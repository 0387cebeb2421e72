"""The fleet: every named target of ~/.config/dflash-tui/config.toml on one screen or in one
cron check. Pure: a row from a target's store, the words for its connection, the worst
status over the rows. The links live in fleet_links.py, the views in fleet_headless.py and
widgets/fleet.py.

A row's status is what `dflash-tui status` would exit with for that target alone
(headless.exit_code_for: 0 ok, 1 warning, 2 critical, 3 unreachable); the fleet's is the
largest of them, so a cron job sees the worst target.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from dflash_tui import sanitize
from dflash_tui.diagnosis import DiagnosisConfig, Finding, diagnose
from dflash_tui.fmt import count, duration, rate
from dflash_tui.headless import EXIT_OK, EXIT_UNREACHABLE, exit_code_for
from dflash_tui.state import Store
from dflash_tui.targets import (
    Target,
    TargetError,
    load_user_targets,
    resolve_target,
    user_config_path,
)

STATUS_WORDS = {0: "ok", 1: "warning", 2: "critical", 3: "unreachable"}


def configured_targets(
    path: Path | None = None, only: tuple[str, ...] | None = None
) -> list[Target]:
    """The named targets, in the config's order (`only`: these, in this order: a group's
    hosts); none is bad input, said in one line."""
    path = path or user_config_path()
    named = load_user_targets(path)
    if only is not None:
        return [resolve_target(name, config_path=path) for name in only]
    if not named:
        raise TargetError(
            f"fleet: no targets in {path}: add one as [targets.NAME] with "
            'target = "ssh://user@host" (or "local") and run_root = "DIR"'
        )
    return [resolve_target(name, config_path=path) for name in named]


@dataclass(frozen=True)
class FleetRow:
    """One target as the fleet shows it. Strings are the host's where they quote it (run id,
    phase, the finding, the link's detail): exact here, made visible by each view."""

    name: str
    connection: str  # connected | connecting | reconnecting: CAUSE | refused: CAUSE | …
    run_id: str | None
    phase: str | None
    step: int | None
    tok_s: float | None
    worst: Finding | None
    heartbeat_age_s: float | None
    status: int  # the exit code `status` would give this target

    @property
    def status_word(self) -> str:
        return STATUS_WORDS.get(self.status, str(self.status))

    def worst_text(self) -> str:
        return "—" if self.worst is None else f"{self.worst.severity}: {self.worst.title}"

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["status_word"] = self.status_word
        return data

    def line(self) -> str:
        """One line for headless: every field, the host's strings made visible."""
        fields = [self.connection]
        if self.run_id is not None or self.phase is not None:
            fields.append(f"run {self.run_id or '—'}")
            fields.append(self.phase or "no heartbeat")
            if self.step is not None:
                fields.append(f"step {count(self.step)}")
            if self.tok_s is not None:
                fields.append(rate(self.tok_s))
            if self.heartbeat_age_s is not None:
                fields.append(f"hb {duration(self.heartbeat_age_s)} ago")
        elif self.status != EXIT_UNREACHABLE:
            fields.append("no run")
        if self.worst is not None:
            fields.append(f"! {self.worst_text()}")
        return sanitize.field(f"{self.name:12s} {self.status_word:11s} " + " | ".join(fields))


def connection_text(store: Store, cause: str | None = None, gave_up: bool = False) -> str:
    """The link in a few words, with why it is down: `cause` is the link's last failure
    (its `connecting` events carry no cause, so the fleet keeps the one before). `gave_up`:
    --once stopped waiting for this target's first session."""
    link = store.link
    if link.state == "connected":
        return "connected"
    # The transport says `HOST unreachable: WHY`; the word leads here, the host is the row's
    why = (cause or link.detail or "no answer").split(" unreachable: ", 1)[-1]
    if link.state == "refused":
        return f"refused: {why}"
    if gave_up:
        return f"unreachable: {why}"
    if cause is None:
        return "connecting"
    if link.sessions == 0:
        return f"unreachable: {why} (retrying)"
    return f"reconnecting: {why}"


def row_of(
    target: Target,
    store: Store,
    config: DiagnosisConfig,
    now: float | None = None,
    cause: str | None = None,
    gave_up: bool = False,
) -> FleetRow:
    """The row of one target, its findings by the same rules as its dashboard."""
    findings = diagnose(store, now, config) if store.hello is not None else []
    phase, _ = store.shown_phase()
    hb = store.heartbeat
    status = EXIT_UNREACHABLE if gave_up else exit_code_for(store, findings)
    return FleetRow(
        name=target.name,
        connection=connection_text(store, cause, gave_up),
        run_id=store.run_id,
        phase=phase,
        step=hb.step if hb else None,
        tok_s=hb.tok_s if hb else None,
        worst=findings[0] if findings else None,  # diagnose sorts the worst first
        heartbeat_age_s=store.heartbeat_age(now),
        status=status,
    )


def worst_status(rows: list[FleetRow]) -> int:
    """The fleet's exit status: its worst target's (3 unreachable above 2 critical)."""
    return max((r.status for r in rows), default=EXIT_OK)

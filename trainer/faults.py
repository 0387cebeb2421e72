"""Failure injection for tests and drills: DFLASH_FAULT="role:n" raises in that thread role.

Roles: prefetch, target, drafter. n counts the items that role has handled (from 0). The
failure travels the real path: the thread raises, the run stops, the traceback lands in the
heartbeat, the process exits non-zero.
"""

from __future__ import annotations

import os


class InjectedFault(RuntimeError):
    pass


def parse_fault(spec: str | None) -> tuple[str, int] | None:
    if not spec:
        return None
    role, _, n = spec.partition(":")
    if role not in ("prefetch", "target", "drafter") or not n.isdigit():
        raise ValueError(f"DFLASH_FAULT={spec!r}: expected prefetch|target|drafter:N")
    return role, int(n)


class FaultPlan:
    def __init__(self, spec: str | None = None) -> None:
        self.fault = parse_fault(spec if spec is not None else os.environ.get("DFLASH_FAULT"))

    def check(self, role: str, item: int) -> None:
        if self.fault == (role, item):
            raise InjectedFault(f"injected fault in {role} at item {item} (DFLASH_FAULT)")

"""What a rule returns (`Finding`) and the registry of rules with their documentation."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from dflash_tui.diagnosis.config import DiagnosisConfig
from dflash_tui.state import Store


@dataclass(frozen=True)
class Finding:
    severity: str  # critical | warning | info
    code: str
    title: str
    evidence: str
    action: str


Rule = Callable[[Store, float, DiagnosisConfig], list[Finding]]
R = TypeVar("R", bound=Rule)


def rule(fn: R) -> R:
    """Mark a rule; `diagnose` runs the rules in the order of `RULES` (the package's)."""
    return fn

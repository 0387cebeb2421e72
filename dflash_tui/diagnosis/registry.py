"""What a rule returns (`Finding`), and the registry: every rule with its documentation.

A rule is registered with `@rule(Code(...), ..., reads=, decides=, action=, thresholds=)`:
the codes it raises with their severities and a one-line summary, what it reads, how it
decides (its thresholds named as `DiagnosisConfig` keys, checked here at import), and what an
operator should do. `dflash-tui explain` and docs/findings.md are generated from `DOCS`
(docs.py); the order `diagnose()` runs the rules in is the package's `RULES`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import TypeVar

from dflash_tui.diagnosis.config import SEVERITY_ORDER, DiagnosisConfig
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

THRESHOLDS = frozenset(f.name for f in fields(DiagnosisConfig))


@dataclass(frozen=True)
class Code:
    """One finding code a rule raises: at which severities, and what it means in a line."""

    code: str
    severities: tuple[str, ...]
    summary: str


@dataclass(frozen=True)
class RuleDoc:
    """A rule's documentation: the codes it raises, what it reads, how it decides (with the
    `DiagnosisConfig` keys it compares against), and what to do."""

    rule: str  # the rule function's name
    module: str  # its module in dflash_tui/diagnosis/
    codes: tuple[Code, ...]
    reads: str
    decides: str
    thresholds: tuple[str, ...]
    action: str

    def all_codes(self) -> list[str]:
        return [c.code for c in self.codes]


DOCS: dict[str, RuleDoc] = {}  # by rule name


def document(doc: RuleDoc) -> RuleDoc:
    """Check a rule's documentation and keep it: every severity known, every threshold a
    `DiagnosisConfig` key, every code raised by one rule only."""
    for c in doc.codes:
        unknown = [sev for sev in c.severities if sev not in SEVERITY_ORDER]
        if unknown or not c.severities or not c.summary:
            raise ValueError(f"rule {doc.rule}: code {c.code}: severities {c.severities}")
        owner = next((d.rule for d in DOCS.values() if c.code in d.all_codes()), None)
        if owner not in (None, doc.rule):
            raise ValueError(f"rule {doc.rule}: code {c.code} is rule {owner}'s")
    invented = [t for t in doc.thresholds if t not in THRESHOLDS]
    if invented:
        raise ValueError(f"rule {doc.rule}: no DiagnosisConfig key {', '.join(invented)}")
    if not (doc.codes and doc.reads and doc.decides and doc.action):
        raise ValueError(f"rule {doc.rule}: documentation incomplete")
    DOCS[doc.rule] = doc
    return doc


def rule(
    *codes: Code,
    reads: str,
    decides: str,
    action: str,
    thresholds: tuple[str, ...] = (),
) -> Callable[[R], R]:
    """Register a rule with its documentation; the rule keeps its own signature."""

    def register(fn: R) -> R:
        name = getattr(fn, "__name__", repr(fn))
        module = getattr(fn, "__module__", "").rsplit(".", 1)[-1]
        document(RuleDoc(name, module, codes, reads, decides, thresholds, action))
        return fn

    return register

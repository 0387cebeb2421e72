"""The findings' documentation, generated from the registry (`registry.DOCS`).

`dflash-tui explain [CODE]` prints `explain(code)` or `listing()`; docs/findings.md is
`page()`, written by `python -m dflash_tui.diagnosis.docs --write` and checked by
`--check` and tests/monitor/test_findings_docs.py. The page says which recorded scenarios
raise each code (tests/fixtures/scenarios/recorded/, their unedited events run through
`diagnose` with the tests' own loader) and lists the codes none raises. `coverage()` adds the
test files that name each code in quotes (a grep: a file that names a code to say it is
absent counts too); the test requires one or the other for every code.
"""

from __future__ import annotations

import argparse
import difflib
import importlib
import re
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

from dflash_tui.diagnosis import DIAGNOSE_DOC, RULES
from dflash_tui.diagnosis.config import DEFAULT_CONFIG
from dflash_tui.diagnosis.registry import DOCS, Code, RuleDoc

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "findings.md"
WIDTH = 88


def rule_docs() -> list[RuleDoc]:
    """Every rule's documentation in the order `diagnose()` runs them; its own last."""
    return [DOCS[getattr(r, "__name__", "")] for r in RULES] + [DIAGNOSE_DOC]


def codes() -> dict[str, tuple[RuleDoc, Code]]:
    """Every finding code, with its rule's documentation, in the rules' order."""
    return {c.code: (d, c) for d in rule_docs() for c in d.codes}


def nearest(code: str) -> list[str]:
    return difflib.get_close_matches(code, list(codes()), n=3, cutoff=0.7)


def threshold_values(doc: RuleDoc) -> list[str]:
    """`stall_s = 120.0`: each threshold with its default in DiagnosisConfig."""
    return [
        f"{name} = {getattr(DEFAULT_CONFIG, name)!r}"
        + (" (off unless a target's config.toml sets it)" if name == "baseline_tok_s" else "")
        for name in doc.thresholds
    ]


def _wrap(label: str, text: str) -> list[str]:
    return textwrap.wrap(
        text, WIDTH, initial_indent=f"{label:<11}", subsequent_indent=" " * 11
    ) or [label]


def explain(code: str) -> str:
    """A code's entry: what it means, how it is decided (thresholds at their defaults), what
    to do. KeyError for an unknown code."""
    doc, c = codes()[code]
    others = [x for x in doc.all_codes() if x != code]
    where = f"dflash_tui/diagnosis/{doc.module}.py"
    lines = [f"{code} ({', '.join(c.severities)}): {c.summary}", ""]
    lines += _wrap(
        "rule", f"{doc.rule} in {where}" + (f"; also raises {', '.join(others)}" if others else "")
    )
    lines += _wrap("reads", doc.reads)
    lines += _wrap("decides", doc.decides)
    values = threshold_values(doc)
    lines += _wrap("thresholds", "DiagnosisConfig's defaults:" if values else "none")
    lines += [" " * 11 + v for v in values]
    lines += _wrap("to do", doc.action)
    return "\n".join(lines)


def listing() -> str:
    """Every code, one line each: the code, its severities, its summary."""
    rows = [(code, "/".join(c.severities), c.summary) for code, (_, c) in codes().items()]
    wide = max(len(r[0]) for r in rows)
    sev = max(len(r[1]) for r in rows)
    return "\n".join(f"{a:<{wide}}  {b:<{sev}}  {s}" for a, b, s in rows)


# -- which tests raise which code -----------------------------------------------------------
@dataclass(frozen=True)
class Coverage:
    recorded: tuple[str, ...]  # recorded scenarios whose events give the code
    tests: tuple[str, ...]  # test files naming the code in quotes

    def covered(self) -> bool:
        return bool(self.recorded or self.tests)


def recorded_codes(root: Path = ROOT) -> dict[str, list[str]]:
    """{code: the recorded scenarios that give it}, each scenario's events unedited, at the
    tests' clock, loaded and diagnosed by tests/monitor/test_diagnosis.py's `run`."""
    for folder in (root / "tests", root / "tests" / "monitor"):
        if str(folder) not in sys.path:
            sys.path.insert(0, str(folder))
    loader = importlib.import_module("test_diagnosis")
    out: dict[str, list[str]] = {}
    for path in sorted((root / "tests" / "fixtures" / "scenarios" / "recorded").glob("*.jsonl")):
        for f in loader.run(f"recorded/{path.name}"):
            names = out.setdefault(f.code, [])
            if path.stem not in names:
                names.append(path.stem)
    return out


def coverage(root: Path = ROOT) -> dict[str, Coverage]:
    recorded = recorded_codes(root)
    files = {
        p.relative_to(root).as_posix(): p.read_text()
        for p in sorted((root / "tests").rglob("test_*.py"))
        if p.name != "test_findings_docs.py"
    }
    out = {}
    for code in codes():
        quoted = re.compile(rf"[\"']{re.escape(code)}[\"']")
        tests = tuple(name for name, text in files.items() if quoted.search(text))
        out[code] = Coverage(tuple(recorded.get(code, ())), tests)
    return out


# -- the page -----------------------------------------------------------------------------
HEADER = """\
# Findings

Generated from the rules' registry (`dflash_tui/diagnosis/registry.py`, each rule's
`@rule(...)`) by `python -m dflash_tui.diagnosis.docs --write`; do not edit by hand
(`tests/monitor/test_findings_docs.py` fails when it is stale). `dflash-tui explain CODE`
prints the same entry. Thresholds are `DiagnosisConfig` keys
(`dflash_tui/diagnosis/config.py`) with their defaults; `baseline_tok_s` is set per target
in `~/.config/dflash-tui/config.toml`.

`diagnose()` runs the rules in the order below and sorts what they find by severity
(critical, warning, info), keeping this order within one: causes before symptoms.
"""


def page(cover: dict[str, Coverage] | None = None) -> str:
    cover = coverage() if cover is None else cover
    all_codes = codes()
    out = [HEADER]
    out.append(f"{len(all_codes)} codes from {len(rule_docs())} rules.\n")
    out.append("| code | severity | summary | rule |")
    out.append("|---|---|---|---|")
    for code, (doc, c) in all_codes.items():
        out.append(
            f"| [`{code}`](#{code}) | {', '.join(c.severities)} | {c.summary} | "
            f"`{doc.module}.{doc.rule}` |"
        )
    missing = [code for code in all_codes if not cover[code].recorded]
    out.append("\n## Codes with no recorded scenario yet\n")
    out.append(
        f"{len(missing)} of {len(all_codes)}: no scenario recorded in "
        "`tests/fixtures/scenarios/recorded/` gives them as it is. The tests that name them "
        "edit a scenario, build the events, or read other fixtures (the ranks' heartbeats are "
        "recorded under `tests/fixtures/ranks/`); `tests/monitor/test_findings_docs.py` "
        "checks that some test names each one.\n"
    )
    out.append(", ".join(f"`{c}`" for c in missing) + "\n")
    for doc in rule_docs():
        for c in doc.codes:
            cov = cover[c.code]
            out.append(f"\n## {c.code}\n")
            out.append(f"**{', '.join(c.severities)}**: {c.summary}.\n")
            others = [x for x in doc.all_codes() if x != c.code]
            also = f"; it also raises {', '.join(f'`{x}`' for x in others)}" if others else ""
            out.append(f"- **Rule**: `{doc.rule}` in `dflash_tui/diagnosis/{doc.module}.py`{also}.")
            out.append(f"- **Reads**: {doc.reads}.")
            out.append(f"- **Decides**: {doc.decides}")
            values = threshold_values(doc)
            out.append(
                "- **Thresholds**: " + (", ".join(f"`{v}`" for v in values) if values else "none")
            )
            out.append(f"- **To do**: {doc.action}")
            rec = ", ".join(f"`{r}`" for r in cov.recorded) or "none yet"
            out.append(f"- **Recorded in**: {rec}.")
    return "\n".join(out).rstrip() + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m dflash_tui.diagnosis.docs")
    ap.add_argument("--write", action="store_true", help=f"write {PAGE.relative_to(ROOT)}")
    ap.add_argument("--check", action="store_true", help="exit 1 when the page is stale")
    args = ap.parse_args(argv)
    text = page()
    if args.write:
        PAGE.parent.mkdir(exist_ok=True)
        PAGE.write_text(text)
        print(f"wrote {PAGE.relative_to(ROOT)}: {len(codes())} codes")
        return 0
    if args.check:
        stale = not PAGE.exists() or PAGE.read_text() != text
        print(f"{PAGE.relative_to(ROOT)} is {'stale' if stale else 'current'}")
        return 1 if stale else 0
    print(text, end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())

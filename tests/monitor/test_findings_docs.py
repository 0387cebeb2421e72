"""The findings' registry and its generated documentation (dflash_tui/diagnosis/docs.py):
every rule documented, every code it raises declared, every threshold a DiagnosisConfig key
it reads, docs/findings.md current, every code raised by a recording or a test, and the
package cut small (no module over 800 lines, no class over 400)."""

from __future__ import annotations

import ast
import inspect
import re
from pathlib import Path

from dflash_tui import diagnosis
from dflash_tui.diagnosis import docs
from dflash_tui.diagnosis.registry import DOCS, THRESHOLDS

PACKAGE = Path(diagnosis.__file__).parent

# The order diagnose() ran its rules in before the package (diagnosis.py at 0bcf72d): within
# one severity, findings keep it.
ORDER = [
    "unreachable",
    "gpu_wedged",
    "crashed",
    "died_before_log",
    "stale_heartbeat",
    "heartbeat_unreadable",
    "rank_silent",
    "rank_failed",
    "rank_straggler",
    "slow_link",
    "stalled_loop",
    "stop_stalled",
    "loss_not_finite",
    "loss_diverging",
    "not_learning",
    "grad_norm_spike",
    "output_buffered",
    "thread_straggler",
    "stuck_target",
    "pipeline_bottleneck",
    "role_memory_short",
    "memory_held_after_kill",
    "slow_phase",
    "code_mismatch",
    "recompiles",
    "graphs_fell_back",
    "mostly_padding",
    "allocator_retries",
    "memory_swing_rule",
    "host_oversubscribed",
    "host_memory_short",
    "disk_short",
    "checkpoint_failed",
    "gil_pressure",
    "slow_kernels",
    "environment_changed",
    "gpu_throttled",
    "gpu_ecc_errors",
    "slow_throughput",
    "no_step_line_yet",
    "eval_failed",
    "overfitting",
    "eval_plateau",
    "eval_skipped",
    "throughput_drop",
    "below_earlier_runs",
]


def test_the_rules_run_in_the_order_they_always_did() -> None:
    assert [r.__name__ for r in diagnosis.RULES] == ORDER


def test_every_rule_is_documented_and_every_documented_rule_runs() -> None:
    names = [r.__name__ for r in diagnosis.RULES]
    assert [n for n in names if n not in DOCS] == []
    assert sorted(set(DOCS) - set(names)) == ["diagnose"]  # rule_error, diagnose()'s own
    for d in DOCS.values():
        assert d.codes and d.reads and d.decides and d.action, d.rule
        assert all(c.summary and c.severities for c in d.codes), d.rule


def _literals(node: ast.AST) -> set[str]:
    return {
        n.value for n in ast.walk(node) if isinstance(n, ast.Constant) and isinstance(n.value, str)
    }


def test_every_code_a_rule_module_raises_is_declared_by_its_rules() -> None:
    """The codes in each module's `Finding(severity, "code", …)` calls (and the bottleneck
    verdicts' keys) are exactly the codes its rules declare."""
    raised: dict[str, set[str]] = {}
    for path in sorted(PACKAGE.glob("*.py")):
        tree = ast.parse(path.read_text())
        found = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "Finding":
                code = node.args[1] if len(node.args) > 1 else None
                if isinstance(code, ast.Constant):
                    found.add(code.value)
        raised[path.stem] = found
    raised["pipeline"] |= set(diagnosis.VERDICTS) | {"host_bottleneck"}
    declared: dict[str, set[str]] = {}
    for d in DOCS.values():
        declared.setdefault(d.module, set()).update(d.all_codes())
    assert {m: c for m, c in raised.items() if c} == declared


def test_every_threshold_a_rule_compares_with_is_named_in_its_documentation() -> None:
    """Each `cfg.KEY` a rule function reads itself is among its documented thresholds, and
    every documented threshold is a DiagnosisConfig key (checked at registration too)."""
    for r in diagnosis.RULES:
        doc = DOCS[r.__name__]
        used = set(re.findall(r"\bcfg\.(\w+)", inspect.getsource(r)))
        assert used <= set(doc.thresholds), (r.__name__, used - set(doc.thresholds))
        assert set(doc.thresholds) <= THRESHOLDS


def test_n_of_n_codes_documented() -> None:
    codes = docs.codes()
    assert len(codes) == sum(len(d.codes) for d in DOCS.values()) == 53
    for code in codes:
        text = docs.explain(code)
        doc, c = codes[code]
        assert text.startswith(f"{code} ({', '.join(c.severities)}): {c.summary}")
        for value in docs.threshold_values(doc):
            assert value in text
    assert docs.listing().count("\n") == len(codes) - 1


def test_the_page_is_generated_from_the_registry() -> None:
    """docs/findings.md is what `python -m dflash_tui.diagnosis.docs --write` writes now."""
    assert docs.PAGE.read_text() == docs.page(), (
        "docs/findings.md is stale: python -m dflash_tui.diagnosis.docs --write"
    )


def test_every_code_is_raised_by_a_recording_or_a_test() -> None:
    cover = docs.coverage()
    assert [c for c, cov in cover.items() if not cov.covered()] == []
    # Recordings are run, not grepped: healthy ones give nothing, a crash gives crashed.
    recorded = docs.recorded_codes()
    assert "crashed" in recorded and "healthy" not in {n for v in recorded.values() for n in v}


def test_the_nearest_codes_to_a_typo() -> None:
    assert docs.nearest("gil_presure")[0] == "gil_pressure"
    assert docs.nearest("slow_lnk")[0] == "slow_link"
    assert docs.nearest("zzzzzzzz") == []


def test_the_package_is_cut_small() -> None:
    for path in PACKAGE.glob("*.py"):
        text = path.read_text()
        assert len(text.splitlines()) <= 800, path.name
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.ClassDef):
                assert (node.end_lineno or 0) - node.lineno < 400, (path.name, node.name)

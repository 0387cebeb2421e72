"""DESIGN.md's import rules, checked on the source and on a real interpreter.

- nothing outside dflash_tui/app*.py and dflash_tui/widgets/ imports textual;
- dflash_tui never imports torch (nor a trainer module that does);
- trainer never imports dflash_tui;
- the trainer modules the monitor may read (the telemetry schema) are stdlib-only.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# trainer modules that dflash_tui may import: they must import the stdlib only.
STDLIB_ONLY_TRAINER_MODULES: set[str] = {
    "trainer",
    "trainer.contract",
    *(f"trainer.contract.{p.stem}" for p in (ROOT / "trainer" / "contract").glob("[!_]*.py")),
}


def imports_of(path: Path) -> set[str]:
    """Top-level package names and full dotted names imported anywhere in the file."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            for a in node.names:
                names.add(a.name)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


def tops(names: set[str]) -> set[str]:
    return {n.split(".")[0] for n in names}


def py_files(package: str) -> list[Path]:
    return sorted((ROOT / package).rglob("*.py"))


def is_view_module(path: Path) -> bool:
    rel = path.relative_to(ROOT / "dflash_tui")
    return rel.parts[0] == "widgets" or rel.name.startswith("app")


def test_the_rules_see_real_files():
    assert len(py_files("trainer")) > 10 and py_files("dflash_tui")


def test_only_views_import_textual():
    offenders = [
        str(p.relative_to(ROOT))
        for pkg in ("dflash_tui", "trainer")
        for p in py_files(pkg)
        if "textual" in tops(imports_of(p)) and not (pkg == "dflash_tui" and is_view_module(p))
    ]
    assert offenders == []


def test_monitor_never_imports_torch_or_torch_using_trainer_modules():
    offenders = []
    for p in py_files("dflash_tui"):
        names = imports_of(p)
        if "torch" in tops(names):
            offenders.append(f"{p.relative_to(ROOT)}: torch")
        for n in names:
            if n.split(".")[0] == "trainer" and n not in STDLIB_ONLY_TRAINER_MODULES:
                offenders.append(f"{p.relative_to(ROOT)}: {n}")
    assert offenders == []


def test_trainer_never_imports_the_monitor():
    offenders = [
        str(p.relative_to(ROOT)) for p in py_files("trainer") if "dflash_tui" in tops(imports_of(p))
    ]
    assert offenders == []


def test_schema_modules_are_stdlib_only():
    for module in STDLIB_ONLY_TRAINER_MODULES:
        path = ROOT / (module.replace(".", "/") + ".py")
        if not path.exists():  # a package: its __init__
            path = ROOT / module.replace(".", "/") / "__init__.py"
        foreign = {
            n
            for n in imports_of(path)
            if n.split(".")[0] not in sys.stdlib_module_names
            and n not in STDLIB_ONLY_TRAINER_MODULES
        }
        assert foreign == set(), f"{module} imports {foreign}"


def test_monitor_cli_loads_without_torch_or_textual():
    code = (
        "import sys, dflash_tui.cli\n"
        "heavy = sorted(m for m in ('torch', 'textual', 'transformers') if m in sys.modules)\n"
        "print(','.join(heavy))"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == ""


def test_the_agent_imports_the_stdlib_and_the_contract_only():
    """It runs on the training host from one bundled script (dflash_tui/link/bundle.py):
    whatever else it imported would not be there."""
    bundled = {"dflash_tui.agent", *STDLIB_ONLY_TRAINER_MODULES}
    bundled |= {f"dflash_tui.agent.{p.stem}" for p in (ROOT / "dflash_tui" / "agent").glob("*.py")}
    offenders = {
        f"{p.relative_to(ROOT)}: {n}"
        for p in py_files("dflash_tui/agent")
        for n in imports_of(p)
        if n.split(".")[0] not in sys.stdlib_module_names and n not in bundled and n != "pynvml"
    }
    assert offenders == set()

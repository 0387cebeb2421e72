"""No module imports another module's private names (issue 29): a `_name` is its module's own
business, free to change without a look elsewhere. A name two modules share is public: made
so in the module that owns it, with its docstring.

Walks every .py file of the repository with `ast` and fails on:
- `from M import _name` where M is a module of this repository;
- `M._name` where M is bound by an import to a module of this repository
  (`from dflash_tui import cli` then `cli._fmt_runs`).

Modules outside the repository (torch, textual, asyncssh, the standard library) are their
own projects' business and outside this rule. A test reaching into Textual's internals is
such a case (`app._notifications`: Textual has no public list of the toasts shown).
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SOURCES = ("dflash_tui", "trainer", "tests", "bench", "scripts")
# Top-level names that are this repository's: its packages, and the folders whose files
# import each other by bare name (tests/ is on sys.path; a bench script puts bench/ there).
PACKAGES = frozenset(SOURCES)
PATH_DIRS = (ROOT / "tests", ROOT / "bench")


def python_files() -> list[Path]:
    files: list[Path] = []
    for source in SOURCES:
        files += [p for p in (ROOT / source).rglob("*.py") if "__snapshots__" not in p.parts]
    return sorted(files)


def is_private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__") and name != "_"


def module_path(dotted: str, importer: Path) -> Path | None:
    """The file or package of this repository that `dotted` names from `importer`, or None
    when it names none (an installed package, the standard library)."""
    parts = dotted.split(".")
    bases = [ROOT] if parts[0] in PACKAGES else [importer.parent, *PATH_DIRS]
    for base in bases:
        candidate = base.joinpath(*parts)
        if candidate.with_suffix(".py").is_file():
            return candidate.with_suffix(".py")
        if (candidate / "__init__.py").is_file():
            return candidate / "__init__.py"
    return None


def resolved(node: ast.ImportFrom, importer: Path) -> str:
    """The absolute dotted module of a `from … import`, relative ones resolved."""
    if not node.level:
        return node.module or ""
    package = list(importer.relative_to(ROOT).with_suffix("").parts[:-1])
    base = package[: len(package) - (node.level - 1)]
    return ".".join([*base, *([node.module] if node.module else [])])


def violations(path: Path, text: str | None = None) -> list[str]:
    """What `path` (or `text`, read as if it were that file) imports of others' private names."""
    tree = ast.parse(path.read_text() if text is None else text, str(path))
    found: list[str] = []
    modules: dict[str, str] = {}  # a local name bound to one of the repository's modules
    where = path.relative_to(ROOT)
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if module_path(alias.name, path) is not None:
                    local = alias.asname or alias.name.split(".")[0]
                    modules[local] = alias.name if alias.asname else local
        elif isinstance(node, ast.ImportFrom):
            module = resolved(node, path)
            if module == "__future__" or module_path(module, path) is None:
                continue
            for alias in node.names:
                if is_private(alias.name):
                    found.append(f"{where}:{node.lineno}: from {module} import {alias.name}")
                elif module_path(f"{module}.{alias.name}", path) is not None:
                    modules[alias.asname or alias.name] = f"{module}.{alias.name}"
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Attribute) and is_private(node.attr)):
            continue
        chain: list[str] = []
        value: ast.expr = node.value
        while isinstance(value, ast.Attribute):
            chain.insert(0, value.attr)
            value = value.value
        if isinstance(value, ast.Name) and value.id in modules:
            dotted = ".".join([modules[value.id], *chain])
            if module_path(dotted, path) is not None:
                found.append(f"{where}:{node.lineno}: {dotted}.{node.attr}")
    return found


def test_no_module_imports_another_modules_private_names():
    files = python_files()
    assert len(files) > 300  # the walk found the repository
    found = [v for p in files for v in violations(p)]
    assert found == [], "private names imported from another module:\n" + "\n".join(found)


def test_the_check_sees_both_forms():
    """The walk is not vacuous: both forms are caught in a file that has them, and a
    private name of a package outside the repository is let be."""
    text = (
        "from dflash_tui.sanitize import _HIDDEN\n"
        "from dflash_tui import sanitize\n"
        "from textual.app import _private_thing\n"
        "sanitize._HIDDEN\n"
    )
    found = violations(ROOT / "tests" / "_private_import_probe.py", text)
    assert found == [
        "tests/_private_import_probe.py:1: from dflash_tui.sanitize import _HIDDEN",
        "tests/_private_import_probe.py:4: dflash_tui.sanitize._HIDDEN",
    ]

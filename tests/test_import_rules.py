"""ARCHITECTURE.md's import rules that import-linter cannot state, on the source and on a
real interpreter. The others (no torch in the monitor, textual only in the views, the trainer
never imports the monitor) are import-linter contracts in pyproject.toml, run by scripts/test.

- the contract package imports the standard library and itself, nothing else, and the agent
  the standard library and the contract: the agent carries both to hosts that have nothing
  installed;
- loading the monitor's CLI loads neither torch nor textual (`--help` stays instant);
- loading the trainer's run loads no torch compiler (dynamo, inductor): it took 7 s of a warm
  demo's start on a loaded 2-core host, and a CPU run compiles nothing.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CONTRACT = ROOT / "trainer" / "contract"


def imports_of(path: Path) -> set[str]:
    """Full dotted names imported anywhere in the file (relative imports resolved)."""
    package = ".".join(path.relative_to(ROOT).with_suffix("").parts[:-1])
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = package.rsplit(".", node.level - 1)[0] if node.level else ""
            names.add(".".join(p for p in (base, node.module or "") if p))
    return names


def foreign_imports(files: list[Path], own: tuple[str, ...]) -> set[str]:
    """Imports in `files` of anything but the standard library and the packages `own`."""
    return {
        f"{p.relative_to(ROOT)}: {n}"
        for p in files
        for n in imports_of(p)
        if n.split(".")[0] not in sys.stdlib_module_names
        and not any(n == o or n.startswith(o + ".") for o in own)
    }


def test_the_contract_is_stdlib_only():
    files = [*sorted(CONTRACT.glob("*.py")), ROOT / "trainer" / "__init__.py"]
    assert len(files) > 8
    assert foreign_imports(files, ("trainer.contract",)) == set()


def loaded_after(modules: str, watched: tuple[str, ...]) -> list[str]:
    """Which of `watched` a fresh interpreter holds after importing `modules`."""
    code = f"import sys, {modules}\nprint(' '.join(m for m in {watched!r} if m in sys.modules))"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 0, r.stderr
    return r.stdout.split()


def test_monitor_cli_loads_without_torch_or_textual():
    assert loaded_after("dflash_tui.cli", ("torch", "textual", "transformers")) == []


def test_the_trainer_loads_without_the_compiler():
    """What the launch runs, and its threaded run, import no part of torch's compiler:
    `torch.compiler.disable` as a decorator, or a counter read at import, would."""
    modules = "trainer.__main__, trainer.runtime.run, trainer.runtime.warmup"
    watched = ("torch", "torch._dynamo", "torch._inductor")
    assert loaded_after(modules, watched) == ["torch"]  # torch itself, not its compiler


def test_the_agent_imports_the_stdlib_and_the_contract_only():
    """It runs on the training host from one bundled script (dflash_tui/link/bundle.py):
    whatever else it imported would not be there (pynvml is optional, and deploy carries it)."""
    files = sorted((ROOT / "dflash_tui" / "agent").glob("*.py"))
    assert len(files) > 8
    own = ("dflash_tui.agent", "trainer.contract", "pynvml")
    assert foreign_imports(files, own) == set()

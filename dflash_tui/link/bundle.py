"""The agent as one self-contained Python script, carrying the contract it speaks.

The link sends this script on every connect (transport.BOOTSTRAP execs it as __main__), and
deploy writes it into each release as dflash_agent.py (launched runs' wrapper). It holds
the sources of dflash_tui/__init__.py, dflash_tui/agent/*.py, trainer/__init__.py and
trainer/contract/*.py, and in this order:

1. checks the interpreter, in syntax any Python 3 parses: on one older than 3.10 it says so
   in one line on stderr and exits 2 (the link shows that line as why the agent did not start);
2. puts an importer at position 0 of sys.meta_path that serves exactly the bundled modules,
   so a trainer/ folder in the cwd or on sys.path (an older deployed trainer, a checkout)
   never shadows the contract this agent was built with;
3. runs dflash_tui.agent.main.main().

The agent therefore always matches the monitor's version, whatever trainer is deployed.
"""

from __future__ import annotations

from pathlib import Path

import dflash_tui
import trainer

MONITOR_DIR = Path(dflash_tui.__file__).resolve().parent
TRAINER_DIR = Path(trainer.__file__).resolve().parent
PACKAGES = {
    "dflash_tui": MONITOR_DIR,
    "dflash_tui.agent": MONITOR_DIR / "agent",
    "trainer": TRAINER_DIR,
    "trainer.contract": TRAINER_DIR / "contract",
}
# Packages whose every module is bundled; of the others only __init__ is.
WHOLE = ("dflash_tui.agent", "trainer.contract")
MIN_PYTHON = (3, 10)

# Runs first; it must parse on any Python 3 (no f-strings, no annotations).
HEADER = f"""\
# The dflash-tui agent with its contract, built by dflash_tui/link/bundle.py from
# dflash_tui/agent/ and trainer/contract/. Not to be edited: the monitor sends a fresh one on
# every connect and deploy writes it into each release.
import sys

if sys.version_info < {MIN_PYTHON!r}:
    sys.stderr.write(
        "dflash-tui agent: needs Python >= {".".join(map(str, MIN_PYTHON))}, this is %s (%s)\\n"
        % (sys.version.split()[0], sys.executable or "?")
    )
    sys.exit(2)
"""

IMPORTER = '''
import importlib.abc
import importlib.machinery


class _BundledModules(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Serves the modules in _SOURCES from this script, ahead of every other finder."""

    def find_spec(self, name, path=None, target=None):
        if name not in _SOURCES:
            return None
        return importlib.machinery.ModuleSpec(
            name, self, origin=self.filename(name), is_package=_SOURCES[name][0]
        )

    def create_module(self, spec):
        return None

    def exec_module(self, module):
        name = module.__spec__.name
        code = compile(_SOURCES[name][1], self.filename(name), "exec", dont_inherit=True)
        exec(code, module.__dict__)

    def get_source(self, name):  # linecache asks: tracebacks show the bundled lines
        return _SOURCES[name][1]

    @staticmethod
    def filename(name):
        tail = "/__init__.py" if _SOURCES[name][0] else ".py"
        return "/<dflash-agent>/" + name.replace(".", "/") + tail


sys.meta_path.insert(0, _BundledModules())
'''

MAIN = """
from dflash_tui.agent.main import main as _main

sys.exit(_main())
"""


def bundled_modules() -> dict[str, tuple[bool, str]]:
    """{module name: (is a package, source)} of everything the blob carries."""
    files = {name: folder / "__init__.py" for name, folder in PACKAGES.items()}
    for package in WHOLE:
        for path in sorted(PACKAGES[package].glob("*.py")):
            if path.stem not in ("__init__", "__main__"):
                files[f"{package}.{path.stem}"] = path
    return {
        name: (name in PACKAGES, files[name].read_text(encoding="utf-8")) for name in sorted(files)
    }


def _literal(source: str) -> str:
    """`source` as a parenthesised run of string literals, one per line: the blob stays
    readable, and evaluates to exactly the source."""
    lines = source.splitlines(keepends=True)
    if not lines:
        return "''"
    return "(\n" + "".join(f"        {line!r}\n" for line in lines) + "    )"


def agent_blob() -> bytes:
    """The agent script, built from the files as they are now."""
    parts = [HEADER, "\n_SOURCES = {\n"]
    for name, (is_package, source) in bundled_modules().items():
        parts.append(f"    {name!r}: ({is_package!r}, {_literal(source)}),\n")
    parts += ["}\n", IMPORTER, MAIN]
    return "".join(parts).encode("utf-8")

"""restart --deploy's import check: does a release's trainer import with the host's python,
before anything is stopped?

A child python (the one launches use) in the release folder compiles every trainer/*.py, then
imports the modules a launch starts from and after them every other module of the trainer: a
module a run imports late (at its first eval, its first checkpoint) fails here, not mid-run.
The trainer imports optional packages (wandb, kernels) inside functions, so a healthy release
imports whole on any host that can train. It prints one line: `ok`, or the failing module and
its error. Its output is cut to a few short lines here; the monitor sanitises it before a
terminal.
"""

from __future__ import annotations

import os
import subprocess
import time

# What `python -m trainer` imports on its way to the first step, threads mode and processes:
# checked first, so their error is the one named.
ENTRY_MODULES = ("trainer.__main__", "trainer.runtime.run", "trainer.distributed.run")
KEEP_LINES, KEEP_CHARS = 4, 300  # what of a failed check's output goes back

# Runs in the host's python (>= 3.10) with the release as its cwd; argv: the modules.
CHECK = r"""
import importlib, os, sys, traceback
root, names = os.getcwd(), []
def module_of(path):
    rel = os.path.relpath(path, root)
    parts = (rel[:-3] if rel.endswith(".py") else rel).split(os.sep)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
def refuse(where, e):
    print("%s: %s: %s" % (where, type(e).__name__, e))
    sys.exit(1)
for d, dirs, files in os.walk(os.path.join(root, "trainer")):
    dirs[:] = sorted(x for x in dirs if x != "__pycache__")
    for f in sorted(x for x in files if x.endswith(".py")):
        p = os.path.join(d, f)
        try:
            with open(p, "rb") as fh:
                compile(fh.read(), p, "exec")
        except (SyntaxError, ValueError) as e:
            refuse(module_of(p), e)
        names.append(module_of(p))
for m in sys.argv[1:] + [n for n in names if n not in sys.argv[1:]]:
    try:
        importlib.import_module(m)
    except BaseException as e:
        ours = [f for f in traceback.extract_tb(e.__traceback__)
                if f.filename.startswith(root + os.sep)]
        refuse(module_of(ours[-1].filename) + " line %d" % ours[-1].lineno if ours else m, e)
print("ok")
"""


def check_release(python: str, release: str, env: dict[str, str], timeout_s: float) -> str | None:
    """None when the release imports; else why not, in at most KEEP_LINES short lines."""
    started = time.monotonic()
    try:
        done = subprocess.run(
            [python, "-B", "-c", CHECK, *ENTRY_MODULES],
            check=False,
            cwd=release,
            env=env,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            timeout=timeout_s,
        )
    except subprocess.TimeoutExpired:
        return f"did not finish importing in {timeout_s:.0f}s"
    except OSError as e:
        return f"could not start {python}: {e}"
    if done.returncode == 0 and done.stdout.decode("utf-8", "replace").split() == ["ok"]:
        return None
    ours = done.stdout[-2048:].decode("utf-8", "replace").strip().splitlines()
    if done.returncode == 1 and ours:  # the check's own line: the module and its error
        return ours[-1][:KEEP_CHARS]
    said = (done.stdout + done.stderr)[-65536:].decode("utf-8", "replace")
    lines = [ln[:KEEP_CHARS] for ln in said.splitlines() if ln.strip()][-KEEP_LINES:]
    how = f"exit {done.returncode}" if done.returncode >= 0 else f"signal {-done.returncode}"
    took = time.monotonic() - started
    return f"python {how} after {took:.1f}s" + (": " + " | ".join(lines) if lines else "")


def release_env(release: str) -> dict[str, str]:
    """The environment launch gives the trainer, as far as imports go: the release first on
    PYTHONPATH."""
    env = dict(os.environ)
    env["PYTHONPATH"] = release + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env

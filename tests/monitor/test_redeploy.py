"""restart --deploy: deploy and restart in one step, new code checked before the run stops.

Real CPU trainers launched through the real agent (the local link); `dflash-tui restart
--deploy` run as its own process from a copy of this repository whose trainer was edited,
as an operator's edited checkout is. The edited release lands beside `current`; the host's
python imports it before anything is signalled: a release that does not import is refused
with its module and error (exit 2), the run trains on, `current` stays; one that imports
becomes current and the run resumes from the kill's checkpoint on it.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from monitor_helpers import ROOT, piped_env
from test_control_local import deploy
from test_group_config import group_cli, write
from test_resume import LONG, ckpt, launch, metrics, reach, record, until

from dflash_tui.agent.release_check import KEEP_CHARS, KEEP_LINES, check_release, release_env
from trainer.contract.codehash import code_hash

STOP = ("--timeout", "30", "--drain-timeout", "5")


@pytest.fixture
def runs_dir(local_target) -> Path:
    return Path(local_target.remote_dir) / "runs"


def edited_tree(tmp_path: Path, edit: Callable[[Path], object]) -> Path:
    """This repository's two packages copied, `edit` applied to the copy's trainer/."""
    tree = tmp_path / "tree"
    for pkg in ("dflash_tui", "trainer"):
        shutil.copytree(ROOT / pkg, tree / pkg, ignore=shutil.ignore_patterns("__pycache__"))
    edit(tree / "trainer")
    return tree


def append(path: Path, text: str) -> int:
    """`text` added at the end of `path` -> the line number it starts on."""
    before = path.read_text()
    path.write_text(before + text)
    return before.count("\n") + 1


def cli_from(tree: Path, *args: str) -> subprocess.CompletedProcess:
    """`dflash-tui ARGS` run from `tree`, so that deploy ships `tree`'s trainer."""
    return subprocess.run(
        [sys.executable, "-m", "dflash_tui", *args],
        capture_output=True,
        text=True,
        timeout=400,
        cwd=tree,
        env={**piped_env(), "PYTHONPATH": str(tree)},
    )


def current(remote: str) -> str:
    return os.path.realpath(os.path.join(remote, "current"))


def deployed_sha(remote: str) -> str:
    return str(json.loads(Path(remote, "deployed.json").read_text())["sha256"])


def test_redeploy_checks_the_new_code_then_resumes_the_run_on_it(
    remote_factory, local_target, runs_dir, tmp_path
):
    r = remote_factory(local_target)
    remote = local_target.remote_dir
    old = deploy(r)
    run = launch(r, *LONG)
    reach(runs_dir / run, 3)
    tree = edited_tree(tmp_path, lambda t: append(t / "model" / "loss.py", "# edited\n"))
    sha = code_hash(tree / "trainer")
    assert sha != old["sha256"]

    done = cli_from(tree, "restart", "local", "--remote-dir", remote, "--deploy", *STOP)
    assert done.returncode == 0, done.stderr
    shipped, killed, restarted = done.stdout.splitlines()
    assert shipped.startswith("shipped ") and shipped.endswith(
        f" files as release {sha[:16]} (not current yet)"
    )
    stopped = int(killed.split()[4])  # "RUN stopped at step S (SIGTERM), checkpoint …"
    assert killed.startswith(
        f"{run} stopped at step {stopped} (SIGTERM), checkpoint {ckpt(stopped)}"
    )
    new = restarted.split()[2].rstrip(",")
    assert restarted == (
        f"restarted as {new}, resuming from {ckpt(stopped)} (step {stopped}) of {run}, "
        f"on release {sha[:16]}"
    )
    # The steps' progress, in order: the check passed before the first signal.
    said = [ln.removeprefix("  … ") for ln in done.stderr.splitlines()]
    check = said.index(f"import check of release {sha[:16]} with {sys.executable}")
    imports = next(i for i, ln in enumerate(said) if ln.startswith(f"release {sha[:16]} imports ("))
    sigterm = next(i for i, ln in enumerate(said) if ln.startswith("SIGTERM to process group"))
    made = said.index(f"release {sha[:16]} is current")
    assert check < imports < sigterm < made

    # The new run runs the new code, from the kill's checkpoint; the old one ran the old code.
    release = os.path.realpath(os.path.join(remote, "releases", sha[:16]))
    assert record(runs_dir / new)["release"] == release
    assert record(runs_dir / run)["release"] == old["release"] != release
    assert current(remote) == release and deployed_sha(remote) == sha
    beat = until(
        "the new run's heartbeat",
        lambda: (
            (runs_dir / new / "heartbeat.json").exists()
            and json.loads((runs_dir / new / "heartbeat.json").read_text())
        ),
    )
    assert beat["code_sha256"] == sha
    got = reach(runs_dir / new, stopped + 2)
    assert got[0]["step"] == stopped + 1


def test_a_release_that_does_not_import_is_refused_and_the_run_trains_on(
    remote_factory, local_target, runs_dir, tmp_path
):
    r = remote_factory(local_target)
    remote = local_target.remote_dir
    old = deploy(r)
    run = launch(r, *LONG)
    reach(runs_dir / run, 3)
    line: list[int] = []
    tree = edited_tree(
        tmp_path, lambda t: line.append(append(t / "model" / "loss.py", "def broken(:\n"))
    )
    sha = code_hash(tree / "trainer")

    done = cli_from(tree, "restart", "local", "--remote-dir", remote, "--deploy", *STOP)
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    assert done.stderr.splitlines()[-1] == (
        f"dflash-tui: release {sha[:16]} does not import, nothing stopped: trainer.model.loss: "
        f"SyntaxError: invalid syntax (loss.py, line {line[0]})"
    )
    assert not any("SIGTERM" in ln for ln in done.stderr.splitlines())
    # Untouched: still training on its release, no new run, `current` where it was.
    assert not (runs_dir / run / "exit.json").exists()
    step = metrics(runs_dir / run)[-1]["step"]
    reach(runs_dir / run, step + 3)
    assert [p.name for p in runs_dir.iterdir() if p.is_dir()] == [run]
    assert current(remote) == old["release"] and deployed_sha(remote) == old["sha256"]
    assert Path(remote, "releases", sha[:16], "trainer").is_dir()  # shipped, never made current


def test_the_check_names_a_module_a_run_imports_late_and_cuts_what_it_says(tmp_path):
    """The check imports the whole trainer, not only what the first step needs; a module that
    floods its output or dies is cut to a few short lines (the CLI sanitises them)."""
    python = sys.executable
    late = edited_tree(
        tmp_path / "late",
        lambda t: append(t / "evaluation" / "draft.py", "import no_such_module_dflash\n"),
    )
    lines = (late / "trainer" / "evaluation" / "draft.py").read_text().count("\n")
    assert check_release(python, str(late), release_env(str(late)), 120) == (
        f"trainer.evaluation.draft line {lines}: ModuleNotFoundError: "
        "No module named 'no_such_module_dflash'"
    )
    flood = "import os, sys\nfor i in range(50): print('\\x1b[2J' + 'x' * 5000, file=sys.stderr)\n"
    loud = edited_tree(
        tmp_path / "loud", lambda t: append(t / "fsutil.py", flood + "os._exit(3)\n")
    )
    said = check_release(python, str(loud), release_env(str(loud)), 120)
    assert said is not None and said.startswith("python exit 3 after ")
    cut = said.split(": ", 1)[1].split(" | ")
    assert len(cut) == KEEP_LINES and all(len(c) == KEEP_CHARS for c in cut)
    healthy = edited_tree(tmp_path / "healthy", lambda t: None)
    assert check_release(python, str(healthy), release_env(str(healthy)), 120) is None


def test_redeploying_a_group_is_one_line_exit_2_before_anything_connects(tmp_path):
    home = write(tmp_path, '[groups.pair]\nhosts = ["gpu-a", "gpu-b"]\nmaster = "h:1"\n')
    r = group_cli(home, "restart", "pair", "--deploy")
    assert r.returncode == 2, r.stderr
    assert r.stderr.splitlines() == [
        "dflash-tui: restart --deploy: one host at a time, not the group pair"
    ]

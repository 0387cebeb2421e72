"""The reliability figures (issue 33, README's "Reliability" section): each hostile-input
class of the tests, run with N generated examples instead of CI's few, counted.

A class is one hypothesis test, run as pytest runs it (its real agent, sshd, CLI processes
and fixtures), under the `bench` profile (tests/conftest.py: max_examples from
DFLASH_BENCH_EXAMPLES, no example database, so every example counted is a new one). The
counts are hypothesis's own statistics (`--hypothesis-show-statistics`): examples run (the
generate phase's passing and failing cases; shrinking's reruns not counted), failures, the
seconds the examples took, and why the search stopped. A class whose space is finite (every
slot x every kind) stops when hypothesis has tried all of it: the table says so.

    nice -n 10 .venv/bin/python bench/reliability_bench.py --examples 20          # rates
    nice -n 10 .venv/bin/python bench/reliability_bench.py --examples 10000 --only slot

The JSON result (--out) is rewritten after every class, so a run stopped early still
reports what it finished.
"""

from __future__ import annotations

import argparse
import os
import platform
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from trainer.contract.records import write_json_atomic  # noqa: E402


@dataclass(frozen=True)
class InputClass:
    name: str  # short, for --only and the table
    test: str  # the pytest node id
    what: str  # the class, in words


CLASSES = [
    # issue 33, part B
    InputClass("run-file-slots", "tests/monitor/test_hostile_run_files.py::"
               "test_a_non_file_where_a_run_file_should_be",
               "a folder, FIFO or device at each run file (real agent)"),
    InputClass("agent-file-slots", "tests/monitor/test_hostile_run_files.py::"
               "test_a_non_file_where_an_agent_file_should_be",
               "a folder, FIFO or device at the launch lock, its record, deployed.json "
               "(a fresh real agent each)"),
    InputClass("refused-heartbeats", "tests/monitor/test_hostile_run_files.py::"
               "test_every_refused_heartbeat_is_named_a_warning_at_least",
               "heartbeats the contract refuses, named (real agent, link, store)"),
    InputClass("absurd-figures", "tests/monitor/test_hostile_run_files.py::"
               "test_absurd_figures_are_bounded_and_labelled",
               "absurd figures in heartbeat and metrics (real agent, link, store)"),
    InputClass("launch-config-slot", "tests/monitor/test_hostile_files.py::"
               "test_launch_config_slot_reads_or_refuses_in_one_line",
               "`dflash-tui launch --config` file states"),
    InputClass("trainer-config-slot", "tests/monitor/test_hostile_files.py::"
               "test_trainer_config_slot_reads_or_refuses_in_one_line",
               "`python -m trainer --config` file states"),
    InputClass("config-toml-slot", "tests/monitor/test_hostile_files.py::"
               "test_monitor_config_slot_reads_or_refuses_in_one_line",
               "the monitor's config.toml file states"),
    InputClass("ssh-config-slot", "tests/monitor/test_hostile_files.py::"
               "test_ssh_config_slot_reads_or_refuses_in_one_line",
               "~/.ssh/config file states"),
    InputClass("ssh-config-includes", "tests/monitor/test_hostile_files.py::"
               "test_a_file_the_ssh_config_includes_reads_or_refuses_in_one_line",
               "a file `Include`d by ~/.ssh/config: every file state and config text"),
    InputClass("identity-slot", "tests/monitor/test_hostile_files.py::"
               "test_identity_slot_reads_or_refuses_in_one_line", "`--identity` file states"),
    InputClass("theme-slots", "tests/monitor/test_hostile_files.py::"
               "test_theme_slots_read_or_refuse_in_one_line",
               "settings.json and a user theme file, file states"),
    InputClass("known-hosts-slot", "tests/monitor/test_hostile_files.py::"
               "test_known_hosts_slot_reads_or_refuses_in_one_line",
               "`--known-hosts` file states (in-process)"),
    InputClass("known-hosts-states", "tests/monitor/test_ssh_host_keys.py::"
               "test_every_known_hosts_state_connects_or_is_refused_in_one_line",
               "known_hosts states x accept-new x how named (real sshd, real CLI)"),
    InputClass("deploy-archives", "tests/monitor/test_deploy_archives.py::"
               "test_an_archive_whose_names_clash_is_refused_in_one_line",
               "deploy archives with clashing names (real agent)"),
    # the classes before issue 33 (README's table, 2026-12-01)
    InputClass("step-lines", "tests/monitor/test_hostile_input.py::test_step_lines",
               "step lines appended to train.log (agent, link, store, views)"),
    InputClass("metrics-rows", "tests/monitor/test_hostile_input.py::test_metrics_rows",
               "metrics.jsonl rows"),
    InputClass("heartbeats", "tests/monitor/test_hostile_input.py::test_heartbeats",
               "heartbeats (mutated, torn, foreign bytes)"),
    InputClass("records", "tests/monitor/test_hostile_input.py::"
               "test_exit_launch_and_config_records", "exit / launch / config records"),
    InputClass("sanitize-field", "tests/monitor/test_sanitize.py::"
               "test_field_is_safe_for_any_str", "the terminal sanitiser's field, any str"),
    InputClass("sanitize-lines", "tests/monitor/test_sanitize.py::"
               "test_line_and_lines_are_safe_for_any_str", "the sanitiser's line(s), any str"),
    InputClass("sanitize-printable", "tests/monitor/test_sanitize.py::"
               "test_printable_text_is_unchanged", "printable text unchanged"),
    InputClass("trainer-configs", "tests/trainer/test_bad_input.py::"
               "test_generated_configs_load_or_are_refused_in_one_line",
               "trainer configs (TOML)"),
    InputClass("trainer-overrides", "tests/trainer/test_bad_input.py::"
               "test_generated_overrides_apply_or_are_refused_in_one_line", "`--set` overrides"),
    InputClass("data-lines", "tests/trainer/test_bad_input.py::"
               "test_generated_data_lines_are_samples_or_skipped", "data lines"),
]  # fmt: skip

PHASE = re.compile(r"- during (\w+) phase \(([\d.]+) seconds\):")
CASES = re.compile(r"- (\d+) passing, (\d+) failing, and (\d+) invalid")
STOPPED = re.compile(r"- Stopped because (.+)")
COUNTED_PHASES = ("explicit", "generate", "target")  # new examples; not reuse, not shrink


@dataclass
class Result:
    name: str
    test: str
    examples_asked: int
    examples: int
    failures: int
    examples_s: float  # seconds the counted phases took (hypothesis's own timing)
    wall_s: float  # the whole pytest process: imports, fixtures (an agent, an sshd), examples
    examples_per_s: float
    stopped_because: str
    falsifying: str  # the failing example and its error, as pytest printed them
    rc: int


def statistics(output: str) -> tuple[int, int, float, str]:
    """(examples, failing, their seconds, why it stopped) from hypothesis's statistics."""
    examples = failing = 0
    seconds = 0.0
    phase = ""
    for line in output.splitlines():
        if m := PHASE.search(line):
            phase = m.group(1)
            if phase in COUNTED_PHASES:
                seconds += float(m.group(2))
        elif (m := CASES.search(line)) and phase in COUNTED_PHASES:
            examples += int(m.group(1)) + int(m.group(2))
            failing += int(m.group(2))
    stopped = STOPPED.search(output)
    return examples, failing, seconds, stopped.group(1).strip() if stopped else ""


def falsifying(output: str) -> str:
    """The falsifying example and the assertion, cut to what a report can hold."""
    lines = output.splitlines()
    keep = [
        i
        for i, line in enumerate(lines)
        if line.startswith(("Falsifying", "E ", "AssertionError", "FAILED"))
    ]
    return "\n".join(lines[i][:300] for i in keep[:30])


def run_class(c: InputClass, examples: int, seed: int, timeout_s: float, work: Path) -> Result:
    env = {
        **os.environ,
        "HYPOTHESIS_PROFILE": "bench",
        "DFLASH_BENCH_EXAMPLES": str(examples),
        "PYTHONPATH": str(ROOT),
    }
    argv = [
        sys.executable, "-m", "pytest", "-q", "-p", "no:randomly", "-p", "no:xdist",
        "-p", "no:cacheprovider", "--timeout", "0", "--hypothesis-show-statistics",
        f"--hypothesis-seed={seed}", f"--basetemp={work / c.name}", c.test,
    ]  # fmt: skip
    t0 = time.monotonic()
    try:
        r = subprocess.run(
            argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout_s, check=False
        )
        output, rc = r.stdout + r.stderr, r.returncode
    except subprocess.TimeoutExpired as e:
        out = e.stdout or ""
        output = out.decode(errors="replace") if isinstance(out, bytes) else out
        rc = -1
    wall = time.monotonic() - t0
    n, failing, seconds, stopped = statistics(output)
    if rc == -1:
        stopped = f"killed after {timeout_s:.0f} s (--class-timeout): no statistics"
    failures = failing or (1 if rc not in (0, -1) else 0)
    return Result(
        name=c.name, test=c.test, examples_asked=examples, examples=n, failures=failures,
        examples_s=round(seconds, 2), wall_s=round(wall, 1),
        examples_per_s=round(n / seconds, 2) if seconds else 0.0, stopped_because=stopped,
        falsifying=falsifying(output) if rc else "", rc=rc,
    )  # fmt: skip


def table(results: list[Result]) -> str:
    rows = [f"{'class':<20} {'examples':>8} {'failures':>8} {'s':>8} {'ex/s':>8}  stopped"]
    for r in results:
        rows.append(
            f"{r.name:<20} {r.examples:>8} {r.failures:>8} {r.examples_s:>8.1f} "
            f"{r.examples_per_s:>8.2f}  {r.stopped_because}"
        )
    return "\n".join(rows)


def git_head() -> str:
    """The commit measured (a dirty tree is said so)."""

    def git(*argv: str) -> str:
        r = subprocess.run(["git", *argv], cwd=ROOT, capture_output=True, text=True, check=False)
        return r.stdout.strip()

    dirty = git("status", "--porcelain", "--untracked-files=no")
    return git("rev-parse", "--short", "HEAD") + (" (uncommitted changes)" if dirty else "")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--examples", type=int, default=10_000, help="per class (default 10,000)")
    ap.add_argument("--only", action="append", default=[],
                    help="this class, or those whose name contains this (repeatable)")  # fmt: skip
    ap.add_argument("--seed", type=int, default=20261207)
    ap.add_argument(
        "--class-timeout",
        type=float,
        default=6 * 3600.0,
        help="seconds before a class is stopped (then it has no statistics)",
    )
    ap.add_argument("--out", type=Path, default=Path("reliability-bench.json"))
    ap.add_argument("--list", action="store_true", help="list the classes and stop")
    args = ap.parse_args()
    names = {c.name for c in CLASSES}

    def wanted(c: InputClass) -> bool:  # a whole name is that class alone (heartbeats)
        return any(o == c.name if o in names else o in c.name for o in args.only)

    chosen = [c for c in CLASSES if not args.only or wanted(c)]
    if args.list:
        for c in chosen:
            print(f"{c.name:<20} {c.what}  [{c.test}]")
        return 0
    if args.examples < 1:
        print(f"--examples {args.examples}: must be 1 or more", file=sys.stderr)
        return 2
    if not chosen:
        print(f"--only {' '.join(args.only)}: no such class (see --list)", file=sys.stderr)
        return 2
    result: dict[str, Any] = {
        "examples_asked": args.examples,
        "seed": args.seed,
        "machine": f"{platform.node()} ({os.cpu_count()} CPUs), Python {platform.python_version()}",
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "command": " ".join(sys.argv),
        "commit": git_head(),
        "classes": [],
    }
    # A folder of its own: pytest's shared /tmp/pytest-of-USER keeps only the last 3 sessions,
    # and the machine's other pytest runs would count against them.
    work = Path(tempfile.mkdtemp(prefix="reliability-bench-"))
    done: list[Result] = []
    for c in chosen:
        print(f"{c.name}: {c.what} ...", file=sys.stderr, flush=True)
        r = run_class(c, args.examples, args.seed, args.class_timeout, work)
        done.append(r)
        result["classes"] = [asdict(x) for x in done]
        result["load_average"] = os.getloadavg()
        write_json_atomic(args.out, result)
        print(f"  {r.examples} examples, {r.failures} failures, {r.examples_s} s, "
              f"wall {r.wall_s} s; {r.stopped_because}", file=sys.stderr, flush=True)  # fmt: skip
        if r.falsifying:
            print(r.falsifying, file=sys.stderr, flush=True)
    print(table(done))
    return 1 if any(r.failures or r.rc not in (0,) for r in done) else 0


if __name__ == "__main__":
    sys.exit(main())

"""Shared fixtures. The cache is redirected for the whole session so no test writes to ~/.cache."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

import pytest
from hypothesis import settings

# Generated inputs: a fixed seed and a few examples per class in CI, 10,000 on a developer's
# run (HYPOTHESIS_PROFILE=dev): the figures in README's reliability section.
settings.register_profile("ci", max_examples=40, derandomize=True, print_blob=True)
settings.register_profile("dev", max_examples=10_000, print_blob=True)
settings.register_profile("dev-short", max_examples=1_000, print_blob=True)
# bench/reliability_bench.py: as many examples as its command line asks, a fresh search each
# time (no example database replayed, so the count is of new examples only).
settings.register_profile(
    "bench",
    max_examples=int(os.environ.get("DFLASH_BENCH_EXAMPLES", "10000")),
    database=None,
    print_blob=True,
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

# Two xdist workers share two cores with the trainers their tests start. torch's default team
# is a thread per core in every process, and OpenMP teams that outnumber the cores spin
# against each other: one in-process speculative-decoding test took 137 s in a full run and
# 1.5 s alone. A worker's own torch work gets one thread (a trainer the tests start still
# sets its own share, trainer/runtime/run.py `set_threads_for_cpu`); the serial session,
# alone on the machine, keeps the default.
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ["OMP_NUM_THREADS"] = "1"

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerFast

# Real sshd, TCP proxy, pct/NVML stand-ins. tests/ is on sys.path (rootdir conftest, no
# __init__.py), so tests/infra imports as the namespace package `infra`.
pytest_plugins = ["infra.fixtures"]

ROOT = Path(__file__).resolve().parents[1]
TINY_CONFIG = ROOT / "trainer" / "configs" / "tiny-cpu.toml"


@pytest.fixture(scope="session", autouse=True)
def dflash_cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    path = tmp_path_factory.mktemp("dflash-cache")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("DFLASH_CACHE_DIR", str(path))
        yield path


@pytest.fixture(scope="session")
def tiny_target_dir(dflash_cache_dir: Path) -> Path:
    """The builtin tiny Qwen3 target, built once per session into the redirected cache."""
    from trainer.builtins.resolve import resolve_target_path

    return resolve_target_path("builtin:tiny-qwen3")


class ChatBuild(NamedTuple):
    cache: Path
    # (unit, done, total) of `starting`'s progress, as the heartbeat said it while the build
    # ran in a real trainer; empty when the builtins were there already
    progress: list[tuple[str, int, int]]


@pytest.fixture(scope="session")
def tiny_chat_ready(dflash_cache_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> ChatBuild:
    """builtin:tiny-qwen3-chat and builtin:tiny-chat-answers in this session's cache. Their
    build trains a model (~1.5 min alone on two cores): made once, by a real trainer run of
    the demo config (its heartbeat polled for the build's progress), in a folder the xdist
    workers share (the builds lock), then copied into this worker's cache."""
    import shutil
    import tempfile

    from trainer.builtins.tiny_chat import ANSWERS
    from trainer.contract.heartbeat import Heartbeat, read_heartbeat
    from trainer.targets.tiny import BUILTIN_TARGETS

    base = tmp_path_factory.getbasetemp()
    shared = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "shared-cache"
    answers = shared / "datasets" / f"{ANSWERS}.jsonl"
    seen: list[tuple[str, int, int]] = []
    if not answers.is_file():
        runs = Path(tempfile.mkdtemp(prefix="chat-build-", dir=base))
        demo = ROOT / "trainer" / "configs" / "demo-cpu.toml"
        # stderr to a file, not a pipe read at the end: a pipe full of the build's output
        # would block the trainer
        err_path = runs / "stderr.txt"
        with open(err_path, "w") as err:
            proc = subprocess.Popen(
                [sys.executable, "-m", "trainer", "--config", str(demo), "--run-root", str(runs),
                 "--max-steps", "1", "--set", "eval.final=false", "--set", "eval.every=0",
                 "--set", "runtime.wandb_mode=disabled"],
                # Built, not copied from prebuilt/: the build and its progress are tested
                cwd=ROOT, env={**os.environ, "DFLASH_CACHE_DIR": str(shared),
                               "DFLASH_REBUILD_BUILTINS": "1"},
                stdout=subprocess.DEVNULL, stderr=err, text=True,
            )  # fmt: skip
        try:
            while proc.poll() is None:
                for beat in runs.glob("*/heartbeat.json"):
                    hb = read_heartbeat(beat)
                    p = hb.phase_progress if isinstance(hb, Heartbeat) else None
                    if (
                        p is not None
                        and p.total
                        and (not seen or seen[-1] != (p.unit, p.done, p.total))
                    ):
                        seen.append((p.unit, p.done, p.total))
                time.sleep(0.2)
        finally:  # a test timed out (or was interrupted) mid-build: no orphan build left
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        assert proc.returncode == 0, err_path.read_text()[-4000:]
    target = BUILTIN_TARGETS["tiny-qwen3-chat"][0]
    if not (dflash_cache_dir / target).exists():
        shutil.copytree(shared / target, dflash_cache_dir / target)
    (dflash_cache_dir / "datasets").mkdir(exist_ok=True)
    shutil.copy(answers, dflash_cache_dir / "datasets" / f"{ANSWERS}.jsonl")
    return ChatBuild(dflash_cache_dir, seen)


@pytest.fixture(scope="session")
def tiny_hybrid_target_dir(dflash_cache_dir: Path) -> Path:
    """The builtin tiny Qwen3.5 hybrid target, saved as the multimodal wrapper."""
    from trainer.builtins.resolve import resolve_target_path

    return resolve_target_path("builtin:tiny-qwen3.5")


@pytest.fixture(scope="session")
def tiny_hybrid_text_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The same tiny hybrid saved text-only (`Qwen3_5ForCausalLM`)."""
    from trainer.targets.tiny import build_tiny_target

    out = tmp_path_factory.mktemp("hybrid-text") / "tiny-qwen3.5-text"
    return build_tiny_target(out, family="qwen3.5-text")


@pytest.fixture(scope="session")
def tiny_tokenizer() -> PreTrainedTokenizerFast:
    from trainer.targets.tiny import build_tokenizer

    return build_tokenizer()


class TrainerProcess:
    """A real `python -m trainer` process, its stdout going to a file as under nohup."""

    def __init__(
        self,
        run_root: Path,
        *args: str,
        env: dict[str, str] | None = None,
        preexec_fn: Callable[[], None] | None = None,  # limits set in the child (RLIMIT_FSIZE)
    ) -> None:
        import os
        import subprocess

        self.run_root = run_root
        run_root.mkdir(parents=True, exist_ok=True)
        self.stdout_path = run_root / f"stdout-{len(list(run_root.glob('stdout-*')))}.txt"
        self._stdout = open(self.stdout_path, "w")  # noqa: SIM115
        before = set(run_root.iterdir())
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "trainer", "--run-root", str(run_root), *args],
            stdout=self._stdout,
            stderr=subprocess.STDOUT,
            cwd=ROOT,
            env={**os.environ, **(env or {})},
            preexec_fn=preexec_fn,  # noqa: PLW1509 (setrlimit and signal only: safe after fork)
        )
        self.run_dir = self._find_run_dir(before)

    def _find_run_dir(self, before: set[Path]) -> Path:
        import time

        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            new = [p for p in self.run_root.iterdir() if p.is_dir() and p not in before]
            if new:
                return new[0]
            if self.proc.poll() is not None:
                raise AssertionError(f"trainer exited early: {self.stdout_path.read_text()}")
            time.sleep(0.05)
        raise AssertionError("no run dir appeared within 30 s")

    def heartbeat(self) -> dict | None:
        import json

        try:
            return json.loads((self.run_dir / "heartbeat.json").read_text())
        except FileNotFoundError:
            return None

    def read(self, name: str) -> str:
        """A run dir file's text; "" until it exists."""
        try:
            return (self.run_dir / name).read_text()
        except FileNotFoundError:
            return ""

    def metrics(self) -> list[dict]:
        import json

        path = self.run_dir / "metrics.jsonl"
        if not path.exists():
            return []
        return [json.loads(ln) for ln in path.read_text().splitlines() if ln.strip()]

    def wait_for(self, predicate, timeout: float = 60.0, what: str = "condition"):
        import time

        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            value = predicate()
            if value:
                return value
            if self.proc.poll() is not None:
                value = predicate()
                if value:
                    return value
                raise AssertionError(
                    f"trainer exited ({self.proc.returncode}) before {what}:\n"
                    + self.stdout_path.read_text()[-3000:]
                )
            time.sleep(0.05)
        raise AssertionError(f"timed out after {timeout}s waiting for {what}")

    def wait_step(self, step: int, timeout: float = 60.0) -> dict:
        return self.wait_for(
            lambda: (hb := self.heartbeat()) and hb["step"] >= step and hb,
            timeout,
            f"step {step}",
        )

    def signal(self, sig: int) -> None:
        self.proc.send_signal(sig)

    def wait(self, timeout: float = 60.0) -> int:
        try:
            code = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            # Say where it is stuck: faulthandler's dump of every thread, and the log's end.
            self.proc.send_signal(signal.SIGUSR2)
            time.sleep(1.0)
            stacks = self.run_dir / "stacks-sigusr2.txt"
            dump = stacks.read_text()[-6000:] if stacks.exists() else "(no dump)"
            log = self.run_dir / "train.log"
            tail = log.read_text()[-3000:] if log.exists() else "(no train.log)"
            raise AssertionError(
                f"trainer still running after {timeout}s\n--- train.log\n{tail}\n"
                f"--- threads (SIGUSR2)\n{dump}"
            ) from None
        self._stdout.close()
        return code

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self._stdout.close()


@pytest.fixture
def start_trainer(tmp_path: Path):
    """start_trainer(*args, env=...) -> TrainerProcess with the tiny config; killed at the end."""
    procs: list[TrainerProcess] = []

    def start(*args: str, env: dict[str, str] | None = None, root: Path | None = None):
        # A resumed run takes its parent's config.json, not the file.
        config = [] if "--resume" in args else ["--config", str(TINY_CONFIG)]
        p = TrainerProcess(
            root or tmp_path / "runs",
            *config,
            "--set",
            "runtime.wandb_mode=disabled",
            *args,
            env=env,
        )
        procs.append(p)
        return p

    yield start
    for p in procs:
        p.kill()

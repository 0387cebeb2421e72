"""After a SIGKILL, the wrapper looks for the kernel's OOM killer (dflash_tui/agent/oom.py) and
the `killed` finding says what it found. Real processes only: the real wrapper (the agent
blob's `wrap` mode, as deploy ships it) around a real process that the real kernel kills,
in a real memory cgroup made for the test where this machine lets one be made; and a real
SIGKILL with the kernel log really unreadable (the wrapper run as nobody: dmesg_restrict)."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from test_diagnosis import NOW, events, store

from dflash_tui.agent import oom
from dflash_tui.diagnosis import diagnose
from dflash_tui.link.bundle import agent_blob
from trainer.contract.records import (
    ExitRecord,
    LaunchRecord,
    OomCheck,
    read_exit,
    read_launch,
)
from trainer.contract.typed import encode

MEMORY_V1 = Path("/sys/fs/cgroup/memory")
LIMIT = 96 << 20
# Touches 400 MiB page by page: far over the limit, so the kernel kills it.
HOG = "b = bytearray(400 << 20)\nfor i in range(0, len(b), 4096):\n    b[i] = 1\n"
KILLS_ITSELF = "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"


@pytest.fixture
def memory_cgroup() -> Iterator[Path]:
    """A cgroup v1 memory cgroup of its own with a 96 MiB limit, removed after; skipped where
    none can be made (cgroup v2 only, no root, a read-only /sys/fs/cgroup)."""
    path = MEMORY_V1 / f"dflash-test-{uuid.uuid4().hex[:8]}"
    try:
        path.mkdir()
    except OSError as e:
        pytest.skip(f"cannot make a memory cgroup under {MEMORY_V1}: {e}")
    try:
        (path / "memory.limit_in_bytes").write_text(str(LIMIT))
        if (path / "memory.memsw.limit_in_bytes").exists():  # no swapping out of the kill
            (path / "memory.memsw.limit_in_bytes").write_text(str(LIMIT))
        yield path
    finally:
        path.rmdir()  # its processes have exited: the wrapper waited for the trainer


def wrapped(
    run_dir: Path, code: str, first: list[str] | None = None, python: str = sys.executable
) -> ExitRecord:
    """Run `code` under the real wrapper (as deploy ships it) and return its exit.json;
    `first`: what runs the wrapper (a shell joining a cgroup, setpriv)."""
    script = run_dir.parent / "dflash_agent.py"
    script.write_bytes(agent_blob())
    script.chmod(0o644)
    wrap = [python, "-u", str(script), "wrap", "--run-dir", str(run_dir), "--"]
    r = subprocess.run(
        [*(first or []), *wrap, python, "-c", code],
        capture_output=True,
        text=True,
        cwd=run_dir.parent,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    assert "trainer exited: killed by SIGKILL" in r.stdout
    ended = read_exit(run_dir)
    assert isinstance(ended, ExitRecord) and ended.signal == "SIGKILL"
    return ended


def killed_finding(ended: ExitRecord):
    """The `killed` finding on killed_sigkill's recording with its exit record replaced by
    `ended` (documented edit: the same SIGKILL, the wrapper's oom check added)."""
    evs = events("recorded/killed_sigkill.jsonl")
    for e in evs:
        for holder in [e, *e.get("runs", [])]:
            if isinstance(holder.get("exit"), dict):
                holder["exit"] = {**encode(ended), "run_id": holder["exit"]["run_id"]}
    found = [f for f in diagnose(store(evs), NOW) if f.code == "killed"]
    assert len(found) == 1
    return found[0]


def test_the_oom_killer_in_a_real_cgroup(tmp_path, memory_cgroup):
    run_dir = tmp_path / "20260101-000000-oom-0000"
    run_dir.mkdir()
    join = ["sh", "-c", f'echo $$ > {memory_cgroup}/cgroup.procs && exec "$@"', "sh"]
    ended = wrapped(run_dir, HOG, join)
    launch = read_launch(run_dir)
    assert isinstance(launch, LaunchRecord) and launch.pid
    check = ended.oom
    assert check is not None
    assert check.events == str(memory_cgroup / "memory.oom_control")
    assert (check.oom_kills, check.events_error) == (1, "")
    # What the kernel itself counts there agrees.
    assert "oom_kill 1" in (memory_cgroup / "memory.oom_control").read_text()
    if not check.kernel_error:  # root here: the kernel log names the kill of this pid
        assert any(f"Killed process {launch.pid} " in ln for ln in check.kernel), check.kernel
    f = killed_finding(ended)
    assert f.title == "run killed by SIGKILL"
    assert (
        f"; oom_kill 1 in memory.oom_control of {memory_cgroup} since launch: the kernel's "
        "OOM killer; kernel: "
    ) in f.evidence
    assert f.action.startswith("the host's memory ran out (not the GPU's)")


def test_a_sigkill_with_no_oom_kill_and_the_kernel_log_unreadable():
    """The wrapper as nobody: dmesg is refused (kernel.dmesg_restrict), the memory cgroup's
    count is still readable, and nothing was OOM-killed: someone else sent SIGKILL."""
    # The agent is stdlib only: the system's Python, which nobody may run (a venv's may not).
    python = shutil.which("python3", path="/usr/bin:/bin")
    if os.geteuid() != 0 or shutil.which("setpriv") is None or python is None:
        pytest.skip("needs root, setpriv and /usr/bin/python3 to run the wrapper as nobody")
    if subprocess.run(["dmesg"], capture_output=True, check=False).returncode != 0:
        pytest.skip("dmesg is refused to root too: nothing to tell apart")
    top = Path(tempfile.mkdtemp(prefix="dflash-oom-"))  # pytest's tmp is root's alone
    try:
        top.chmod(0o777)
        run_dir = top / "20260101-000000-sigkill-0000"
        run_dir.mkdir()
        run_dir.chmod(0o777)
        nobody = ["setpriv", "--reuid", "65534", "--regid", "65534", "--clear-groups"]
        ended = wrapped(run_dir, KILLS_ITSELF, nobody, python)
    finally:
        shutil.rmtree(top)
    check = ended.oom
    assert check is not None and check.kernel == []
    assert check.kernel_error == "dmesg: read kernel buffer failed: Operation not permitted"
    mine, _ = oom.events_file(os.getpid())
    if not mine:
        pytest.skip("this machine's memory cgroup is not readable: the count is not checked")
    assert (check.events, check.oom_kills) == (mine, 0)  # the child stays in its parent's
    f = killed_finding(ended)
    assert f.evidence.endswith(
        f"; no OOM kill recorded in {Path(mine).name} of {Path(mine).parent}: something else "
        "sent SIGKILL; kernel log not readable (dmesg: read kernel buffer failed: Operation "
        "not permitted)"
    )
    assert f.action.startswith("find who sent SIGKILL")


def test_no_check_from_an_older_wrapper_keeps_the_kernel_log_advice():
    """killed_sigkill_h200 was recorded by a wrapper that looked for no OOM kill: the finding
    says where to look instead of what was found."""
    f = next(
        f for f in diagnose(store(events("recorded/killed_sigkill_h200.jsonl")), NOW)
        if f.code == "killed"
    )  # fmt: skip
    assert "oom_kill" not in f.evidence
    assert "dmesg -T" in f.action


def test_the_reader_on_a_real_events_file_and_its_odd_forms(tmp_path):
    """oom_kills on a copy of this machine's own memory cgroup file, then edited (documented):
    the count raised, the line removed, a value that is no number."""
    mine, why = oom.events_file(os.getpid())
    if not mine:
        pytest.skip(f"no memory cgroup file here: {why}")
    real = Path(mine).read_text()
    assert isinstance(oom.oom_kills(mine), int)
    copy = tmp_path / Path(mine).name
    copy.write_text(real)
    count = oom.oom_kills(str(copy))
    assert isinstance(count, int)
    lines = real.splitlines()
    copy.write_text("\n".join(f"oom_kill {count + 3}" if ln.startswith("oom_kill ") else ln
                              for ln in lines) + "\n")  # fmt: skip
    assert oom.oom_kills(str(copy)) == count + 3
    copy.write_text("\n".join(ln for ln in lines if not ln.startswith("oom_kill ")) + "\n")
    assert oom.oom_kills(str(copy)).endswith("no oom_kill line (a kernel older than 4.13)")
    copy.write_text("oom_kill -1\n")
    assert oom.oom_kills(str(copy)) == f"{copy}: oom_kill '-1'"
    assert oom.oom_kills(str(tmp_path / "gone")).endswith(": gone")
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    assert "not a regular file" in str(oom.oom_kills(str(fifo)))  # never blocks


def test_a_clean_exit_is_not_checked(tmp_path):
    """Only a SIGKILL is looked into: a process that exits (or takes a SIGTERM) has no
    oom in its exit.json."""
    run_dir = tmp_path / "20260101-000000-term-0000"
    run_dir.mkdir()
    script = tmp_path / "dflash_agent.py"
    script.write_bytes(agent_blob())
    term = f"import os, signal; os.kill(os.getpid(), signal.{signal.SIGTERM.name})"
    r = subprocess.run(
        [sys.executable, str(script), "wrap", "--run-dir", str(run_dir), "--",
         sys.executable, "-c", term],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    ended = json.loads((run_dir / "exit.json").read_text())
    assert ended["signal"] == "SIGTERM" and ended["oom"] is None


def test_what_could_not_be_read_is_said():
    """killed_sigkill's real exit record with its oom check edited (documented): the cgroup
    file gone at the death, dmesg refused. Nothing says who sent it: the kernel log advice
    stays; a count that fell (a cgroup made anew) is no kill either."""
    evs = events("recorded/killed_sigkill.jsonl")
    liveness = next(e for e in evs if e["type"] == "liveness")
    real = ExitRecord(**{**liveness["exit"], "oom": None})
    gone = "/sys/fs/cgroup/x/memory.events: gone"
    refused = "dmesg: read kernel buffer failed: Operation not permitted"
    check = OomCheck(events="/sys/fs/cgroup/x/memory.events", events_error=gone)
    check.kernel_error = refused
    f = killed_finding(dataclasses.replace(real, oom=check))
    assert f.evidence.endswith(
        f"; /sys/fs/cgroup/x/memory.events not readable ({gone}); kernel log not readable "
        f"({refused})"
    )
    assert "dmesg -T" in f.action
    fell = dataclasses.replace(check, oom_kills=-2, events_error="")
    f = killed_finding(dataclasses.replace(real, oom=fell))
    assert "no OOM kill recorded in memory.events of /sys/fs/cgroup/x" in f.evidence
    assert f.action.startswith("find who sent SIGKILL")

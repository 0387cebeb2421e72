"""Which processes are on each GPU (issue 33 A3): the real agent samples the stand-in NVML
(tests/infra/fake_nvml) over a real sshd, reads each listed process's user and command from
/proc, and `status`, `status --json` and the TUI's GPU processes view (`P`) show them, with
whether each is the followed run's. The processes are real ones this test starts; the run
is a run dir whose heartbeat names one of them as its trainer (the heartbeat is a real CPU
run's, tests/fixtures/heartbeats/training-cpu.json, with its pid, run id and time changed).
A command line is the host's text: a hostile one is shown escaped, and cut to its bound."""

from __future__ import annotations

import getpass
import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from monitor_helpers import cli, piped_env, wait_for
from test_layout_keys import screen_text
from test_ssh import fake_run

from dflash_tui.app import DFlashApp
from dflash_tui.targets import Target
from dflash_tui.widgets.screens import TextScreen
from trainer.contract.protocol import MAX_GPU_COMMAND, decode_event

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
GIB = 1 << 30
HOSTILE = "\x1b[2J\x1b]0;pwned\x07evil"  # clears the screen and retitles the terminal


def sleeper(*argv: str) -> subprocess.Popen[bytes]:
    """A real process whose command line carries `argv` (what NVML would list on a GPU)."""
    return subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(120)", *argv],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
    )


@pytest.fixture
def procs() -> Iterator[list[subprocess.Popen[bytes]]]:
    made: list[subprocess.Popen[bytes]] = []
    yield made
    for p in made:
        p.kill()
        p.wait()


def run_with_trainer(run_root: Path, pid: int) -> str:
    """A run dir whose heartbeat names `pid` as its trainer."""
    run_id = "20261204-120000-gpuprocs-0001"
    d = fake_run(run_root, run_id)
    hb = json.loads((FIXTURES / "heartbeats" / "training-cpu.json").read_text())
    hb.update(pid=pid, run_id=run_id, now=time.time(), pgid=pid, proc_start=0)
    (d / "heartbeat.json").write_text(json.dumps(hb))
    return run_id


@pytest.fixture
def gpu_host(sshd_factory: Any, pct_bin: Path, fake_gpu: Any, tmp_path: Path) -> Any:
    """A real sshd whose sessions see two stand-in H200s."""
    _, gpu = fake_gpu(2)
    server = sshd_factory(
        env={
            "PATH": f"{pct_bin}:/usr/local/bin:/usr/bin:/bin",
            "PCT_LOG": str(tmp_path / "p"),
            **gpu.env,
        }
    )
    return server, gpu


def ssh_args(server: Any, remote: Path) -> list[str]:
    return [
        f"ssh://{server.user}@127.0.0.1:{server.port}",
        "--identity",
        str(server.client_key),
        "--known-hosts",
        str(server.known_hosts),
        "--remote-dir",
        str(remote),
        "--python",
        sys.executable,
    ]


def test_status_and_its_json_list_each_gpus_processes_over_ssh(
    gpu_host: Any, procs: list[subprocess.Popen[bytes]], tmp_path: Path
) -> None:
    server, gpu = gpu_host
    trainer = sleeper("-m", "trainer", "--config", "tiny.toml")
    other = sleeper(HOSTILE + "x" * 400)  # someone else's job, with a hostile, long argv
    procs += [trainer, other]
    remote = tmp_path / "remote"
    run_with_trainer(remote / "runs", trainer.pid)
    gpu.add_process(trainer.pid, device=0, mem=40 * GIB)
    gpu.add_process(other.pid, device=1, mem=12 * GIB)
    gpu.add_process(trainer.pid, device=1, mem=2 * GIB)

    r = cli("status", *ssh_args(server, remote), "--json")
    snap = json.loads(r.stdout.splitlines()[-1])["state"]
    by_gpu = {g["index"]: g["processes"] for g in snap["gpus"]}
    me = getpass.getuser()
    assert [(p["pid"], p["user"], p["mem_used"], p["this_run"]) for p in by_gpu[0]] == [
        (trainer.pid, me, 40 * GIB, True)
    ]
    assert by_gpu[0][0]["command"].endswith("-m trainer --config tiny.toml")
    hostile = next(p for p in by_gpu[1] if p["pid"] == other.pid)
    assert hostile["this_run"] is False and hostile["local"] is True
    assert HOSTILE in hostile["command"]  # --json keeps the host's text exact…
    assert len(hostile["command"]) == MAX_GPU_COMMAND  # …and bounded

    r = cli("status", *ssh_args(server, remote))
    lines = r.stdout.splitlines()
    mine = [ln for ln in lines if ln.startswith(f"GPU 0  pid {trainer.pid}  {me}  40.0G  this run")]
    assert len(mine) == 1, r.stdout
    theirs = next(
        ln for ln in lines if ln.startswith(f"GPU 1  pid {other.pid}  {me}  12.0G  other")
    )
    assert (
        "\x1b" not in r.stdout and "\\x1b[2J\\x1b]0;pwned\\x07evil" in theirs
    )  # …status escapes it
    # Most memory first on a GPU: the other job's 12G before the trainer's 2G on GPU 1.
    assert lines.index(theirs) < next(
        i for i, ln in enumerate(lines) if ln.startswith(f"GPU 1  pid {trainer.pid}")
    )


def test_a_command_line_is_cut_at_the_boundary_whatever_the_agent_sends() -> None:
    """A hostile host's agent may send a megabyte of command line: the monitor keeps the
    sample and cuts the text to its bound."""
    dev = {
        "index": 0,
        "mem_used": 1,
        "mem_total": 2,
        "processes": [{"pid": 7, "user": "u" * 10_000, "command": "c" * (1 << 20)}],
    }
    e = decode_event({"type": "gpu", "t": 1.0, "backend": "nvml", "devices": [dev]})
    p = e.devices[0].processes[0]  # type: ignore[union-attr]
    assert (len(p.user), len(p.command)) == (32, MAX_GPU_COMMAND)


def test_the_gpu_processes_view_opens_with_P_at_80x24(
    local_target: Target,
    fake_gpu: Any,
    procs: list[subprocess.Popen[bytes]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The real local agent and the app at the smallest size: P opens the view, which names
    each process, escapes a hostile command line, and q comes back to the dashboard."""
    import asyncio

    _, gpu = fake_gpu(devices=2)
    other = sleeper(HOSTILE)
    procs.append(other)
    gpu.add_process(other.pid, device=1, mem=12 * GIB)
    for k, v in {**piped_env(), **gpu.env}.items():
        monkeypatch.setenv(k, v)

    async def go() -> None:
        app = DFlashApp(local_target, theme_name="dark")
        async with app.run_test(size=(80, 24)) as pilot:
            await wait_for(
                pilot,
                lambda: app.store.gpu and any(d.processes for d in app.store.gpu.devices),
                "a GPU sample with the process",
            )
            await pilot.press("P")
            await wait_for(pilot, lambda: isinstance(app.screen, TextScreen), "the view")
            text = screen_text(app)
            assert "GPU processes on local" in text
            assert "GPU 1  H200" in text and "1 process (12.0G)" in text, text
            assert f"pid {other.pid}" in text and "\\x1b[2J" in text, text
            await pilot.press("q")
            await wait_for(pilot, lambda: not isinstance(app.screen, TextScreen), "the dashboard")

    asyncio.run(go())

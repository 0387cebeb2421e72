"""The monitor over a real sshd on 127.0.0.1, through the `pct exec` prefix, with faults."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest
from monitor_helpers import NO_WANDB, TINY
from test_control_local import deploy, launch

from dflash_tui.link.link import LinkError
from dflash_tui.targets import Target
from trainer.contract.protocol import DumpStacks, Kill, Launch, ReadFile

ROOT = Path(__file__).resolve().parents[2]


def ssh_target(
    sshd, remote_dir: Path, port: int | None = None, known_hosts=None, pct: bool = True
) -> Target:
    return Target(
        name="gpu-box",
        kind="ssh",
        host="127.0.0.1",
        port=port or sshd.port,
        user=sshd.user,
        identity=str(sshd.client_key),
        known_hosts=str(known_hosts or sshd.known_hosts),
        remote_dir=str(remote_dir),
        python=sys.executable,
        exec_prefix=("pct", "exec", "200", "--") if pct else (),
    )


def fake_run(run_root: Path, run_id: str = "20260101-000000-fake-0000") -> Path:
    d = run_root / run_id
    d.mkdir(parents=True)
    (d / "config.json").write_text(json.dumps({"name": "fake", "run": {"created": time.time()}}))
    (d / "train.log").write_text("")
    return d


class Appender(threading.Thread):
    """Appends `line N` to a file every few ms, as a trainer would."""

    def __init__(self, path: Path, every_s: float = 0.005) -> None:
        super().__init__(daemon=True)
        self.path, self.every_s, self.n = path, every_s, 0
        self.halt = threading.Event()

    def run(self) -> None:
        with open(self.path, "a", buffering=1) as f:
            while not self.halt.is_set():
                f.write(f"line {self.n}\n")
                f.flush()
                self.n += 1
                time.sleep(self.every_s)


@pytest.fixture
def gpu_sshd(sshd_factory, pct_bin, fake_gpu, fake_nvml_path, tmp_path):
    _, gpu = fake_gpu(2)
    pct_log = tmp_path / "pct.log"
    server = sshd_factory(
        env={
            "PATH": f"{pct_bin}:/usr/local/bin:/usr/bin:/bin",
            "PCT_LOG": str(pct_log),
            **gpu.env,
        }
    )
    return server, gpu, pct_log


def test_control_over_ssh_through_pct(gpu_sshd, remote_factory, tmp_path):
    server, gpu, pct_log = gpu_sshd
    r = remote_factory(ssh_target(server, tmp_path / "remote"))
    r.wait(lambda s: s.hello is not None, 30, "hello over ssh")
    assert r.store.hello.gpu_backend == "nvml"  # the fake, found through PYTHONPATH
    r.wait(lambda s: s.gpu and len(s.gpu.devices) == 2, 10, "GPU samples")
    assert r.store.gpu.devices[0].name == "NVIDIA H200"

    deploy(r)
    run = launch(r, "train.max_steps=100000")
    r.wait(lambda s: s.run_id == run["run_id"] and len(s.step_lines) >= 1, 90, "step lines")
    pid = r.store.heartbeat.pid
    gpu.add_process(pid, device=1, mem=40 << 30)  # the trainer "holds" 40 GiB on GPU 1
    r.wait(
        lambda s: any(p.pid == pid for d in s.gpu.devices for p in d.processes),
        10,
        "the trainer on GPU 1",
    )

    dump = r.request(DumpStacks(pyspy=False), timeout=120)
    assert 'Thread "drafter-0"' in dump["text"]

    progress = []
    k = r.request(Kill(timeout_s=30, drain_timeout_s=20), timeout=90, on_progress=progress.append)
    assert k["signal"] == "SIGTERM" and k["orphans"] == [] and k["drain_s"] is not None
    assert any("released" in p.message for p in progress)
    r.wait(lambda s: not any(d.processes for d in s.gpu.devices), 10, "GPU memory freed")

    calls = [json.loads(ln) for ln in pct_log.read_text().splitlines()]
    assert calls and all(c["ctid"] == 200 for c in calls)
    assert calls[0]["argv"][0] == sys.executable and "-c" in calls[0]["argv"]


def test_no_line_lost_or_doubled_across_20_dropped_connections(
    sshd, tcp_proxy, remote_factory, tmp_path
):
    remote = tmp_path / "remote"
    run_dir = fake_run(remote / "runs")
    proxy = tcp_proxy("127.0.0.1", sshd.port)
    target = ssh_target(
        sshd, remote, port=proxy.port, known_hosts=sshd.known_hosts_for(proxy.port), pct=False
    )
    r = remote_factory(target)
    r.wait(lambda s: s.run_id == run_dir.name, 30, "following the fake run")
    writer = Appender(run_dir / "train.log")
    writer.start()
    for drop in range(20):
        sessions = r.link.sessions
        r.wait(lambda s, n=drop: len(r.lines()) > n * 5, 30, "lines before the drop")
        proxy.drop_all()
        r.wait(
            lambda s, k=sessions: r.link.sessions > k and s.link.state == "connected",
            30,
            f"reconnect after drop {drop + 1}",
        )
    writer.halt.set()
    writer.join()
    r.wait(lambda s: len(r.lines()) >= writer.n, 30, "every line")
    got = [e["text"] for e in r.lines()]
    assert got == [f"line {i}" for i in range(writer.n)]
    assert r.link.sessions >= 21


def test_a_host_key_mismatch_is_refused(sshd, remote_factory, tmp_path):
    target = ssh_target(sshd, tmp_path / "remote", known_hosts=sshd.wrong_known_hosts, pct=False)
    r = remote_factory(target)
    r.wait(lambda s: s.link.state == "refused", 30, "refused")
    assert "host key" in r.store.link.detail and "known_hosts" in r.store.link.detail
    time.sleep(1.5)
    assert r.link.sessions == 0 and r.store.link.state == "refused"  # not retried
    with pytest.raises(LinkError, match="host key"):
        r.call(r.link.wait_connected(1))


def test_an_unreachable_host_backs_off_with_a_clear_message(tmp_path):
    # The CLI, as a user runs it: exit 3, one message, no traceback.
    import socket

    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()  # nothing listens there now
    t0 = time.monotonic()
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "dflash_tui",
            "status",
            f"ssh://nobody@127.0.0.1:{port}",
            "--known-hosts",
            str(tmp_path / "kh"),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    )
    out = r.stdout + r.stderr
    assert r.returncode == 3, out
    assert "unreachable" in out and "Traceback" not in out
    assert time.monotonic() - t0 < 40


def test_backoff_grows_while_the_host_stays_down(sshd, tcp_proxy, remote_factory, tmp_path):
    proxy = tcp_proxy("127.0.0.1", sshd.port)
    proxy.refuse(True)
    target = ssh_target(
        sshd,
        tmp_path / "remote",
        port=proxy.port,
        known_hosts=sshd.known_hosts_for(proxy.port),
        pct=False,
    )
    r = remote_factory(target)
    r.wait(lambda s: sum(e.get("state") == "reconnecting" for e in r.events) >= 3, 30, "retries")
    delays = [e["retry_in"] for e in r.events if e.get("state") == "reconnecting"]
    assert delays[2] > delays[0]
    assert "refused" in r.store.link.detail.lower() or "unreachable" in r.store.link.detail
    proxy.refuse(False)
    r.wait(lambda s: s.link.state == "connected", 30, "connected once the host is back")


def test_a_torn_heartbeat_keeps_the_last_good_state(sshd, remote_factory, tmp_path):
    remote = tmp_path / "remote"
    run_dir = fake_run(remote / "runs")
    hb = {
        "schema": 1,
        "run_id": run_dir.name,
        "pid": os.getpid(),
        "host": "gpu-box",
        "phase": "training",
        "step": 7,
        "now": time.time(),
    }
    (run_dir / "heartbeat.json").write_text(json.dumps(hb))
    r = remote_factory(ssh_target(sshd, remote, pct=False))
    r.wait(lambda s: s.heartbeat and s.heartbeat.step == 7, 30, "the good heartbeat")
    (run_dir / "heartbeat.json").write_text('{"schema": 1, "phase": "trai')
    r.wait(lambda s: s.heartbeat_error, 10, "the torn one noticed")
    assert r.store.heartbeat.step == 7


def test_a_killed_agent_is_restarted_and_resumes(sshd, remote_factory, tmp_path):
    remote = tmp_path / "remote"
    run_dir = fake_run(remote / "runs")
    writer = Appender(run_dir / "train.log", every_s=0.01)
    writer.start()
    r = remote_factory(ssh_target(sshd, remote, pct=False))
    r.wait(lambda s: len(r.lines()) > 20, 30, "lines")
    first_pid = r.store.hello.pid
    os.kill(first_pid, signal.SIGKILL)
    r.wait(lambda s: s.hello.pid != first_pid, 30, "a new agent")
    time.sleep(0.5)
    writer.halt.set()
    writer.join()
    r.wait(lambda s: len(r.lines()) >= writer.n, 30, "every line")
    assert [e["text"] for e in r.lines()] == [f"line {i}" for i in range(writer.n)]


def test_hostile_names_and_paths_execute_nothing(sshd, remote_factory, tmp_path, monkeypatch):
    """Every injected command would create a file whose name holds this test's own token:
    a file left in /tmp by anything else (another test, an earlier session) cannot be
    mistaken for an injection, and any file bearing the token anywhere we look is one."""
    monkeypatch.chdir(tmp_path)
    tok = f"pwn{uuid.uuid4().hex[:10]}"
    evil = tmp_path / f"a;touch {tok}x" / f"$(touch {tok})" / f"it's `touch {tok}i`"
    r = remote_factory(ssh_target(sshd, evil, pct=False))
    r.wait(lambda s: s.hello is not None, 30, "hello")
    assert r.store.hello.remote_dir == str(evil)
    deploy(r)
    hostile_name = f'name = "x;touch {tok}y $(touch {tok}z) \\"q\\""'
    cfg = TINY.read_text().replace('name = "tiny-cpu"', hostile_name)
    bad = r.request(
        Launch(
            config_toml=cfg,
            overrides=[NO_WANDB, "train.max_steps=1", f'name="$(touch {tok}w);touch {tok}v"'],
            name=f"$(touch {tok}u);x",
        ),
        timeout=120,
    )
    run_dir = Path(bad["run_dir"])
    assert run_dir.parent == evil / "runs" and "$(" not in run_dir.name
    r.wait(lambda s: (run_dir / "exit.json").exists(), 90, "the run finished")
    for where in (tmp_path, Path.home(), evil, run_dir, Path("/tmp")):
        made = [p.name for p in where.iterdir() if p.name.startswith(tok)]
        assert not made, (where, made)
    # The folders we made ourselves hold the token inside their names, never at the start.
    assert not [p for p in tmp_path.rglob(f"{tok}*")], "an injected command ran"
    with pytest.raises(LinkError, match="bad run id"):
        r.request(ReadFile(run_id="../../etc", name="passwd"))
    with pytest.raises(LinkError, match="bad file name"):
        r.request(ReadFile(run_id=run_dir.name, name="../../x"))

"""Fixtures for the real-SSH test infrastructure (loaded by tests/conftest.py)."""

from __future__ import annotations

import itertools
import json
import os
import shutil
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
from infra.sshd import SSHD, SshServer
from infra.tcpproxy import TcpProxy

INFRA = Path(__file__).resolve().parent
PCT_BIN = INFRA / "bin"
FAKE_NVML = INFRA / "fake_nvml"

MIB = 1024 * 1024
H200_MEM_TOTAL = 143771 * MIB  # what an H200 reports (nvidia-smi: 143771 MiB)

_failed = pytest.StashKey[bool]()


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    # Remember a failed call so that the sshd fixture can show the server's log at teardown.
    report = yield
    if report.when == "call" and report.failed:
        item.stash[_failed] = True
    return report


# --- sshd ------------------------------------------------------------------------------


SshdFactory = Callable[..., SshServer]


@pytest.fixture
def sshd_factory(
    request: pytest.FixtureRequest, tmp_path: Path, dflash_cache_dir: Path
) -> Iterator[SshdFactory]:
    """sshd_factory(env=None) -> a started SshServer; stopped at teardown.

    Every server's sessions get DFLASH_CACHE_DIR=<the session's cache>, so remote trainers
    reuse the tiny target built once per session; env adds to or overrides it.
    """
    if not os.access(SSHD, os.X_OK):
        pytest.skip(f"OpenSSH server not installed: no {SSHD} (apt-get install openssh-server)")
    if shutil.which("ssh-keygen") is None:
        pytest.skip("ssh-keygen not found (apt-get install openssh-client)")
    servers: list[SshServer] = []
    counter = itertools.count()

    def make(env: Mapping[str, str] | None = None) -> SshServer:
        full_env = {"DFLASH_CACHE_DIR": str(dflash_cache_dir), **(env or {})}
        server = SshServer(full_env, workdir=tmp_path / f"sshd-{next(counter)}")
        servers.append(server)
        return server.start()

    yield make
    for server in servers:
        if request.node.stash.get(_failed, False):
            print(f"--- {server!r} log ---\n{server.log()[-4000:]}")
        server.stop()


@pytest.fixture
def sshd(sshd_factory: SshdFactory) -> SshServer:
    """A started real sshd on 127.0.0.1 (see SshServer), sessions sharing DFLASH_CACHE_DIR."""
    return sshd_factory()


# --- network ---------------------------------------------------------------------------


@pytest.fixture
def tcp_proxy() -> Iterator[Callable[[str, int], TcpProxy]]:
    """tcp_proxy(host, port) -> TcpProxy forwarding 127.0.0.1:proxy.port there; closed after."""
    proxies: list[TcpProxy] = []

    def make(host: str, port: int) -> TcpProxy:
        proxy = TcpProxy(host, port)
        proxies.append(proxy)
        return proxy

    yield make
    for proxy in proxies:
        proxy.close()


# --- stand-ins -------------------------------------------------------------------------


@pytest.fixture(scope="session")
def pct_bin() -> Path:
    """Directory holding the stand-in `pct` (and `nvidia-smi`): prepend it to PATH."""
    for tool in ("pct", "nvidia-smi"):
        if not os.access(PCT_BIN / tool, os.X_OK):
            raise RuntimeError(f"{PCT_BIN / tool} is not executable: git update-index --chmod=+x")
    return PCT_BIN


@pytest.fixture(scope="session")
def fake_nvml_path() -> Path:
    """Directory whose pynvml.py fakes NVML: put it first on PYTHONPATH of the monitored side."""
    return FAKE_NVML


class FakeGpu:
    """Writes the fake NVML state file (atomically: readers re-read it on every call)."""

    def __init__(self, state_path: Path, devices: int = 2) -> None:
        self.state_path = state_path
        self.write(
            {
                "driver": "550.127.05",
                "devices": [
                    {
                        "name": "NVIDIA H200",
                        "uuid": f"GPU-00000000-0000-4000-8000-{i:012x}",
                        "mem_total": H200_MEM_TOTAL,
                        "mem_base": 4 * MIB,  # an idle H200 shows a few MiB used
                        "util": 0,
                        "power_w": 75.0,
                        "temp_c": 30,
                    }
                    for i in range(devices)
                ],
                "processes": [],
            }
        )

    @property
    def env(self) -> dict[str, str]:
        """Variables that make a process on this machine see this fake GPU via pynvml."""
        pythonpath = os.pathsep.join(p for p in (str(FAKE_NVML), os.environ.get("PYTHONPATH")) if p)
        return {"FAKE_NVML_STATE": str(self.state_path), "PYTHONPATH": pythonpath}

    def read(self) -> dict[str, Any]:
        return json.loads(self.state_path.read_text())

    def write(self, state: Mapping[str, Any]) -> None:
        tmp = self.state_path.with_suffix(".tmp")
        tmp.write_text(json.dumps(state, indent=1))
        os.replace(tmp, self.state_path)

    def add_process(self, pid: int, device: int = 0, mem: int = 1024 * MIB) -> None:
        state = self.read()
        state["processes"].append({"pid": pid, "device": device, "mem": mem})
        self.write(state)

    def remove_process(self, pid: int) -> None:
        state = self.read()
        state["processes"] = [p for p in state["processes"] if p["pid"] != pid]
        self.write(state)

    def set_device(self, index: int, **fields: Any) -> None:
        """e.g. set_device(0, util=97, power_w=690.5, temp_c=71)."""
        state = self.read()
        state["devices"][index].update(fields)
        self.write(state)

    def unload_driver(self) -> None:
        """Remove the state file: nvmlInit then fails with Driver Not Loaded, nvidia-smi exits 9."""
        self.state_path.unlink(missing_ok=True)


@pytest.fixture
def fake_gpu(tmp_path: Path) -> Callable[..., tuple[Path, FakeGpu]]:
    """fake_gpu(devices=2) -> (state_path, FakeGpu): a fresh fake NVML state of H200s."""
    counter = itertools.count()

    def make(devices: int = 2) -> tuple[Path, FakeGpu]:
        gpu = FakeGpu(tmp_path / f"fake-nvml-{next(counter)}.json", devices)
        return gpu.state_path, gpu

    return make

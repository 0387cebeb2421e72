"""The test infrastructure itself: a real sshd, a real TCP proxy, and the two stand-ins."""

from __future__ import annotations

import asyncio
import importlib.util
import inspect
import json
import os
import shlex
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import asyncssh
import pytest
from infra.fixtures import MIB, FakeGpu
from infra.sshd import SshServer
from infra.tcpproxy import TcpProxy

pytestmark = pytest.mark.timeout(60)


def opts(sshd: SshServer, port: int | None = None, known_hosts: Path | None = None) -> dict:
    """asyncssh.connect(**opts(...)) as the monitor would connect: known_hosts enforced."""
    return {
        "host": sshd.host,
        "port": port or sshd.port,
        "username": sshd.user,
        "client_keys": [str(sshd.client_key)],
        "known_hosts": str(known_hosts or sshd.known_hosts),
        "config": [],  # hermetic: ignore ~/.ssh/config
    }


async def wait_closed(conn: asyncssh.SSHClientConnection, timeout: float = 5.0) -> None:
    await asyncio.wait_for(conn.wait_closed(), timeout)


# --- sshd ------------------------------------------------------------------------------


def test_system_ssh_client_logs_in_through_ssh_config(sshd: SshServer, dflash_cache_dir: Path):
    out = subprocess.run(
        sshd.ssh_argv('echo hi; printf "%s" "$DFLASH_CACHE_DIR"'), capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr + sshd.log()
    assert out.stdout == f"hi\n{dflash_cache_dir}"
    # The session ends with the command (its sshd child may take a moment to exit).
    deadline = time.monotonic() + 5
    while sshd.connections() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert sshd.connections() == []


def test_system_ssh_client_rejects_a_changed_host_key(sshd: SshServer):
    argv = sshd.ssh_argv("echo", "hi", options={"UserKnownHostsFile": str(sshd.wrong_known_hosts)})
    out = subprocess.run(argv, capture_output=True, text=True)
    assert out.returncode == 255
    assert "REMOTE HOST IDENTIFICATION HAS CHANGED" in out.stderr
    assert out.stdout == ""


def test_asyncssh_runs_commands_with_the_servers_environment(
    sshd_factory: Callable[..., SshServer],
):
    tricky = 'a b "c" $HOME #x \\y'  # SetEnv quoting: spaces, quotes, $, #, backslash
    sshd = sshd_factory(env={"DFLASH_TEST_VALUE": tricky})

    async def main() -> None:
        async with asyncssh.connect(**opts(sshd)) as conn:
            result = await conn.run("echo hi", check=True)
            assert result.stdout == "hi\n"
            result = await conn.run("printenv DFLASH_TEST_VALUE", check=True)
            assert result.stdout == tricky + "\n"
        # The ssh_config is usable by asyncssh as well as by OpenSSH.
        async with asyncssh.connect("gpu-box", config=[str(sshd.ssh_config)]) as conn:
            result = await conn.run("echo via-config", check=True)
            assert result.stdout == "via-config\n"

    asyncio.run(main())


def test_asyncssh_refuses_a_wrong_host_key(sshd: SshServer):
    async def main() -> None:
        with pytest.raises(asyncssh.HostKeyNotVerifiable):
            async with asyncssh.connect(**opts(sshd, known_hosts=sshd.wrong_known_hosts)):
                pass

    asyncio.run(main())


def test_kill_connections_ends_a_live_session(sshd: SshServer):
    async def main() -> None:
        conn = await asyncssh.connect(**opts(sshd))
        proc = await conn.create_process("cat")  # exits by itself once sshd is gone
        proc.stdin.write("ping\n")
        assert await asyncio.wait_for(proc.stdout.readline(), 5) == "ping\n"
        assert len(sshd.connections()) == 1

        killed = await asyncio.to_thread(sshd.kill_connections)
        assert killed
        await wait_closed(conn)
        assert sshd.connections() == []

        # Only the connections died: the server still accepts new ones.
        async with asyncssh.connect(**opts(sshd)) as conn2:
            assert (await conn2.run("echo again", check=True)).stdout == "again\n"

    asyncio.run(main())


# --- TCP proxy -------------------------------------------------------------------------


@pytest.mark.serial  # a time bound: not beside another test's trainer
def test_proxy_forwards_and_drop_all_cuts_live_connections(
    sshd: SshServer, tcp_proxy: Callable[[str, int], TcpProxy]
):
    proxy = tcp_proxy(sshd.host, sshd.port)
    known_hosts = sshd.known_hosts_for(proxy.port)

    async def main() -> None:
        conn = await asyncssh.connect(**opts(sshd, proxy.port, known_hosts))
        proc = await conn.create_process("cat")
        proc.stdin.write("through the proxy\n")
        assert await asyncio.wait_for(proc.stdout.readline(), 5) == "through the proxy\n"
        assert proxy.live == 1

        t0 = time.monotonic()
        assert proxy.drop_all() == 1
        await wait_closed(conn)
        assert time.monotonic() - t0 < 1.0  # a cut is noticed at once, not by a timeout
        assert proxy.live == 0

        # New connections are still forwarded after a drop.
        async with asyncssh.connect(**opts(sshd, proxy.port, known_hosts)) as conn2:
            assert (await conn2.run("echo back", check=True)).stdout == "back\n"
        assert proxy.connections_made == 2

    asyncio.run(main())


def test_proxy_refuse_gives_connection_refused_then_recovers(
    sshd: SshServer, tcp_proxy: Callable[[str, int], TcpProxy]
):
    proxy = tcp_proxy(sshd.host, sshd.port)
    proxy.refuse(True)
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection((proxy.host, proxy.port), timeout=2)
    proxy.refuse(False)

    known_hosts = sshd.known_hosts_for(proxy.port)

    async def main() -> None:
        async with asyncssh.connect(**opts(sshd, proxy.port, known_hosts)) as conn:
            assert (await conn.run("echo up", check=True)).stdout == "up\n"

    asyncio.run(main())
    assert proxy.connections_made == 1


def test_proxy_stall_holds_bytes_until_released(
    sshd: SshServer, tcp_proxy: Callable[[str, int], TcpProxy]
):
    proxy = tcp_proxy(sshd.host, sshd.port)

    async def main() -> None:
        known_hosts = sshd.known_hosts_for(proxy.port)
        async with asyncssh.connect(**opts(sshd, proxy.port, known_hosts)) as conn:
            proxy.stall(True)
            pending = asyncio.ensure_future(conn.run("echo late", check=True))
            await asyncio.sleep(0.3)
            assert not pending.done()  # silent partition: no error, no data
            proxy.stall(False)
            assert (await asyncio.wait_for(pending, 5)).stdout == "late\n"

    asyncio.run(main())


# --- pct stand-in ----------------------------------------------------------------------

HOSTILE = ["a b", ";touch x", "$(id)", "`id`", "*", "'", '"', "\\", ""]


def test_pct_execs_its_argument_list_untouched(pct_bin: Path, tmp_path: Path):
    log = tmp_path / "pct.jsonl"
    out = subprocess.run(
        [pct_bin / "pct", "exec", "200", "--", "printf", "%s|", *HOSTILE],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env={**os.environ, "PCT_LOG": str(log)},
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout == "".join(f"{a}|" for a in HOSTILE)
    assert not (tmp_path / "x").exists()  # no shell ever ran `;touch x`
    entry = json.loads(log.read_text())
    assert entry["ctid"] == 200
    assert entry["argv"] == ["printf", "%s|", *HOSTILE]


def test_pct_passes_stdin_and_exit_status_through(pct_bin: Path):
    pct = str(pct_bin / "pct")
    out = subprocess.run([pct, "exec", "7", "--", "cat"], input=b"\x00bytes\n", capture_output=True)
    assert (out.returncode, out.stdout) == (0, b"\x00bytes\n")
    out = subprocess.run([pct, "exec", "7", "--", "sh", "-c", "exit 7"])
    assert out.returncode == 7


@pytest.mark.parametrize(
    "args",
    [
        [],
        ["exec"],
        ["list"],
        ["exec", "200", "echo", "hi"],  # missing --
        ["exec", "abc", "--", "echo"],  # CTID not all digits
        ["exec", "200", "--"],  # no command
        ["enter", "200", "--", "echo"],
    ],
)
def test_pct_bad_usage_exits_2(pct_bin: Path, tmp_path: Path, args: list[str]):
    log = tmp_path / "pct.jsonl"
    out = subprocess.run(
        [pct_bin / "pct", *args],
        capture_output=True,
        text=True,
        env={**os.environ, "PCT_LOG": str(log)},
    )
    assert out.returncode == 2
    assert "USAGE: pct exec" in out.stderr
    assert out.stdout == ""
    assert not log.exists()


def test_pct_over_ssh_runs_a_shlex_joined_command_verbatim(
    sshd_factory: Callable[..., SshServer], pct_bin: Path, tmp_path: Path
):
    """The whole chain the monitor uses: asyncssh -> sshd -> login shell -> pct -> argv."""
    log = tmp_path / "pct.jsonl"
    sshd = sshd_factory(env={"PATH": f"{pct_bin}:{os.environ['PATH']}", "PCT_LOG": str(log)})
    argv = ["pct", "exec", "200", "--", "printf", "%s|", *HOSTILE]

    async def main() -> None:
        async with asyncssh.connect(**opts(sshd)) as conn:
            result = await conn.run(f"cd {shlex.quote(str(tmp_path))} && {shlex.join(argv)}")
            assert result.exit_status == 0, result.stderr
            assert result.stdout == "".join(f"{a}|" for a in HOSTILE)

    asyncio.run(main())
    assert not (tmp_path / "x").exists()
    assert json.loads(log.read_text())["argv"] == argv[4:]


# --- fake NVML / nvidia-smi ------------------------------------------------------------


def load_fake_pynvml(fake_nvml_path: Path) -> ModuleType:
    """The fake under a private name: `pynvml` in sys.modules stays untouched for other tests."""
    spec = importlib.util.spec_from_file_location("fake_pynvml", fake_nvml_path / "pynvml.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_fake_nvml_reports_a_process_only_while_its_pid_lives(
    fake_gpu: Callable[..., tuple[Path, FakeGpu]],
    fake_nvml_path: Path,
    monkeypatch: pytest.MonkeyPatch,
):
    nvml = load_fake_pynvml(fake_nvml_path)
    state_path, gpu = fake_gpu(devices=2)
    monkeypatch.setenv("FAKE_NVML_STATE", str(state_path))
    trainer = subprocess.Popen(["sleep", "30"])
    try:
        gpu.add_process(trainer.pid, device=1, mem=2048 * MIB)
        nvml.nvmlInit()
        assert nvml.nvmlDeviceGetCount() == 2
        h1 = nvml.nvmlDeviceGetHandleByIndex(1)
        assert nvml.nvmlDeviceGetName(h1) == "NVIDIA H200"
        assert nvml.nvmlDeviceGetUUID(h1).startswith("GPU-")
        procs = nvml.nvmlDeviceGetComputeRunningProcesses(h1)
        assert [(p.pid, p.usedGpuMemory) for p in procs] == [(trainer.pid, 2048 * MIB)]
        mem = nvml.nvmlDeviceGetMemoryInfo(h1)
        assert (mem.used, mem.total - mem.used) == (2052 * MIB, mem.free)
        h0 = nvml.nvmlDeviceGetHandleByIndex(0)
        assert nvml.nvmlDeviceGetComputeRunningProcesses(h0) == []
        assert nvml.nvmlDeviceGetMemoryInfo(h0).used == 4 * MIB

        # Killed but not yet reaped (a zombie) already counts as gone, as with the driver.
        trainer.send_signal(signal.SIGKILL)
        deadline = time.monotonic() + 5
        while nvml.nvmlDeviceGetComputeRunningProcesses(h1) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert nvml.nvmlDeviceGetComputeRunningProcesses(h1) == []
        assert nvml.nvmlDeviceGetMemoryInfo(h1).used == 4 * MIB

        # Readings follow the state file while the program runs.
        gpu.set_device(0, util=97, power_w=690.5, temp_c=71)
        assert nvml.nvmlDeviceGetUtilizationRates(h0).gpu == 97
        assert nvml.nvmlDeviceGetPowerUsage(h0) == 690500  # milliwatts
        assert nvml.nvmlDeviceGetTemperature(h0, nvml.NVML_TEMPERATURE_GPU) == 71
        nvml.nvmlShutdown()
    finally:
        trainer.kill()
        trainer.wait()


def test_fake_nvml_errors_like_nvml(
    fake_gpu: Callable[..., tuple[Path, FakeGpu]],
    fake_nvml_path: Path,
    monkeypatch: pytest.MonkeyPatch,
):
    nvml = load_fake_pynvml(fake_nvml_path)
    monkeypatch.delenv("FAKE_NVML_STATE", raising=False)
    with pytest.raises(nvml.NVMLError) as err:
        nvml.nvmlInit()
    assert isinstance(err.value, nvml.NVMLError_DriverNotLoaded)
    assert err.value.value == nvml.NVML_ERROR_DRIVER_NOT_LOADED
    assert str(err.value) == "Driver Not Loaded"

    state_path, gpu = fake_gpu(devices=1)
    monkeypatch.setenv("FAKE_NVML_STATE", str(state_path))
    with pytest.raises(nvml.NVMLError_Uninitialized):
        nvml.nvmlDeviceGetCount()
    nvml.nvmlInit()
    with pytest.raises(nvml.NVMLError_InvalidArgument):
        nvml.nvmlDeviceGetHandleByIndex(1)
    gpu.unload_driver()
    with pytest.raises(nvml.NVMLError_GpuIsLost):
        nvml.nvmlDeviceGetCount()
    nvml.nvmlShutdown()


HEALTH_FUNCTIONS = (
    "nvmlDeviceGetClockInfo",
    "nvmlDeviceGetMaxClockInfo",
    "nvmlDeviceGetSupportedClocksEventReasons",
    "nvmlDeviceGetCurrentClocksEventReasons",
    "nvmlDeviceGetCurrentClocksThrottleReasons",
    "nvmlDeviceGetEccMode",
    "nvmlDeviceGetTotalEccErrors",
    "nvmlDeviceGetEnforcedPowerLimit",
    "nvmlDeviceGetPowerManagementLimit",
)


def test_fake_nvml_health_readings_have_the_real_bindings_names_and_values(
    fake_nvml_path: Path,
):
    """Against nvidia-ml-py itself (a dependency; it imports without a driver)."""
    import pynvml as real

    nvml = load_fake_pynvml(fake_nvml_path)
    assert Path(real.__file__).parent.name != "fake_nvml"
    for name in HEALTH_FUNCTIONS:
        ours, theirs = (
            inspect.signature(getattr(nvml, name)),
            inspect.signature(getattr(real, name)),
        )
        assert list(ours.parameters) == list(theirs.parameters), name
    constants = [
        n for n in dir(nvml) if n.startswith(("nvmlClocks", "NVML_CLOCK_", "NVML_MEMORY_"))
    ]
    constants += ["NVML_VOLATILE_ECC", "NVML_AGGREGATE_ECC", "NVML_ERROR_FUNCTION_NOT_FOUND"]
    assert len(constants) > 20
    assert {n: getattr(nvml, n) for n in constants} == {n: getattr(real, n) for n in constants}


def test_fake_nvml_health_readings_and_their_errors(
    fake_gpu: Callable[..., tuple[Path, FakeGpu]],
    fake_nvml_path: Path,
    monkeypatch: pytest.MonkeyPatch,
):
    nvml = load_fake_pynvml(fake_nvml_path)
    state_path, gpu = fake_gpu(devices=2)
    monkeypatch.setenv("FAKE_NVML_STATE", str(state_path))
    nvml.nvmlInit()
    h0, h1 = nvml.nvmlDeviceGetHandleByIndex(0), nvml.nvmlDeviceGetHandleByIndex(1)
    # an H200 at rest when the state says nothing
    assert nvml.nvmlDeviceGetClockInfo(h0, nvml.NVML_CLOCK_SM) == 1980
    assert nvml.nvmlDeviceGetMaxClockInfo(h0, nvml.NVML_CLOCK_SM) == 1980
    assert nvml.nvmlDeviceGetCurrentClocksEventReasons(h0) == nvml.nvmlClocksEventReasonNone
    assert nvml.nvmlDeviceGetEnforcedPowerLimit(h0) == 700_000  # milliwatts
    assert nvml.nvmlDeviceGetEccMode(h0) == [nvml.NVML_FEATURE_ENABLED] * 2
    unc, vol, agg = (
        nvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
        nvml.NVML_VOLATILE_ECC,
        nvml.NVML_AGGREGATE_ECC,
    )
    assert nvml.nvmlDeviceGetTotalEccErrors(h0, unc, vol) == 0
    # readings follow the state file
    cap = nvml.nvmlClocksEventReasonSwPowerCap
    gpu.set_device(1, sm_clock_mhz=1700, clocks_event_reasons=cap, power_limit_w=612.5)
    gpu.set_device(1, ecc_uncorrected=2, ecc_uncorrected_aggregate=9)
    assert nvml.nvmlDeviceGetClockInfo(h1, nvml.NVML_CLOCK_SM) == 1700
    assert nvml.nvmlDeviceGetClockInfo(h1, nvml.NVML_CLOCK_GRAPHICS) == 1700
    assert nvml.nvmlDeviceGetCurrentClocksEventReasons(h1) == cap
    assert nvml.nvmlDeviceGetCurrentClocksThrottleReasons(h1) == cap  # the old name
    assert nvml.nvmlDeviceGetEnforcedPowerLimit(h1) == 612_500
    ecc = (
        nvml.nvmlDeviceGetTotalEccErrors(h1, unc, vol),
        nvml.nvmlDeviceGetTotalEccErrors(h1, unc, agg),
    )
    assert ecc == (2, 9)
    # NVML's codes: a bad argument, a reading the board lacks, a function the driver lacks
    with pytest.raises(nvml.NVMLError_InvalidArgument):
        nvml.nvmlDeviceGetClockInfo(h0, 7)
    with pytest.raises(nvml.NVMLError_InvalidArgument):
        nvml.nvmlDeviceGetTotalEccErrors(h0, 2, vol)
    gpu.set_device(0, unsupported=["nvmlDeviceGetTotalEccErrors", "nvmlDeviceGetEccMode"])
    gpu.set_device(0, missing=["nvmlDeviceGetCurrentClocksEventReasons"])
    with pytest.raises(nvml.NVMLError) as err:
        nvml.nvmlDeviceGetTotalEccErrors(h0, unc, vol)
    assert isinstance(err.value, nvml.NVMLError_NotSupported)
    assert err.value.value == nvml.NVML_ERROR_NOT_SUPPORTED and str(err.value) == "Not Supported"
    with pytest.raises(nvml.NVMLError_NotSupported):
        nvml.nvmlDeviceGetEccMode(h0)
    with pytest.raises(nvml.NVMLError_FunctionNotFound):
        nvml.nvmlDeviceGetCurrentClocksEventReasons(h0)
    assert nvml.nvmlDeviceGetCurrentClocksThrottleReasons(h0) == 0
    assert nvml.nvmlDeviceGetTotalEccErrors(h1, unc, vol) == 2  # the other device is unaffected
    nvml.nvmlShutdown()


def test_fake_pynvml_is_what_a_process_imports(
    fake_gpu: Callable[..., tuple[Path, FakeGpu]],
):
    _, gpu = fake_gpu(devices=2)
    code = "import pynvml; pynvml.nvmlInit(); print(pynvml.__file__, pynvml.nvmlDeviceGetCount())"
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env={**os.environ, **gpu.env}
    )
    assert out.returncode == 0, out.stderr
    path, count = out.stdout.split()
    assert Path(path).parent.name == "fake_nvml"
    assert count == "2"


def test_fake_nvidia_smi_prints_the_documented_csv(
    pct_bin: Path, fake_gpu: Callable[..., tuple[Path, FakeGpu]]
):
    state_path, gpu = fake_gpu(devices=2)
    gpu.set_device(0, util=97, power_w=690.5, temp_c=71)
    gpu.add_process(os.getpid(), device=0, mem=10240 * MIB)
    gpu.add_process(2**22 + 12345, device=1, mem=1 * MIB)  # above pid_max: never alive
    env = {**os.environ, "FAKE_NVML_STATE": str(state_path)}
    smi = str(pct_bin / "nvidia-smi")
    fields = "index,uuid,name,memory.used,memory.total,utilization.gpu,power.draw,temperature.gpu"
    fmt = "--format=csv,noheader,nounits"

    query = f"--query-gpu={fields}"
    out = subprocess.run([smi, query, fmt], capture_output=True, text=True, env=env)
    assert out.returncode == 0, out.stderr
    uuid0, uuid1 = (d["uuid"] for d in gpu.read()["devices"])
    assert out.stdout == (
        f"0, {uuid0}, NVIDIA H200, 10244, 143771, 97, 690.50, 71\n"
        f"1, {uuid1}, NVIDIA H200, 4, 143771, 0, 75.00, 30\n"
    )

    query = "--query-compute-apps=pid,used_memory,gpu_uuid"
    out = subprocess.run([smi, query, fmt], capture_output=True, text=True, env=env)
    assert out.returncode == 0, out.stderr
    assert out.stdout == f"{os.getpid()}, 10240, {uuid0}\n"

    gpu.unload_driver()
    out = subprocess.run([smi, query, fmt], capture_output=True, text=True, env=env)
    assert out.returncode == 9
    assert "couldn't communicate with the NVIDIA driver" in out.stdout

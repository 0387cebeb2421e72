"""A wedged GPU (issue 33 A4): the real agent over the stand-in NVML (a device marked
`lost` answers every call with NVML_ERROR_GPU_IS_LOST, as a board fallen off the bus does),
a stand-in `dmesg` on PATH printing the driver's Xid lines with kernel times, and
`gpu-reset` run as an operator runs it, over a real sshd, against the stand-in nvidia-smi
(tests/infra/bin/nvidia-smi: it records its argv and answers as the real one does). No real
GPU is ever reset: the stand-in is the only nvidia-smi on the sessions' PATH."""

from __future__ import annotations

import getpass
import io
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from infra.fixtures import FakeGpu
from monitor_helpers import Remote, cli
from rich.console import Console
from test_gpu_procs import ssh_args

from dflash_tui import gpu_procs
from dflash_tui.agent import kernel_log
from dflash_tui.diagnosis import DiagnosisConfig, diagnose
from dflash_tui.targets import Target
from dflash_tui.widgets.gpus import GpuPane, compact_line
from trainer.contract.protocol import MAX_GPU_COMMAND

GIB = 1 << 30
XID_79 = "NVRM: Xid (PCI:0000:19:00): 79, pid=4242, name=python, GPU has fallen off the bus."

DMESG = """#!/usr/bin/env python3
import sys
up = float(open("/proc/uptime").read().split()[0])
print(f"[{up - 9000:12.6f}] usb 1-1: new high-speed USB device")
print(f"[{up - 60:12.6f}] XID_79")
print(f"[{up - 30:12.6f}] NVRM: Xid (PCI:0000:18:00): 13, pid=77, Graphics Exception")
""".replace("XID_79", XID_79)
DMESG_REFUSED = """#!/bin/sh
echo "dmesg: read kernel buffer failed: Operation not permitted" >&2
exit 1
"""


def tool(dir_: Path, name: str, text: str) -> Path:
    dir_.mkdir(exist_ok=True)
    path = dir_ / name
    path.write_text(text)
    path.chmod(0o755)
    return dir_


@pytest.fixture
def gpu_env(
    fake_gpu: Callable[..., tuple[Path, FakeGpu]], monkeypatch: pytest.MonkeyPatch
) -> FakeGpu:
    _, gpu = fake_gpu(devices=2)
    for k, v in gpu.env.items():
        monkeypatch.setenv(k, v)
    return gpu


def wedged(r: Remote, cfg: DiagnosisConfig | None = None) -> list[Any]:
    found = diagnose(r.store, config=cfg or DiagnosisConfig())
    return [f for f in found if f.code == "gpu_wedged"]


def render(pane: GpuPane) -> str:
    console = Console(width=158, record=True, file=io.StringIO(), color_system=None)
    console.print(pane.content)
    return console.export_text()


def pane_rows(r: Remote) -> list[str]:
    """The GPU pane's device rows, drawn from the store the real agent fed."""
    pane = GpuPane()
    pane.update_from(r.store)
    return [ln for ln in render(pane).splitlines() if ln[:1].isdigit()]


# -- detection ---------------------------------------------------------------------------
def test_a_lost_gpu_is_critical_and_the_others_keep_their_samples(
    remote_factory: Callable[..., Remote], local_target: Target, gpu_env: FakeGpu
) -> None:
    gpu_env.set_device(1, lost=True)
    r = remote_factory(local_target, follow=None)
    r.wait(lambda s: s.gpu is not None and len(s.gpu.devices) == 2, 30, "GPU samples")
    d0, d1 = r.store.gpu.devices
    assert (d0.error, d0.name, d0.pci_bus_id) == ("", "NVIDIA H200", "00000000:18:00.0")
    assert (d1.error, d1.mem_total) == ("GPU is lost", 0)
    [f] = wedged(r)
    assert (f.severity, f.title) == ("critical", "GPU 1 wedged")
    assert f.evidence.startswith("GPU 1: NVML: GPU is lost")
    assert "dflash-tui gpu-reset local 1" in f.action and "reboot the host" in f.action
    assert "GPU 1  NVML: GPU is lost" in gpu_procs.lines(r.store)
    rows = pane_rows(r)
    assert "NVML: GPU is lost" in rows[1] and "/140G" in rows[0], rows
    assert "GPU 1 GPU is lost" in compact_line(r.store).plain  # below 30 rows
    assert r.store.to_json()["gpus"][1]["error"] == "GPU is lost"


def test_nvml_failing_on_every_call_is_critical(
    remote_factory: Callable[..., Remote], local_target: Target, gpu_env: FakeGpu
) -> None:
    """After nvmlInit the stand-in answers every call with GPU_IS_LOST once its state file
    is gone: the agent's sample is its error, said once, and that is a wedged host."""
    r = remote_factory(local_target, follow=None)
    r.wait(lambda s: s.gpu is not None and s.gpu.devices, 30, "GPU samples")
    gpu_env.unload_driver()
    r.wait(lambda s: s.gpu.state == "error", 30, "the sampler's error")
    [f] = wedged(r)
    assert (f.severity, f.title) == ("critical", "GPU sampling fails on this host")
    assert f.evidence == "the agent's sampler (nvml): GPU is lost"


@pytest.fixture
def agent_with_dmesg(
    remote_factory: Callable[..., Remote],
    local_target: Target,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> Callable[[str], Remote]:
    """The local agent with a stand-in `dmesg` printing `text` first on its PATH, once its
    samples carry the Xid lines."""

    def start(text: str) -> Remote:
        bin_ = tool(tmp_path / "bin", "dmesg", text)
        monkeypatch.setenv("PATH", f"{bin_}:{os.environ['PATH']}")
        r = remote_factory(local_target, follow=None)
        r.wait(lambda s: s.gpu is not None and len(s.gpu.xids) == 2, 30, "the Xid lines")
        return r

    return start


def test_an_xid_in_the_kernel_log_names_its_gpu_by_pci_address(
    agent_with_dmesg: Callable[[str], Remote], gpu_env: FakeGpu
) -> None:
    """Xid 79 a minute ago on 0000:19:00 (GPU 1): a warning while NVML still reads the GPU,
    critical once it is lost too. Xid 13 (an application's fault) and old lines say nothing."""
    r = agent_with_dmesg(DMESG)
    x79, x13 = r.store.gpu.xids
    assert (x79.code, x79.pci, x79.text, x13.code) == (79, "0000:19:00", XID_79, 13)
    assert 50 < time.time() - x79.t < 90  # the kernel's time since boot, on the agent's clock
    [f] = wedged(r)
    assert (f.severity, f.title) == ("warning", "GPU 1 may be wedged")
    assert "kernel log: Xid 79 (fallen off the bus) 1m" in f.evidence
    line = next(ln for ln in gpu_procs.lines(r.store) if "Xid 79" in ln)
    assert line.startswith("kernel log: Xid 79 on 0000:19:00 1m") and line.endswith(XID_79)

    gpu_env.set_device(1, lost=True)
    r.wait(lambda s: s.gpu.devices[1].error, 30, "GPU 1 lost")
    [f] = wedged(r)
    assert (f.severity, f.title) == ("critical", "GPU 1 wedged")
    assert f.evidence.startswith("GPU 1: NVML: GPU is lost, kernel log: Xid 79")


def test_an_xid_on_an_address_no_gpu_answers_for_is_critical(
    agent_with_dmesg: Callable[[str], Remote], gpu_env: FakeGpu
) -> None:
    """NVML names both GPUs' addresses (18, 19); an Xid 79 on 3b is a board that fell off
    the bus and left NVML's list: critical, named by its address."""
    r = agent_with_dmesg(DMESG.replace("0000:19:00", "0000:3b:00"))
    [f] = wedged(r)
    assert (f.severity, f.title) == ("critical", "PCI 0000:3b:00 wedged")
    assert "nvidia-smi -q on the host names the GPU at that PCI address" in f.action


def test_an_unreadable_kernel_log_is_said_once_not_as_an_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Inside a container dmesg is refused and /dev/kmsg cannot be opened: the watch says
    why, once, in status's lines; no finding comes of it."""
    bin_ = tool(tmp_path / "bin", "dmesg", DMESG_REFUSED)
    monkeypatch.setenv("PATH", f"{bin_}:{os.environ['PATH']}")
    monkeypatch.setattr(kernel_log, "KMSG", str(tmp_path / "no-kmsg"))
    watch = kernel_log.XidWatch()
    watch.refresh()
    assert watch.xids == []
    said = (
        "dmesg: read kernel buffer failed: Operation not permitted; "
        f"{tmp_path / 'no-kmsg'}: No such file or directory"
    )
    # cut to the contract's bound: under xdist the temp path alone is ~80 characters
    assert watch.unreadable == said[:MAX_GPU_COMMAND]


def test_the_real_kernel_log_is_read_with_kernel_times_where_it_is_readable() -> None:
    """/dev/kmsg as this machine has it (records `prio,seq,usec,-;text`), when readable."""
    if not os.access("/dev/kmsg", os.R_OK):
        pytest.skip("/dev/kmsg is not readable here")
    lines, why = kernel_log.read_kmsg()
    assert why == "" and lines, why
    uptime = float(Path("/proc/uptime").read_text().split()[0])
    assert all(0 <= t <= uptime + 1 for t, _ in lines)


def test_memory_held_with_no_process_anywhere_counts_only_after_the_threshold(
    remote_factory: Callable[..., Remote], local_target: Target, gpu_env: FakeGpu
) -> None:
    """20 GiB on GPU 0 with no process listed and no run: normal inside a container for a
    while (the default 600 s says nothing yet), a warning once it lasts `orphan_memory_s`."""
    gpu_env.set_device(0, mem_base=20 * GIB)
    r = remote_factory(local_target, follow=None)
    r.wait(lambda s: s.gpu is not None and s.gpu.devices, 30, "GPU samples")
    short = DiagnosisConfig(orphan_memory_s=2.0)
    r.wait(
        lambda s: (
            len(s.gpu_history.get(0, ())) >= 2
            and s.gpu_history[0][-1].t - s.gpu_history[0][0].t > 2.5
        ),
        30,
        "3 s of samples",
    )
    assert wedged(r) == []  # the default threshold: not long enough
    [f] = wedged(r, short)
    assert (f.severity, f.title) == ("warning", "GPU 0 may be wedged")
    assert f.evidence.startswith("GPU 0: 20.0 GB held with no process listed for")
    assert f.evidence.endswith(", no run alive")

    owner = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:  # a process listed on it: its memory has an owner
        gpu_env.add_process(owner.pid, device=0, mem=GIB)
        r.wait(lambda s: s.gpu.devices[0].processes, 30, "the owner listed")
        assert wedged(r, short) == []
    finally:
        owner.kill()
        owner.wait()


# -- gpu-reset over a real sshd, against the stand-in nvidia-smi ------------------------------
@pytest.fixture
def reset_host(
    sshd_factory: Any, pct_bin: Path, fake_gpu: Any, tmp_path: Path
) -> Iterator[tuple[Any, FakeGpu, Path, Path]]:
    _, gpu = fake_gpu(2)
    smi_log = tmp_path / "nvidia-smi.log"
    server = sshd_factory(
        env={
            "PATH": f"{pct_bin}:/usr/local/bin:/usr/bin:/bin",
            "PCT_LOG": str(tmp_path / "pct.log"),
            "NVIDIA_SMI_LOG": str(smi_log),
            **gpu.env,
        }
    )
    yield server, gpu, smi_log, tmp_path / "remote"


def reset(server: Any, remote: Path, index: str) -> subprocess.CompletedProcess[str]:
    """`dflash-tui gpu-reset HOST INDEX`, as an operator runs it."""
    target, *options = ssh_args(server, remote)
    return cli("gpu-reset", target, index, *options)


def resets(smi_log: Path) -> list[list[str]]:
    if not smi_log.exists():
        return []
    calls = [json.loads(ln)["argv"] for ln in smi_log.read_text().splitlines()]
    return [c for c in calls if c[:1] == ["--gpu-reset"]]


def test_gpu_reset_of_a_lost_gpu_runs_nvidia_smi_and_checks_it_through_nvml(
    reset_host: tuple[Any, FakeGpu, Path, Path],
) -> None:
    server, gpu, smi_log, remote = reset_host
    gpu.set_device(1, lost=True, mem_base=30 * GIB)
    r = reset(server, remote, "1")
    assert r.returncode == 0, r.stdout + r.stderr
    assert resets(smi_log) == [["--gpu-reset", "-i", "1"]]
    assert r.stdout.splitlines() == [
        "nvidia-smi: GPU 00000000:19:00.0 was successfully reset. All done.",
        "before the reset: GPU is lost",
        "GPU 1 answers nvml: NVIDIA H200, 0.0 of 140.4 GB used, no processes",
    ]
    assert "lost" not in gpu.read()["devices"][1]


def test_gpu_reset_refuses_while_a_process_holds_the_gpu_and_runs_nothing(
    reset_host: tuple[Any, FakeGpu, Path, Path],
) -> None:
    server, gpu, smi_log, remote = reset_host
    holder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", "serve"])
    try:
        gpu.add_process(holder.pid, device=1, mem=12 * GIB)
        r = reset(server, remote, "1")
    finally:
        holder.kill()
        holder.wait()
    assert r.returncode == 1 and r.stdout == ""
    [line] = r.stderr.splitlines()
    held = f"dflash-tui: GPU 1 not reset: GPU 1 is held by pid {holder.pid} 12.0 GB ("
    assert line.startswith(held + f"{getpass.getuser()}: {sys.executable} -c import time"), line
    assert line.endswith("): stop them before a reset"), line
    assert resets(smi_log) == []  # nvidia-smi never asked


def test_gpu_reset_says_nvidia_smis_refusal_in_one_sanitised_line(
    reset_host: tuple[Any, FakeGpu, Path, Path],
) -> None:
    server, gpu, smi_log, remote = reset_host
    state = gpu.read()
    state["reset_refusal"] = "permission"  # a container without the right
    gpu.write(state)
    r = reset(server, remote, "0")
    assert r.returncode == 1 and resets(smi_log) == [["--gpu-reset", "-i", "0"]]
    assert r.stderr.splitlines() == [
        "dflash-tui: GPU 0 not reset: nvidia-smi --gpu-reset -i 0 (exit 4): Unable to reset "
        "GPU 00000000:18:00.0: Insufficient Permissions Terminating early due to previous errors."
    ]
    state["reset_refusal"] = "Unable to reset\x1b[2J\x1b]0;pwned\x07 this GPU"
    gpu.write(state)
    r = reset(server, remote, "0")
    assert r.returncode == 1 and "\x1b" not in r.stderr
    assert r.stderr.splitlines() == [
        "dflash-tui: GPU 0 not reset: nvidia-smi --gpu-reset -i 0 (exit 255): Unable to reset"
        "\\x1b[2J\\x1b]0;pwned\\x07 this GPU"
    ]


def test_gpu_reset_of_a_gpu_the_host_has_not_is_bad_input(
    reset_host: tuple[Any, FakeGpu, Path, Path],
) -> None:
    server, _gpu, smi_log, remote = reset_host
    r = reset(server, remote, "7")
    assert r.returncode == 2 and r.stderr == "dflash-tui: no GPU 7 on this host (GPUs: 0, 1)\n"
    assert resets(smi_log) == []
    r = reset(server, remote, "one")
    assert r.returncode == 2 and r.stderr.splitlines()[-1].endswith(
        "argument INDEX: 'one': a GPU index is a whole number (0, 1, ...)"
    )

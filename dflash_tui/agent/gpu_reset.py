"""`gpu_reset`: a wedged GPU reset on the host with `nvidia-smi --gpu-reset -i N`, then
checked through NVML.

Refused, running nothing, while any process holds that GPU (NVML's list) or a run lives
under the run root (inside a container NVML may list no process while the trainer holds
the board). nvidia-smi refuses by itself too (in use, no right inside a container): its own
words are the answer, in one line, bounded. A GPU that NVML cannot read ("GPU is lost") has
no process list: the reset is what it needs, and nvidia-smi's own check stands.
"""

from __future__ import annotations

import shutil
import subprocess

from dflash_tui.agent.errors import CommandError
from dflash_tui.agent.gpus import Gpus
from trainer.contract.protocol import GpuDevice

MAX_SAID = 300
GIB = 1 << 30  # said "GB", as the monitor's findings say it (diagnosis.common.gb)


def _one_line(text: str) -> str:
    """nvidia-smi's message as one line: its non-empty lines joined, bounded."""
    words = " ".join(line.strip() for line in text.splitlines() if line.strip())
    return words[:MAX_SAID] or "(no output)"


def _device(gpus: Gpus, index: int) -> tuple[GpuDevice | None, str]:
    """The GPU as NVML (or nvidia-smi) sees it now, or why it cannot be seen."""
    try:
        devices = {d.index: d for d in gpus.sample()}
    except Exception as e:  # the sampler's backend failed whole: say it, the reset decides
        return None, f"{type(e).__name__}: {e}"[:MAX_SAID]
    if index not in devices:
        raise CommandError(
            f"no GPU {index} on this host (GPUs: {', '.join(map(str, sorted(devices))) or 'none'})",
            bad_input=True,
        )
    return devices[index], ""


def _holders(dev: GpuDevice) -> str:
    return ", ".join(
        f"pid {p.pid} {p.mem_used / GIB:.1f} GB"
        + (f" ({p.user}: {p.command[:80]})" if p.command else " (not in this container)")
        for p in dev.processes
    )


def _check(gpus: Gpus, index: int) -> tuple[bool, str]:
    """What NVML says of the GPU after the reset: it answers, with what on it, or not."""
    dev, why = _device(gpus, index)
    if dev is None:
        return False, f"GPU {index} cannot be read after the reset: {why}"
    if dev.error:
        return False, f"GPU {index} still fails in {gpus.backend}: {dev.error}"
    held = f"held by {_holders(dev)}" if dev.processes else "no processes"
    ecc = f", {dev.ecc_uncorrected} uncorrected ECC errors" if dev.ecc_uncorrected else ""
    return True, (
        f"GPU {index} answers {gpus.backend}: {dev.name}, {dev.mem_used / GIB:.1f} of "
        f"{dev.mem_total / GIB:.1f} GB used, {held}{ecc}"
    )


def gpu_reset(gpus: Gpus, alive_run: str | None, index: int, timeout_s: float) -> dict[str, object]:
    if index < 0:
        raise CommandError(f"GPU {index}: an index is 0 or more", bad_input=True)
    if alive_run:
        raise CommandError(f"run {alive_run} is alive on this host: kill it before a reset")
    dev, unseen = _device(gpus, index)
    if dev is not None and dev.processes:
        raise CommandError(f"GPU {index} is held by {_holders(dev)}: stop them before a reset")
    if shutil.which("nvidia-smi") is None:
        raise CommandError("nvidia-smi is not on this host's PATH: it does the reset")
    try:
        r = subprocess.run(
            ["nvidia-smi", "--gpu-reset", "-i", str(index)],
            check=False,
            capture_output=True,
            text=True,
            errors="replace",
            timeout=timeout_s,
            stdin=subprocess.DEVNULL,
        )
    except subprocess.TimeoutExpired:
        raise CommandError(
            f"nvidia-smi --gpu-reset -i {index} gave no answer in {timeout_s:.0f}s"
        ) from None
    said = _one_line(r.stdout + "\n" + r.stderr)
    if r.returncode != 0:
        raise CommandError(f"nvidia-smi --gpu-reset -i {index} (exit {r.returncode}): {said}")
    ok, check = _check(gpus, index)
    before = dev.error if dev is not None and dev.error else unseen
    return {"index": index, "said": said, "ok": ok, "check": check, "before": before}

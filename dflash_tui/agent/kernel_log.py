"""The kernel log's Xid lines: the NVIDIA driver's own report of a GPU fault (`NVRM: Xid
(PCI:0000:3b:00): 79, pid=…, GPU has fallen off the bus.`), for the `gpu_wedged` rule.

Read through `dmesg`, else /dev/kmsg, at most once per `PERIOD_S`. Inside a container
neither is usually readable (dmesg_restrict, no CAP_SYSLOG): that is said once, as
`kernel_log`, never as an error. Each line's time is the kernel's (seconds since boot)
placed on the agent's clock through /proc/uptime; a line without one is left out, since
an Xid of unknown age cannot say the GPU is wedged now.
"""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
import time

from trainer.contract.protocol import MAX_GPU_COMMAND, MAX_XIDS, XID_KEEP_S, XidLine

KMSG = "/dev/kmsg"
PERIOD_S = 30.0
DMESG_TIMEOUT_S = 3.0
MAX_LOG_BYTES = 8 << 20  # the ring buffer is a few MB at most
MAX_KMSG_RECORDS = 200_000
# `[ 1234.567890] NVRM: Xid (PCI:0000:3b:00): 79, …` (dmesg) and the record's text after
# /dev/kmsg's `6,1234,5678901,-;` prefix.
XID = re.compile(r"NVRM: Xid \((?:PCI:)?([0-9A-Fa-f:.]+)\): (\d+)")
DMESG_STAMP = re.compile(r"^\[\s*(\d+\.\d+)\]\s*")


def _uptime() -> float | None:
    try:
        with open("/proc/uptime") as f:
            return float(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def parse(lines: list[tuple[float, str]], now: float, uptime: float) -> list[XidLine]:
    """(seconds since boot, text) lines -> the Xid lines of the last XID_KEEP_S, newest
    MAX_XIDS."""
    out = []
    for stamp, text in lines:
        m = XID.search(text)
        if m is None:
            continue
        t = now - (uptime - stamp)
        if now - t > XID_KEEP_S:
            continue
        out.append(
            XidLine(
                t=t,
                code=int(m[2]) % (1 << 16),
                pci=m[1][:32],
                text=text[m.start() :][:MAX_GPU_COMMAND],
            )
        )
    return out[-MAX_XIDS:]


def dmesg_text() -> tuple[str | None, str]:
    """`dmesg`'s output (its last MAX_LOG_BYTES), or None and why it could not be read
    (dmesg_restrict, not installed): its own last word, uncut. The one way the agent runs
    dmesg (oom.py reads an OOM kill's lines through it too)."""
    try:
        r = subprocess.run(
            ["dmesg"],
            check=False,
            capture_output=True,
            timeout=DMESG_TIMEOUT_S,
            stdin=subprocess.DEVNULL,
        )
    except FileNotFoundError:
        return None, "dmesg is not installed"
    except (OSError, subprocess.TimeoutExpired) as e:
        return None, f"dmesg: {e}"
    if r.returncode != 0:
        said = r.stderr.decode("utf-8", "replace").strip().splitlines()
        return None, said[-1] if said else f"dmesg exited {r.returncode}"
    return r.stdout[-MAX_LOG_BYTES:].decode("utf-8", "replace"), ""


def read_dmesg() -> tuple[list[tuple[float, str]] | None, str]:
    text, why = dmesg_text()
    if text is None:
        return None, why[:MAX_GPU_COMMAND]
    out = []
    for line in text.splitlines():
        m = DMESG_STAMP.match(line)
        if m is not None:
            out.append((float(m[1]), line[m.end() :]))
    return out, ""


def read_kmsg() -> tuple[list[tuple[float, str]] | None, str]:
    """Every record /dev/kmsg holds now, read without blocking (each read is one record)."""
    try:
        fd = os.open(KMSG, os.O_RDONLY | os.O_NONBLOCK)
    except OSError as e:
        return None, f"{KMSG}: {e.strerror or e}"
    out = []
    try:
        for _ in range(MAX_KMSG_RECORDS):
            try:
                record = os.read(fd, 8192)
            except BlockingIOError:
                break  # the end of the buffer
            except BrokenPipeError:
                continue  # overwritten while we read: the next record follows
            except OSError as e:
                return None, f"{KMSG}: {e.strerror or e}"
            if not record:
                break
            head, _, text = record.decode("utf-8", "replace").partition(";")
            fields = head.split(",")
            with contextlib.suppress(IndexError, ValueError):
                out.append((int(fields[2]) / 1e6, text.splitlines()[0] if text else ""))
    finally:
        os.close(fd)
    return out, ""


class XidWatch:
    """The newest Xid lines and why the log cannot be read, refreshed every PERIOD_S."""

    def __init__(self) -> None:
        self.xids: list[XidLine] = []
        self.unreadable = ""
        self._next = 0.0

    def refresh(self, now: float | None = None) -> None:
        now = time.time() if now is None else now
        if now < self._next:
            return
        self._next = now + PERIOD_S
        lines, why = read_dmesg()
        if lines is None:
            lines, why_kmsg = read_kmsg()
            why = f"{why}; {why_kmsg}" if lines is None else ""
        uptime = _uptime()
        if lines is None or uptime is None:
            self.xids = []
            self.unreadable = (why or "no /proc/uptime to date its lines")[:MAX_GPU_COMMAND]
            return
        self.xids, self.unreadable = parse(lines, now, uptime), ""

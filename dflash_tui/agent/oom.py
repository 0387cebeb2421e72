"""After a SIGKILL: was it the kernel's OOM killer? What the host lets the wrapper read.

The kernel's OOM killer is the usual sender of a SIGKILL nobody asked for, and it leaves two
traces: the count `oom_kill` in the memory cgroup's events (cgroup v2 `memory.events`, v1
`memory.oom_control`) and its lines in the kernel log. The trainer's cgroup is known only
while it lives (/proc/PID/cgroup), so the wrapper calls `watch` as it starts the trainer (the
count then is the baseline: the cgroup may be a container's, with older kills in it) and
`check` once it died by SIGKILL. Everything read here is bounded and may be missing or odd:
what could not be read is said, never raised.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

from dflash_tui.agent.kernel_log import dmesg_text
from trainer.contract.records import OomCheck
from trainer.contract.typed import Unreadable, read_bounded

CGROUP_FS = "/sys/fs/cgroup"
V2_EVENTS = "memory.events"
V1_EVENTS = "memory.oom_control"
MAX_FILE_BYTES = 64 << 10
KERNEL_LINES = 4  # the last lines naming the pid: the kill and its summary
MAX_LINE_CHARS = 300


@dataclass(frozen=True)
class Watch:
    """The trainer's memory cgroup file, found while it lived, and its count then."""

    events: str  # "" when none was found (error says why)
    at_start: int | None
    error: str = ""


def _unescape(field: str) -> str:
    """mountinfo writes a space, tab, newline or backslash in a path as octal (`\\040`)."""
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m[1], 8)), field)


def _mounts(mountinfo: str) -> list[tuple[str, str, str, str]]:
    """(fstype, root inside the hierarchy, mount point, super options) of cgroup mounts."""
    out = []
    for line in mountinfo.splitlines():
        left, sep, right = line.partition(" - ")
        fields, tail = left.split(), right.split()
        if sep and len(fields) >= 5 and len(tail) >= 3 and tail[0] in ("cgroup", "cgroup2"):
            out.append((tail[0], _unescape(fields[3]), _unescape(fields[4]), tail[2]))
    return out


def events_file(pid: int, proc: str = "/proc") -> tuple[str, str]:
    """(the memory cgroup file holding `pid`'s oom_kill count, "") or ("", why none). v2's
    memory.events where the memory controller is on, else v1's memory hierarchy."""
    cgroups = read_bounded(f"{proc}/{pid}/cgroup", MAX_FILE_BYTES)
    mountinfo = read_bounded(f"{proc}/self/mountinfo", 4 * MAX_FILE_BYTES)
    for got in (cgroups, mountinfo):
        if got is None or isinstance(got, Unreadable):
            why = "not there" if got is None else got.why
            return "", f"{proc}/{pid}/cgroup or {proc}/self/mountinfo: {why}"
    assert isinstance(cgroups, bytes) and isinstance(mountinfo, bytes)
    paths: dict[str, str] = {}  # "cgroup2" or "memory" -> the pid's path in that hierarchy
    for line in cgroups.decode("utf-8", "replace").splitlines():
        parts = line.split(":", 2)
        if len(parts) == 3 and parts[0] == "0" and parts[1] == "":
            paths["cgroup2"] = parts[2]
        elif len(parts) == 3 and "memory" in parts[1].split(","):
            paths["memory"] = parts[2]
    tried = []
    for fstype, root, point, opts in _mounts(mountinfo.decode("utf-8", "replace")):
        key = "cgroup2" if fstype == "cgroup2" else "memory" if "memory" in opts.split(",") else ""
        path = paths.get(key)
        if path is None:
            continue
        rel = os.path.relpath(path, root) if root != "/" else path.lstrip("/")
        if rel.startswith(".."):
            continue  # the pid's cgroup is outside what this mount shows
        name = V2_EVENTS if fstype == "cgroup2" else V1_EVENTS
        candidate = os.path.normpath(os.path.join(point, rel, name))
        if os.path.isfile(candidate):
            return candidate, ""
        tried.append(candidate)
    if tried:
        return "", f"no {' or '.join(tried)} (the memory controller is off there)"
    return "", f"pid {pid}'s memory cgroup is not mounted here ({len(paths)} hierarchies named)"


def oom_kills(path: str) -> int | str:
    """The `oom_kill N` count of a memory.events / memory.oom_control file, or why not."""
    raw = read_bounded(path, MAX_FILE_BYTES)
    if raw is None or isinstance(raw, Unreadable):
        return f"{path}: {'gone' if raw is None else raw.why}"
    for line in raw.decode("utf-8", "replace").splitlines():
        key, _, value = line.partition(" ")
        if key == "oom_kill":
            return int(value) if value.strip().isdigit() else f"{path}: oom_kill {value!r}"
    return f"{path}: no oom_kill line (a kernel older than 4.13)"


def watch(pid: int, proc: str = "/proc") -> Watch:
    path, error = events_file(pid, proc)
    if not path:
        return Watch("", None, error)
    count = oom_kills(path)
    return Watch(path, count, "") if isinstance(count, int) else Watch(path, None, count)


def kernel_lines(pid: int) -> tuple[list[str], str]:
    """The kernel log's last lines about the OOM kill of `pid` ("Killed process PID",
    "oom-kill:… pid=PID,"), or ([], why the log could not be read: dmesg_restrict, no dmesg).
    A pid of another PID namespace is not the kernel's: inside one, no line may match."""
    pattern = re.compile(
        rf"(Killed process {pid}\b|oom-kill:.*[,:]pid={pid},|reaped process {pid}\b)"
    )
    text, why = dmesg_text()
    if text is None:
        return [], why[:MAX_LINE_CHARS]
    found = [ln.strip()[:MAX_LINE_CHARS] for ln in text.splitlines() if pattern.search(ln)]
    return found[-KERNEL_LINES:], ""


def check(w: Watch, pid: int) -> OomCheck:
    """What the kernel says of `pid`'s SIGKILL: the count's rise since `watch`, its log lines."""
    lines, kernel_error = kernel_lines(pid)
    result = OomCheck(events=w.events, kernel=lines, kernel_error=kernel_error)
    if not w.events:
        result.events_error = w.error
        return result
    now = oom_kills(w.events)
    if isinstance(now, str):
        result.events_error = now
    else:
        # No baseline (unreadable at launch): the count since the cgroup was made.
        result.oom_kills = now - (w.at_start if w.at_start is not None else 0)
    return result

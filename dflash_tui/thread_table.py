"""The thread/process table (htop style) as rows, from the store: the trainer's threads from
the heartbeat (role, device, state and for how long, CPU %, slowest stage, loop period, the
queue it waits on), then the run's processes from the agent's `procs` sample (pid, state,
CPU %, RSS), and the host meters above them.

Pure Python: the TUI's threads screen (widgets/thread_table.py) draws these; the strings are
the host's, so a view shows them through sanitize. `thread_section` cuts one thread's stack
out of a dump (the trainer's named dump, or faulthandler's, threads named by the agent).
"""

from __future__ import annotations

import itertools
import re
from dataclasses import dataclass

from dflash_tui import stages
from dflash_tui.fmt import bar, size
from dflash_tui.state import Store
from trainer.contract.heartbeat import STAGE_HOST, WAIT_REPLICAS
from trainer.contract.protocol import HostSample, ProcInfo

WAIT_SHOWN = 0.10  # a wait stage shown as "the queue it waits on" from this share of its loop


@dataclass(frozen=True)
class ThreadRow:
    name: str
    role: str
    device: str
    state: str
    in_state_s: float
    cpu_pct: float
    slowest: stages.Stage | None  # its largest working stage
    period_ms: float | None  # its loop's period (the stage medians' sum)
    waits_on: str  # "q_pre (full)", "q_hs 21%", "" when it waits on nothing much

    @property
    def key(self) -> str:
        return f"thread:{self.name}"


PROC_TRAINER, PROC_CHILD, PROC_WRAPPER = "trainer", "child", "wrap"


@dataclass(frozen=True)
class ProcRow:
    info: ProcInfo
    role: str  # PROC_TRAINER (the run's proven process), PROC_CHILD, PROC_WRAPPER

    @property
    def signalled(self) -> bool:
        """A row that may be offered a signal: in the run's proven group (the wrapper has a
        group of its own)."""
        return self.role != PROC_WRAPPER

    @property
    def key(self) -> str:
        return f"proc:{self.info.pid}:{self.info.start}"


def waits_on(state: str, st: stages.ThreadStages | None) -> str:
    """The queue a thread waits on: the one its state names now ("waiting: q_pre full"),
    else its loop's largest wait (a "wait q_hs" stage: the queue's name) from WAIT_SHOWN."""
    if state.startswith("waiting:"):  # WAIT_PRE_FULL, WAIT_HS_EMPTY, …
        what = state.removeprefix("waiting:").strip()
        queue, _, why = what.partition(" ")
        return f"{queue} ({why})" if why else queue
    if state == WAIT_REPLICAS:  # the step's barrier: the other replicas
        return "replicas (barrier)"
    if st is None:
        return ""
    waits = [s for s in st.stages if s.wait]
    if not waits:
        return ""
    top = max(waits, key=lambda s: s.ms)
    share = top.ms / st.period_ms
    if share < WAIT_SHOWN:
        return ""
    name = "host (GPU idle)" if top.name == STAGE_HOST else top.name.removeprefix("wait ")
    return f"{name} {share:.0%}"


def thread_rows(store: Store) -> list[ThreadRow]:
    """Every thread the heartbeat lists: the pipeline's (prefetch, targets, drafters, in
    loop order) first, then the others (main, heartbeat, probes) by name."""
    hb = store.heartbeat
    if hb is None:
        return []
    timed = {r.name: r for r in stages.of_heartbeat(hb)}
    rank = {role: i for i, role in enumerate(stages.PIPELINE_ROLES)}
    rows = []
    for t in hb.threads:
        st = timed.get(t.name)
        rows.append(
            ThreadRow(
                name=t.name,
                role=t.role,
                device=t.device,
                state=t.state,
                in_state_s=hb.in_state_s(t),
                cpu_pct=t.cpu_pct,
                slowest=st.top_work() if st else None,
                period_ms=st.period_ms if st else None,
                waits_on=waits_on(t.state, st),
            )
        )
    names = {t.name: i for i, t in enumerate(sorted(hb.threads, key=lambda t: t.name))}
    return sorted(rows, key=lambda r: (rank.get(r.role, len(rank)), names[r.name]))


def proc_rows(store: Store) -> list[ProcRow]:
    """The run's proven process group, the trainer first, then by pid; the launch wrapper
    (outside the group) last."""
    p = store.procs
    if p is None:
        return []
    rows = [ProcRow(i, PROC_TRAINER if i.pid == p.leader else PROC_CHILD) for i in p.procs]
    rows.sort(key=lambda r: (r.role != PROC_TRAINER, r.info.pid))
    if p.wrapper is not None:
        rows.append(ProcRow(p.wrapper, PROC_WRAPPER))
    return rows


def by_cpu(rows: list[ThreadRow], procs: list[ProcRow]) -> tuple[list[ThreadRow], list[ProcRow]]:
    """`s`: the busiest first, threads among threads and processes among processes."""
    return (
        sorted(rows, key=lambda r: -r.cpu_pct),
        sorted(procs, key=lambda r: -(r.info.cpu_pct or 0.0)),
    )


# `s` steps through these (k9s's and htop's sorts): threads among threads, processes among
# processes; a key a process has no value for (its loop) leaves the processes in their order.
SORTS = ("pipeline", "cpu", "name", "in state", "loop")


def sort_rows(
    rows: list[ThreadRow], procs: list[ProcRow], key: str
) -> tuple[list[ThreadRow], list[ProcRow]]:
    """The rows by `key` of SORTS: pipeline (as listed), cpu (busiest first), name, in state
    (the longest in its state first), loop (the slowest loop first)."""
    if key == "cpu":
        return by_cpu(rows, procs)
    if key == "name":
        return sorted(rows, key=lambda r: r.name), sorted(procs, key=lambda r: r.info.name)
    if key == "in state":
        return sorted(rows, key=lambda r: -r.in_state_s), procs
    if key == "loop":
        return sorted(rows, key=lambda r: -(r.period_ms or -1.0)), procs
    return rows, procs


def filter_rows(
    rows: list[ThreadRow], procs: list[ProcRow], text: str
) -> tuple[list[ThreadRow], list[ProcRow]]:
    """The rows matching every word of `text`, case-insensitive: a thread by its name, role,
    device, state or the queue it waits on; a process by its pid, name, role or state."""
    words = text.lower().split()

    def hit(*fields: str) -> bool:
        hay = " ".join(fields).lower()
        return all(w in hay for w in words)

    return (
        [r for r in rows if hit(r.name, r.role, r.device, r.state, r.waits_on)],
        [p for p in procs if hit(str(p.info.pid), p.info.name, p.role, p.info.state)],
    )


def row_matches(row: ThreadRow | ProcRow, text: str) -> bool:
    """Whether `row`'s name, role or state holds every word of `text`, case-insensitive: a
    match for the threads view's n / N."""
    if isinstance(row, ThreadRow):
        name, state = row.name, row.state
    else:
        name, state = row.info.name, row.info.state
    hay = f"{name} {row.role} {state}".lower()
    words = text.lower().split()
    return bool(words) and all(w in hay for w in words)


def next_match(matches: list[int], at: int, by: int) -> int:
    """Which of `matches` (row indices, ascending; not empty) n (`by` 1) or N (-1) moves to
    from row `at`: the first after it or the last before it, round the ends."""
    if by > 0:
        return next((k for k, i in enumerate(matches) if i > at), 0)
    return next((k for k in reversed(range(len(matches))) if matches[k] < at), len(matches) - 1)


def meters(h: HostSample | None, width: int = 20) -> list[str]:
    """The host meters: CPU % of the CPUs this run may use, RAM used of total, load."""
    if h is None:
        return ["host: no sample yet (the agent sends one every few seconds)"]
    out = []
    if h.cpu_pct is not None:
        out.append(f"CPU  [{bar(h.cpu_pct / 100, width)}] {h.cpu_pct:5.1f}% of {h.cpus} CPUs")
    else:
        out.append(f"CPU  [{' ' * width}]     ? of {h.cpus} CPUs")
    if h.mem_total is not None and h.mem_available is not None and h.mem_total > 0:
        used = h.mem_total - h.mem_available
        out.append(
            f"RAM  [{bar(used / h.mem_total, width)}] {size(used)} used of {size(h.mem_total)}"
        )
    if h.load:
        per = h.load[0] / h.cpus
        out.append(
            f"load [{bar(min(1.0, per), width)}] "
            + " ".join(f"{x:.2f}" for x in h.load)
            + f"  ({per:.2f} per CPU)"
        )
    return out


def group_note(store: Store) -> str:
    """What the process part of the table says above its rows."""
    p = store.procs
    if p is None:
        return "processes: waiting for the agent's first sample"
    if not p.pgid:
        return f"processes: none listed ({p.note})" if p.note else "processes: none listed"
    return f"processes of group {p.pgid} (proven to be run {p.run_id}'s)"


_HEAD = re.compile(r"^(Thread|Current thread)\b|^# faulthandler", re.MULTILINE)


def thread_section(text: str, name: str) -> str | None:
    """The part of a stack dump about thread `name`: the trainer's named dump heads it
    `Thread "NAME" role=…`, faulthandler's (as the agent names it) `Thread 0x… "NAME" …`;
    it runs to the next thread's head. None when the dump does not name that thread."""
    quoted = f'"{name}"'
    heads = [m.start() for m in _HEAD.finditer(text)] + [len(text)]
    for begin, end in itertools.pairwise(heads):
        first = text[begin : text.find("\n", begin) if "\n" in text[begin:end] else end]
        if first.startswith(f"Thread {quoted}") or (
            first.startswith(("Thread 0x", "Current thread 0x")) and f" {quoted} " in first + " "
        ):
            return text[begin:end].rstrip("\n")
    return None

"""Headless mode: dflash-tui without a screen, for tmux panes, scripts and checks.

Lines mode (default): one status line per interval, at most 120 columns (where it is too
narrow, whole fields go by priority, the queues first: never half of one, `fit_fields`), plus
every new step line from train.log as it arrives. Colour only on a TTY, never with NO_COLOR.

    08:12:03 training 4m12s | step 876 | 14.2K tok/s | loss 1.338 | τ 2.31↑ | \
q_pre 3/8 2/8 q_hs 4/8 | T95▇ D45▁ | hb 0.4s | T0 forward 96% | ! drafters idle

Each queue is depth/capacity, as the TUI's gauges say it. The first finding's title ends the
line when it fits whole; else it goes on lines of its own under it, wrapped between words,
never cut (`--once` prints every finding in full under the line instead).

`τ 2.31↑` (`tau 2.31+` without unicode) is the held-out acceptance length of the newest eval
and its trend since the eval before (dflash_tui/evaluation.py); only for a run that evaluates.

The busiest pipeline thread's largest stage (dflash_tui/stages.py) comes after the
heartbeat's age, as long as the line has room for it and the first finding's title
(`target-0 forward 96% of 262ms`, `T0 forward 96%`, `T0 forward`, or nothing); while
compiling, the phase says the graphs done (`compiling 41s graphs 3/6`).

Every string from the training host (step lines, phases, errors, findings that quote them)
is printed with its control characters made visible (dflash_tui/sanitize.py); `--json` prints
them exact (JSON escapes them).

`--once`: one snapshot, then exit 0 healthy, 1 warning or no run under the run root (the
line names the root searched), 2 critical (crashed, hung, no heartbeat), 3 unreachable: one
line naming the host and the cause, as soon as the first try fails (the link does not retry
for a one-shot answer; an SSH host has `--connect-timeout`, default 1.5 s, to answer).

`--json`: one JSON object per line:
    {"kind": "event", "event": <agent or link event>}       as events arrive
    {"kind": "snapshot", "time": float, "state": <Store.to_json()>,
     "tau": {latest: {step, tau, train_acc} | null, delta, trend: up|down|flat|null,
             best: {step, tau, train_acc} | null, earlier: {run_id, step, tau, train_acc}
             | null (the best of earlier comparable runs evaluated the same way), evals,
             running_step, skipped, error} | null (a run that evaluates nothing),
     "findings": [{"severity", "code", "title", "evidence", "action"}]}  per interval
An agent event is as the agent sent it (trainer/contract/protocol.py), with every field of its
record; a link event is {type: "link", t, state, detail, target, attempt, retry_in, version}
or {type: "rtt", t, rtt_ms}; a line that was no event is {type: "unreadable", what, why}.
Store.to_json() = {target, link: {state, detail, rtt_ms, attempt}, run_id, phase, phase_s,
    step, tok_s, loss, queues, phase_progress: {done, total, unit} | null,
    compile: the heartbeat's CompileInfo (while compiling: current, current_since, done,
    expected, last_s, last_cache) | null,
    stages: [{thread, role, device, period_ms, stages: [{stage, ms, share, wait}]}] (each
    pipeline thread with stage times, its stages in loop order; [] without),
    busiest: {thread, stage, ms, share, period_ms, work_share} | null (the thread the others
    wait for, and its largest work stage),
    eval: the heartbeat's EvalInfo as written (trainer/contract/evaluation.py) | null,
    heartbeat_age_s, heartbeat_error, heartbeat_note, alive, exit,
    outcome: {kind, summary} | null (once the run ended), malformed (lines skipped),
    gpus: [{index, name, mem_used, mem_total, util, role, sm_clock_mhz, sm_clock_max_mhz,
            clock_reasons (names), ecc_uncorrected, power_w, power_limit_w, temp_c, pci_bus_id,
            error (NVML's, "" when none), processes: [{pid, user, mem_used, command, local,
            this_run (true/false; null for a pid of another namespace)}]}], gpu_state,
    gpu_xids: [{t, code, pci, text}] (the kernel log's Xid lines of the last day),
    kernel_log: why the kernel log could not be read ("" when it was),
    host: {t, cpus, load: [1, 5, 15 min], cpu_pct, mem_total, mem_available,
           disk: {path, free, total} | null} | null (the agent's newest host sample),
    procs: {t, run_id, pgid, leader, note, procs: [{pid, start, ppid, state, name, cpu_pct,
            rss, threads}]} | null (the run's proven process group, agent/proc_table.py)}

`status` (--once) prints, after the status line, one line on the host (`host: 2 CPUs, load
4.50 (2.25 per CPU), CPU 97% busy, memory …, disk … free of … on RUN_ROOT`), a line per
process on a GPU and per GPU NVML cannot read (gpu_procs.py), then the findings.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import signal
import sys
import textwrap
import time
from dataclasses import asdict
from typing import TextIO

from dflash_tui import (
    compile_progress,
    cuda_graphs,
    evaluation,
    gpu_procs,
    host_context,
    ranks_view,
    sanitize,
    stages,
)
from dflash_tui.diagnosis import Finding, config_for, diagnose
from dflash_tui.fmt import BARS, count, duration, rate, real
from dflash_tui.link.events import LinkStatus, SinkEvent, event_json
from dflash_tui.link.link import Link
from dflash_tui.notify import Notifier
from dflash_tui.state import ROLE_LETTER, Store
from dflash_tui.targets import Target
from trainer.contract.heartbeat import QueueDepth
from trainer.contract.outcomes import FINISHED, STOPPED_EARLY
from trainer.contract.protocol import Line

WIDTH = 120
EXIT_OK, EXIT_WARNING, EXIT_CRITICAL, EXIT_UNREACHABLE = 0, 1, 2, 3


def gpu_summary(s: Store, unicode: bool = True) -> str:
    gpu = s.gpu
    if gpu is None:
        return "gpu ?"
    if gpu.state == "no_gpu":
        return "no NVIDIA GPU"
    if gpu.state == "error":
        return "gpu error"
    roles = s.gpu_roles()
    parts = []
    for d in gpu.devices:
        role = roles.get(d.index, "")
        letter = "".join(ROLE_LETTER.get(r, "?") for r in role.split("+") if r) or "-"
        util = d.util
        if util is None:
            bar = "?"
        elif unicode:
            bar = BARS[min(7, util * 8 // 101)]
        else:
            bar = str(min(9, util // 10))
        parts.append(f"{letter}{d.mem_used >> 30}{bar}")
    return " ".join(parts) or "no GPUs"


def status_line(
    s: Store,
    findings: list[Finding],
    now: float | None = None,
    unicode: bool = True,
    width: int = WIDTH,
) -> str:
    """One line, at most `width` columns, every string from the host made visible (the
    link's detail quotes the host's errors; phases and findings quote the host's words)."""
    now = time.time() if now is None else now
    clock = time.strftime("%H:%M:%S", time.localtime(now))
    if s.link.state != "connected" and s.hello is None:
        text = sanitize.field(f"{clock} {s.link.state}: {s.link.detail}")
        return text[:width]
    phase, in_phase = s.shown_phase()
    hb = s.heartbeat
    graphs = compile_progress.short(hb)
    progress = hb.phase_progress if hb is not None and not graphs else None
    if progress is not None and progress.total and hb is not None and hb.phase == phase:
        # What the phase is counting (lines of data; a builtin's first build while starting)
        graphs = f"({progress.unit} {progress.done}/{progress.total})"
    # (priority, field) in the order shown: where the line is too narrow, whole fields go,
    # the highest number first; never half of one ("hb 0.").
    fields: list[tuple[int, str]] = [
        (
            0,
            f"{clock} {phase or ('heartbeat unreadable' if s.heartbeat_error else 'no run')}"
            + (f" {duration(in_phase)}" if phase and in_phase is not None else "")
            + (f" {graphs}" if graphs else "")
            + (f" [{s.link.state}]" if s.link.state != "connected" else ""),
        )
    ]
    if s.malformed:
        fields.append((1, f"{s.malformed} malformed lines skipped"))
    if hb is not None:
        fields.append((2, f"step {count(hb.step)}"))
        fields.append((3, rate(hb.tok_s)))
    loss = s.last_loss()
    if loss is not None:
        fields.append((5, f"loss {real(loss)}"))
    tau = evaluation.summary(s.eval_info())
    if tau is not None:
        fields.append((6, tau.short(unicode)))
    if hb is not None and (hb.queues.q_pre or hb.queues.q_hs):
        fields.append((8, queues_text(hb.queues.q_pre, hb.queues.q_hs)))
    fields.append((7, gpu_summary(s, unicode)))
    age = s.heartbeat_age(now)
    if age is not None:
        fields.append((4, f"hb {age:.1f}s"))
    text = fit_fields([(p, sanitize.field(f)) for p, f in fields], width)
    title = sanitize.field(findings[0].title) if findings else ""
    # The finding first, whole: the stage only where the title still fits after it. A title
    # with no room whole goes under the line (status_text), and the stage has the room.
    need = len(title) + 5 if title else 0
    fits = bool(title) and len(text) + need <= width
    room = width - len(text) - 3 - (need if fits else 0)
    busy = next((b for b in busiest_stage(s) if len(b) <= room), None)
    if busy:
        text += " | " + busy
    if fits:
        text += " | ! " + title
    return text[:width]


def fit_fields(fields: list[tuple[int, str]], width: int, sep: str = " | ") -> str:
    """`fields` joined by `sep` in their order, in at most `width` columns: whole fields
    only, kept by priority (the lowest number first). The first field is always kept (cut
    only where it alone is wider than the line)."""
    kept = {0}
    used = len(fields[0][1]) if fields else 0
    for i in sorted(range(1, len(fields)), key=lambda i: fields[i][0]):
        need = len(sep) + len(fields[i][1])
        if used + need <= width:
            kept.add(i)
            used += need
    return sep.join(f for i, (_, f) in enumerate(fields) if i in kept)[:width]


def queues_text(q_pre: list[QueueDepth], q_hs: list[QueueDepth]) -> str:
    """Each queue as depth/capacity, as the TUI's gauges say it: `q_pre 3/8 2/8 q_hs 4/8`."""

    def each(queues: list[QueueDepth]) -> str:
        return " ".join(f"{count(q.depth)}/{count(q.capacity)}" for q in queues) or "-"

    return f"q_pre {each(q_pre)} q_hs {each(q_hs)}"


def status_text(
    s: Store,
    findings: list[Finding],
    now: float | None = None,
    unicode: bool = True,
    width: int = WIDTH,
) -> str:
    """The status line and, where it had no room for the first finding's title whole, the
    title on lines of its own under it: wrapped between words, never cut."""
    line = status_line(s, findings, now, unicode, width)
    if not findings or (s.link.state != "connected" and s.hello is None):
        return line
    title = sanitize.field(findings[0].title)
    if line.endswith(" | ! " + title):
        return line
    wrapped = textwrap.wrap(
        title, width, initial_indent="  ! ", subsequent_indent="    ", break_long_words=False
    )
    return "\n".join([line, *wrapped])


def busiest_stage(s: Store) -> list[str]:
    """The busiest pipeline thread's largest work stage, longest form first: `target-0
    forward 96% of 262ms`, `T0 forward 96%`, `T0 forward`; [] without stage times. Made
    visible: the names are the host's."""
    b = stages.busiest(stages.of_heartbeat(s.heartbeat))
    top = b.top_work() if b else None
    if b is None or top is None:
        return []
    name = sanitize.field(b.name)
    name = name if len(name) <= 14 else name[:13] + "…"
    stage = sanitize.field(top.name)
    stage = stage if len(stage) <= 14 else stage[:13] + "…"
    m = re.fullmatch(r"[a-z]+-(\d+)", b.name)
    short = ROLE_LETTER.get(b.role, "?") + m.group(1) if m else name
    share = f"{top.ms / b.period_ms:.0%}"
    period = stages.ms_text(b.period_ms, space=False)
    return [f"{name} {stage} {share} of {period}", f"{short} {stage} {share}", f"{short} {stage}"]


def run_root_of(s: Store, target: Target) -> str:
    """The run root the agent searched (its own, expanded), else the one asked for."""
    return (s.hello.run_root if s.hello is not None else "") or target.effective_run_root


def unreachable_line(s: Store, target: Target) -> str:
    """`status` of a host it could not reach: one line, the host and the cause."""
    return f"cannot reach {target.name}: {s.link.detail or 'no answer'}"


def host_summary(s: Store) -> str | None:
    """The host in one line for `status` (dflash_tui/host_context.py)."""
    return host_context.summary(s.host)


def exit_code_for(s: Store, findings: list[Finding]) -> int:
    if s.hello is None or s.link.state == "refused":
        return EXIT_UNREACHABLE
    if s.follow_received and s.run_id is None:
        return EXIT_WARNING  # nothing to watch is not healthy (issue 16)
    if any(f.severity == "critical" for f in findings):
        return EXIT_CRITICAL
    if s.run_id is not None and s.heartbeat is None and s.process_alive():
        return EXIT_CRITICAL  # alive but no heartbeat
    if any(f.severity == "warning" for f in findings):
        return EXIT_WARNING
    return EXIT_OK


async def settled(s: Store, timeout: float) -> None:
    """For --once (and the fleet's): wait until the store's picture is complete (or the
    time is up)."""
    deadline = time.monotonic() + timeout
    ready_at: float | None = None
    while time.monotonic() < deadline:
        if s.link.state == "refused":
            return
        ready = s.hello is not None and s.runs_received and s.follow_received
        if ready and ready_at is None:
            ready_at = time.monotonic()
        # A run that ended before its first heartbeat (a bad --set, a crash while
        # loading) never writes one: the runs list's exit record is its picture. The
        # agent sends a heartbeat right after the follow, so a second is ample.
        ended_without = ready_at is not None and s.ended() and time.monotonic() - ready_at > 1.0
        run_seen = s.run_id is None or s.heartbeat is not None or s.heartbeat_error or ended_without
        # The run's processes come within a second of the follow (agent/proc_table.py).
        procs_seen = s.run_id is None or s.procs is not None
        if ready and run_seen and s.gpu is not None and s.host is not None and procs_seen:
            return
        await asyncio.sleep(0.05)


class Headless:
    def __init__(
        self,
        target: Target,
        out: TextIO | None = None,
        interval: float = 2.0,
        as_json: bool = False,
        once: bool = False,
        link: Link | None = None,
        follow: str = "latest",
        notifier: Notifier | None = None,
        connect_timeout: float | None = None,
        until_end: bool = False,
    ) -> None:
        """`once`: one answer, so a host that cannot be reached is the answer at once (the
        link does not retry), within `connect_timeout`. `until_end`: exit when the followed
        run ends, with its outcome (the demo)."""
        self.target = target
        self.until_end = until_end
        self.notifier = notifier
        self.out = out or sys.stdout
        self.interval = interval
        self.as_json = as_json
        self.once = once
        self.store = Store(target.name)
        self.diagnosis = config_for(target.extra)
        self.color = self.out.isatty() and not os.environ.get("NO_COLOR") and not as_json
        encoding = getattr(self.out, "encoding", "") or ""
        self.unicode = encoding.lower().replace("-", "") in ("utf8", "utf16", "utf32")
        self.link = link or Link(
            target, self.on_event, follow=follow, one_shot=once, connect_timeout=connect_timeout
        )
        self._stop = asyncio.Event()

    def write(self, text: str) -> None:
        """One line as it is: JSON (which escapes every control character itself) or text
        already made visible. Text that quotes the host goes through `say`."""
        # Blocking, every time: a process sharing this pipe (a child started on it) can turn
        # it non-blocking, and then a long JSON line was cut and the next one written into
        # it (seen once in CI: a snapshot line ending in an event's heartbeat).
        with contextlib.suppress(AttributeError, OSError, ValueError):
            os.set_blocking(self.out.fileno(), True)
        self.out.write(text + "\n")
        self.out.flush()

    def say(self, text: str) -> None:
        """One line of text that may quote the host: its control characters made visible."""
        self.write(sanitize.field(text))

    def on_event(self, event: SinkEvent) -> None:
        self.store.apply(event)
        if self.once:
            return
        if self.as_json:
            self.write(json.dumps({"kind": "event", "event": event_json(event)}, default=str))
            return
        if isinstance(event, Line) and event.file == "train.log":
            if " step=" in event.text and event.run_id == self.store.run_id:
                self.write(sanitize.line(event.text))  # step lines pass through, made safe
        elif isinstance(event, LinkStatus) and event.state in ("reconnecting", "refused"):
            self.say(
                f"link {event.state}: {event.detail}"
                + (f" (retry in {event.retry_in}s)" if event.retry_in else "")
            )

    def snapshot_text(self, findings: list[Finding] | None = None) -> str:
        if findings is None:
            findings = diagnose(self.store, config=self.diagnosis)
        if self.as_json:
            tau = evaluation.of_store(self.store)
            return json.dumps(
                {
                    "kind": "snapshot",
                    "time": time.time(),
                    "state": self.store.to_json(),
                    "tau": tau.to_json() if tau else None,
                    "findings": [asdict(f) for f in findings],
                },
                default=str,
            )
        if self.once:  # the findings follow in full
            line = status_line(self.store, findings, unicode=self.unicode)
        else:
            line = status_text(self.store, findings, unicode=self.unicode)
        if self.color and findings:
            colour = "31" if findings[0].severity == "critical" else "33"
            line = f"\x1b[{colour}m{line}\x1b[0m"
        return line

    async def run(self) -> int:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            with contextlib.suppress(NotImplementedError, RuntimeError):
                loop.add_signal_handler(sig, self._stop.set)  # leaves the remote run alone
        self.link.start()
        try:
            if self.once:
                await settled(self.store, timeout=15.0)
                findings = diagnose(self.store, config=self.diagnosis)
                self._notify(findings)
                code = exit_code_for(self.store, findings)
                if code == EXIT_UNREACHABLE and not self.as_json:
                    self.say(unreachable_line(self.store, self.target))
                    return code
                self.write(self.snapshot_text(findings))
                if self.store.run_id is None and self.store.follow_received and not self.as_json:
                    self.say(f"no run under {run_root_of(self.store, self.target)}")
                host = host_summary(self.store)
                if host is not None and not self.as_json:
                    self.say(host)  # the path is the host's
                if not self.as_json:
                    for line in gpu_procs.lines(self.store):
                        self.say(line)  # say() sanitises: users and commands are the host's
                    for line in cuda_graphs.lines(self.store.heartbeat):
                        self.say(f"CUDA graphs, {line}")  # say() sanitises the reasons
                if not self.as_json:
                    for line in ranks_view.lines(self.store.ranks):  # processes mode
                        self.say(line)  # say() sanitises: host and error are the host's
                    for f in findings:
                        self.say(f"  {f.severity}: {f.title} — {f.evidence} → {f.action}")
                return code
            while not self._stop.is_set():
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(self._stop.wait(), self.interval)
                if not self._stop.is_set():
                    findings = diagnose(self.store, config=self.diagnosis)
                    self._notify(findings)
                    self.write(self.snapshot_text(findings))
                    ended = self._ended()
                    if ended is not None:
                        return ended
            return EXIT_OK
        finally:
            await self.link.close()
            if self.notifier is not None:
                self.notifier.close()

    def _ended(self) -> int | None:
        """`until_end`: once the followed run is over, its outcome line and exit code (0 it
        finished, 1 stopped early, 2 crashed, killed or died); None while it goes on."""
        outcome = self.store.outcome() if self.until_end else None
        if outcome is None:
            return None
        if not self.as_json:
            self.say(f"{self.store.run_id} {outcome.summary}")
        if outcome.kind == FINISHED:
            return EXIT_OK
        return EXIT_WARNING if outcome.kind == STOPPED_EARLY else EXIT_CRITICAL

    def _notify(self, findings: list[Finding]) -> None:
        if self.notifier is not None:
            self.notifier.update(findings, self.store.run_id)

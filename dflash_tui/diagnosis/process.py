"""Rules of the process and its exit: the link, a crash or a kill, a run that died at start,
a stale heartbeat, GPU memory held after the end, old code running."""

from __future__ import annotations

import posixpath

from dflash_tui.diagnosis.common import (
    dur,
    gb,
    possible,
)
from dflash_tui.diagnosis.config import (
    DEFAULT_CONFIG,
    HEARTBEAT_MAX_INTERVAL_S,
    DiagnosisConfig,
)
from dflash_tui.diagnosis.registry import Code, Finding, rule
from dflash_tui.state import Store
from trainer.contract.phases import (
    CRASHED,
    FINAL_PHASES,
)
from trainer.contract.records import ExitRecord, OomCheck
from trainer.contract.typed import encode


# -- rules: the run's life ------------------------------------------------------------------
@rule(
    Code("link_refused", ("critical",), "the connection was refused (SSH settings): no retry"),
    Code("unreachable", ("critical",), "the host cannot be reached: nothing shown is current"),
    reads="the link's state and its count of failed attempts",
    decides="link_refused when the link's state is `refused` (the SSH settings or the host "
    "key were refused: the link does not retry); unreachable when it is connecting or "
    "reconnecting after at least one failed attempt.",
    action="link_refused: fix the SSH settings the evidence names; dflash-tui will not retry. "
    "unreachable: check the host and the network; the link retries with backoff.",
)
def unreachable(s: Store, now: float, cfg: DiagnosisConfig = DEFAULT_CONFIG) -> list[Finding]:
    """The link is refused (bad SSH settings: no retry) or keeps failing: nothing else the
    monitor shows is current."""
    if s.link.state in ("refused",):
        return [
            Finding(
                "critical",
                "link_refused",
                "connection refused",
                s.link.detail,
                "fix the SSH settings named above; dflash-tui will not retry",
            )
        ]
    if s.link.state in ("reconnecting", "connecting") and s.link.attempt > 0:
        return [
            Finding(
                "critical",
                "unreachable",
                f"cannot reach {s.target}",
                s.link.detail,
                "check the host and network; retrying with backoff",
            )
        ]
    return []


@rule(
    Code("crashed", ("critical",), "the trainer crashed: an exception, or a non-zero exit"),
    Code("killed", ("critical",), "a signal ended the run with no error recorded (OOM, kill -9)"),
    reads="the heartbeat's phase and error; exit.json (exit code, signal, the OOM check the "
    "wrapper makes after a SIGKILL); the last lines of train.log and launch.log",
    decides="Raised when the heartbeat's phase is `crashed`, or exit.json records a non-zero "
    "exit code or a signal, unless the run died before its first step (died_at_start says "
    "that alone: one alert). A signal with no error message is killed, with what the wrapper "
    "found of the OOM killer (the memory cgroup's oom_kill count since launch, the kernel "
    "log). Otherwise crashed, naming the thread and the exit code or signal; its evidence is "
    "the error message, else the traceback's last line, else the logs' last lines that are "
    "not step lines (an `error: …` line first).",
    action="crashed: read the traceback (the heartbeat's error, train.log), fix, then restart "
    "(r). killed: an OOM kill means the host's memory ran out (raise the cgroup's limit or "
    "lower the trainer's host memory); otherwise find who sent SIGKILL; then restart (r).",
)
def crashed(s: Store, now: float, cfg: DiagnosisConfig = DEFAULT_CONFIG) -> list[Finding]:
    """The trainer reported a crash, or exited non-zero or by a signal (exit.json)."""
    hb = s.heartbeat
    ex = s.exit_info()
    unclean = ex is not None and (ex.exit_code not in (0, None) or ex.signal is not None)
    if not (hb is not None and hb.phase == CRASHED) and not unclean:
        return []
    if died_before_start(s):
        return []  # died_at_start is its one alert, with its own advice
    err = hb.error if hb else None
    message = (err.message if err else "") or (ex.error if ex else "") or ""
    where = f" in {err.thread}" if err and err.thread else ""
    if ex is not None and ex.signal and not message:
        # No exception: a signal ended it (the OOM killer, a kill -9). The outcome's word;
        # the step is the last heartbeat's (evidence), which may be a second behind.
        evidence, action = _no_error_evidence(s, ex), KILLED_UNKNOWN
        if ex.oom is not None:
            found, action = _oom_words(ex.oom)
            evidence += f"; {found}"
        return [Finding("critical", "killed", f"run killed by {ex.signal}", evidence, action)]
    if ex is not None and ex.signal:
        how = f"killed by {ex.signal}"
    else:
        how = f"exit code {ex.exit_code if ex is not None else hb.exit_code if hb else None}"
    last_tb = (err.traceback if err else "").strip().splitlines()[-1:] or [""]
    return [
        Finding(
            "critical",
            "crashed",
            f"run crashed{where} ({how})",
            message or last_tb[0] or _no_error_evidence(s, ex),
            "read the traceback (heartbeat error / train.log), fix, then restart (r)",
        )
    ]


KILLED_UNKNOWN = (
    "no handler runs on SIGKILL: look for the OOM killer in the host's kernel log "
    "(dmesg -T | grep -i -e oom -e 'killed process') or whoever sent it; then restart (r)"
)


def _oom_words(oom: OomCheck) -> tuple[str, str]:
    """(what the wrapper found of the OOM killer after the SIGKILL, the action it leads to):
    the memory cgroup's oom_kill count since launch and the kernel log, each as read, or why
    not (dflash_tui/agent/oom.py)."""
    # A count that fell (a hostile file, a cgroup made anew) recorded no kill of this run.
    kills = None if oom.oom_kills is None else max(0, oom.oom_kills)
    where = f"{posixpath.basename(oom.events)} of {posixpath.dirname(oom.events)}"
    if oom.kernel:
        kernel = f"kernel: {oom.kernel[-1]}"
    elif oom.kernel_error:
        kernel = f"kernel log not readable ({oom.kernel_error})"
    else:
        kernel = "the kernel log names no OOM kill of the trainer"
    if kills:
        count = f"oom_kill {kills} in {where} since launch: the kernel's OOM killer"
    elif kills == 0:
        count = f"no OOM kill recorded in {where}"
    else:
        count = f"{oom.events or 'memory cgroup'} not readable ({oom.events_error})"
    if oom.oom_killed():
        return f"{count}; {kernel}", (
            "the host's memory ran out (not the GPU's): raise the memory limit of that cgroup "
            "or lower the trainer's host memory (batch, the largest seq bucket, data workers); "
            "then restart (r)"
        )
    if kills == 0 and not oom.kernel_error:
        words = f"{count}, {kernel}: something else sent SIGKILL"
    elif kills == 0:
        words = f"{count}: something else sent SIGKILL; {kernel}"
    else:
        return f"{count}; {kernel}", KILLED_UNKNOWN
    return words, (
        "find who sent SIGKILL (a kill -9 by hand or by a script, a job scheduler, the "
        "container runtime); then restart (r)"
    )


def _no_error_evidence(s: Store, ex: ExitRecord | None) -> str:
    """What is known of a crash that recorded no error: where it was, and (unless a signal
    says it all) the logs' last words that are not step lines."""
    hb = s.heartbeat
    phase = (ex.final_phase if ex else None) or (hb.phase if hb else None)
    step = ex.step if ex is not None and ex.step is not None else hb.step if hb else None
    said: list[str] = []
    if ex is None or not ex.signal:
        said = [
            ln
            for ln in list(s.log_lines)[-5:] + list(s.launch_log)[-2:]
            if ln.strip() and " step=" not in ln
        ]
    # The trainer says a bad input in one `error: …` line: that line first, when there is
    # one (then the error *was* recorded, in the log: not "no error recorded").
    errors = [ln for ln in said if ln.startswith("error")][-1:]
    facts = errors[:] or ["no error recorded"]
    if phase or step is not None:
        facts.append(
            f"last heartbeat: phase {phase or '?'}, step {step if step is not None else '?'}"
        )
    if not errors:
        facts.extend(said[-2:])
    return "; ".join(facts)


DIED_AT_START_ACTION = (
    "fix what the error names (launch.log and train.log in the run dir say more): restarting "
    "as it was dies the same way. A bad override: restart (r) lets you drop or edit the "
    "launch's overrides (i lists them); a mistake in the config file: launch again with it "
    "fixed"
)


@rule(
    Code("died_at_start", ("critical",), "the run exited before its first step"),
    reads="exit.json, the step lines, the heartbeat's step, the last lines of launch.log and "
    "train.log",
    decides="exit.json is there, there is no step line and the heartbeat's step is 0 (or "
    "there is no heartbeat), and the exit was not clean (a non-zero exit code, or an error "
    "recorded). The evidence is the launcher's and the log's last lines, an `error …` line "
    "first.",
    action=DIED_AT_START_ACTION,
)
def died_before_log(s: Store, now: float, cfg: DiagnosisConfig = DEFAULT_CONFIG) -> list[Finding]:
    """The run exited (not cleanly) before its first step: show the launcher's and the log's
    last lines at once instead of leaving the operator to `ls` the run dir. The heartbeat's
    step decides, not the step lines: a run logging every 50 steps that dies at step 15 has
    none and did not die at start. The only alert of such a run (crashed stands aside): a
    restart as it was would die the same way, so the advice is to fix what the error names."""
    ex = s.exit_info()
    if ex is None or not died_before_start(s):
        return []
    tail = [ln for ln in list(s.launch_log)[-3:] + list(s.log_lines)[-3:] if ln.strip()]
    errors = [ln for ln in tail if ln.startswith("error")]
    tail = errors[-1:] + [ln for ln in tail if ln not in errors]
    return [
        Finding(
            "critical",
            "died_at_start",
            "the run exited before its first step",
            " | ".join(tail[-4:]) or str(encode(ex)),
            DIED_AT_START_ACTION,
        )
    ]


def died_before_start(s: Store) -> bool:
    """The run exited, not cleanly (a non-zero exit code, or an error recorded), before its
    first step: no step line, and no heartbeat past step 0."""
    ex = s.exit_info()
    hb = s.heartbeat
    if ex is None or s.step_lines or (hb is not None and hb.step > 0):
        return False
    return not (ex.exit_code == 0 and not ex.error)


@rule(
    Code("stale_heartbeat", ("critical",), "the heartbeat stopped: the process is hung or dead"),
    reads="the heartbeat's age (its own thread rewrites it every <= 2 s)",
    decides="Not in a final phase, and the heartbeat is older than `stale_factor` × 2 s (the "
    "contract's longest interval). Its thread writes whatever the loop does, so an old "
    "heartbeat means the whole process is hung (GIL held, D state) or dead: `process dead` "
    "when the run has ended (exit.json, the agent's liveness, a final phase).",
    thresholds=("stale_factor",),
    action="alive: dump stacks (d); if nothing answers, kill (K) and restart (r). Dead: the "
    "crash or kill finding says how; restart (r).",
)
def stale_heartbeat(s: Store, now: float, cfg: DiagnosisConfig = DEFAULT_CONFIG) -> list[Finding]:
    """The heartbeat thread writes every <= 2 s whatever the loop does: an old heartbeat means
    the whole process is hung (GIL held, D state) or dead."""
    hb = s.heartbeat
    if hb is None or hb.phase in FINAL_PHASES:
        return []
    age = s.heartbeat_age(now)
    if age is None or age <= cfg.stale_factor * HEARTBEAT_MAX_INTERVAL_S:
        return []
    dead = not possible(s, now, cfg).signal
    what = "process dead" if dead else "process hung or dead"
    return [
        Finding(
            "critical",
            "stale_heartbeat",
            what,
            f"heartbeat is {dur(age)} old (pid {hb.pid}, phase "
            f"{hb.phase}); it is rewritten every <= 2 s by its own thread",
            "the process is gone: the finding above says how; restart (r)"
            if dead
            else "dump stacks (d); if nothing answers, kill (K) and restart (r)",
        )
    ]


@rule(
    Code(
        "heartbeat_unreadable",
        ("warning",),
        "heartbeat.json is there but unreadable (torn, foreign, or not a file)",
    ),
    reads="the agent's heartbeat error (the contract's reader said why the file is unreadable)",
    decides="The followed run's heartbeat.json was read and refused: not JSON, a field of the "
    "wrong type or missing (`run_id`), a folder or FIFO in its place. The last good heartbeat, "
    "if any, stays on screen; this names the file and the reason.",
    action="look at RUN_DIR/heartbeat.json on the host: a trainer newer than this monitor "
    "(upgrade dflash-tui), or something other than the trainer wrote there",
)
def heartbeat_unreadable(
    s: Store, now: float, cfg: DiagnosisConfig = DEFAULT_CONFIG
) -> list[Finding]:
    """Without this an unreadable heartbeat looked like no run at all (`no run`, exit 0)."""
    error = s.heartbeat_error
    if error is None or s.run_id is None:
        return []
    why = error.split(" unreadable: ", 1)[-1]
    kept = " (the last good one is shown)" if s.heartbeat is not None else ""
    return [
        Finding(
            "warning",
            "heartbeat_unreadable",
            f"heartbeat.json of {s.run_id} is unreadable: {why}",
            f"the agent read {s.run_dir or s.run_id}/heartbeat.json and refused it{kept}",
            "look at the file on the host: a newer trainer (upgrade dflash-tui) or another writer",
        )
    ]


# -- rules: the run's lifetime and its surroundings -----------------------------------------
@rule(
    Code("memory_held", ("warning",), "GPU memory is still held after the run ended"),
    reads="exit.json, the agent's liveness, the GPU sample (each process's memory), the runs "
    "list's alive run",
    decides="The run is over (exit.json, or the agent says its process is dead), no other run "
    "is alive, and the GPU sample was taken at least `held_grace_s` after the end. On the "
    "run's GPUs, each process holding `held_min_bytes` or more is named (inside a container "
    "NVML may list none: then the device's used memory, at least that much).",
    thresholds=("held_grace_s", "held_min_bytes"),
    action="kill -9 the pids named (on the host for a pid not in this container), or find "
    "the holder with nvidia-smi, before relaunching",
)
def memory_held_after_kill(
    s: Store, now: float, cfg: DiagnosisConfig = DEFAULT_CONFIG
) -> list[Finding]:
    """The run is over but processes still hold GPU memory (a child that ignored the kill, a
    zombie with a CUDA context): the next launch would run out of memory. Names the pids."""
    ex = s.exit_info()
    dead = ex is not None or s.process_alive() is False
    devices = s.gpu_devices()
    if not dead or not devices or s.alive_run not in (None, s.run_id):
        return []  # (with another run alive, the memory is that run's)
    hb = s.heartbeat
    ended = (ex.ended_at if ex else None) or (hb.now if hb else None)
    sampled = s.gpu.t if s.gpu else None
    if ended is not None and sampled and sampled < ended + cfg.held_grace_s:
        return []  # the driver frees memory a few seconds after the exit
    used = set(s.gpu_roles()) & set(devices) or set(devices)  # the run's GPUs when known
    trainer = (hb.pid if hb else None) or (s.liveness.pid if s.liveness else None)
    held: dict[int, list[str]] = {}  # pid (0: none visible) -> "79.0 GB on GPU 5"
    remote_pids: set[int] = set()
    for i in sorted(used):
        d = devices[i]
        procs = [p for p in d.processes if p.mem_used >= cfg.held_min_bytes]
        for p in procs:
            held.setdefault(p.pid, []).append(f"{gb(p.mem_used)} on GPU {i}")
            if not p.local:
                remote_pids.add(p.pid)
        if not procs and d.mem_used >= cfg.held_min_bytes:
            # Inside a container NVML may list no process, or with no memory figure.
            for pid in [p.pid for p in d.processes] or [0]:
                held.setdefault(pid, []).append(f"{gb(d.mem_used)} on GPU {i}")
    if not held:
        return []
    parts = []
    for pid, where in held.items():
        who = "no visible process" if pid == 0 else f"pid {pid}"
        if trainer is not None and pid == trainer:
            who += " (the trainer)"
        elif pid in remote_pids:
            who += " (not in this container)"
        parts.append(f"{who}: {', '.join(where)}")
    kill = " ".join(str(p) for p in held if p)
    return [
        Finding(
            "warning",
            "memory_held",
            "GPU memory held after the run ended",
            "; ".join(parts),
            (
                f"kill -9 {kill} (on the host for pids not in this container)"
                if kill
                else "find the holder with nvidia-smi on the host"
            )
            + " before relaunching",
        )
    ]


@rule(
    Code("code_mismatch", ("warning",), "the running trainer is not the code deployed last"),
    reads="the heartbeat's code_sha256, and the deployed release the agent reports (its "
    "sha256 and when)",
    decides="While the run lives, the heartbeat's code hash and the deployed one are both "
    "known and differ: a fix deployed after the launch is not running yet (or the run "
    "imports another checkout).",
    action="restart (r) to run the deployed code, or redeploy what should run",
)
def code_mismatch(s: Store, now: float, cfg: DiagnosisConfig = DEFAULT_CONFIG) -> list[Finding]:
    """The running trainer's code hash differs from what was deployed last: a fix deployed
    after the launch is not running yet (or the run imports another checkout)."""
    hb = s.heartbeat
    deployed = s.hello.deployed if s.hello else None
    if hb is None or deployed is None or s.ended():
        return []
    running, want = hb.code_sha256, deployed.sha256
    if not running or not want or running == want:
        return []
    evidence = f"running {running[:12]}, deployed {want[:12]}"
    if hb.started_at and deployed.at and deployed.at > hb.started_at:
        evidence += f" ({dur(deployed.at - hb.started_at)} after this run started)"
    return [
        Finding(
            "warning",
            "code_mismatch",
            "running old code",
            evidence,
            "restart (r) to run the deployed code, or redeploy what should run",
        )
    ]

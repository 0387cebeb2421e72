"""Rules of the process and its exit: the link, a crash or a kill, a run that died at start,
a stale heartbeat, GPU memory held after the end, old code running."""

from __future__ import annotations

import posixpath

from dflash_tui.diagnosis.common import (
    _dur,
    _gb,
    possible,
)
from dflash_tui.diagnosis.config import (
    DEFAULT_CONFIG,
    HEARTBEAT_MAX_INTERVAL_S,
    DiagnosisConfig,
)
from dflash_tui.diagnosis.registry import Finding, rule
from dflash_tui.state import Store
from trainer.contract.phases import (
    CRASHED,
    FINAL_PHASES,
)
from trainer.contract.records import ExitRecord, OomCheck
from trainer.contract.typed import encode


# -- rules: the run's life ------------------------------------------------------------------
@rule
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


@rule
def crashed(s: Store, now: float, cfg: DiagnosisConfig = DEFAULT_CONFIG) -> list[Finding]:
    """The trainer reported a crash, or exited non-zero or by a signal (exit.json)."""
    hb = s.heartbeat
    ex = s.exit_info()
    unclean = ex is not None and (ex.exit_code not in (0, None) or ex.signal is not None)
    if not (hb is not None and hb.phase == CRASHED) and not unclean:
        return []
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
    facts = ["no error recorded"]
    if phase or step is not None:
        facts.append(
            f"last heartbeat: phase {phase or '?'}, step {step if step is not None else '?'}"
        )
    if ex is None or not ex.signal:
        said = [
            ln
            for ln in list(s.log_lines)[-5:] + list(s.launch_log)[-2:]
            if ln.strip() and " step=" not in ln
        ]
        # The trainer says a bad input in one `error: …` line: that line, when there is one.
        facts.extend([ln for ln in said if ln.startswith("error")][-1:] or said[-2:])
    return "; ".join(facts)


@rule
def died_before_log(s: Store, now: float, cfg: DiagnosisConfig = DEFAULT_CONFIG) -> list[Finding]:
    """The run exited (not cleanly) before its first step: show the launcher's and the log's
    last lines at once instead of leaving the operator to `ls` the run dir. The heartbeat's
    step decides, not the step lines: a run logging every 50 steps that dies at step 15 has
    none and did not die at start."""
    ex = s.exit_info()
    hb = s.heartbeat
    if ex is None or s.step_lines or (hb is not None and hb.step > 0):
        return []
    if ex.exit_code == 0 and not ex.error:
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
            "see launch.log and train.log in the run dir; fix and relaunch",
        )
    ]


@rule
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
            f"heartbeat is {_dur(age)} old (pid {hb.pid}, phase "
            f"{hb.phase}); it is rewritten every <= 2 s by its own thread",
            "the process is gone: the finding above says how; restart (r)"
            if dead
            else "dump stacks (d); if nothing answers, kill (k) and restart (r)",
        )
    ]


# -- rules: the run's lifetime and its surroundings -----------------------------------------
@rule
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
            held.setdefault(p.pid, []).append(f"{_gb(p.mem_used)} on GPU {i}")
            if not p.local:
                remote_pids.add(p.pid)
        if not procs and d.mem_used >= cfg.held_min_bytes:
            # Inside a container NVML may list no process, or with no memory figure.
            for pid in [p.pid for p in d.processes] or [0]:
                held.setdefault(pid, []).append(f"{_gb(d.mem_used)} on GPU {i}")
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


@rule
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
        evidence += f" ({_dur(deployed.at - hb.started_at)} after this run started)"
    return [
        Finding(
            "warning",
            "code_mismatch",
            "running old code",
            evidence,
            "restart (r) to run the deployed code, or redeploy what should run",
        )
    ]

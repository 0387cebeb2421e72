"""Rules of liveness and stalls: a stalled loop or checkpoint, a stop that does not end,
buffered output, a slow start-up phase, no step line yet (wandb's lines only)."""

from __future__ import annotations

import re
import statistics

from dflash_tui import compile_progress
from dflash_tui.diagnosis.common import (
    dur,
    live_heartbeat,
    phase_age,
    possible,
)
from dflash_tui.diagnosis.config import (
    DEFAULT_CONFIG,
    HEARTBEAT_MAX_INTERVAL_S,
    DiagnosisConfig,
)
from dflash_tui.diagnosis.registry import Code, Finding, rule
from dflash_tui.facts import (
    current_visit,
    earlier_runs,
    phase_comparison,
    phase_expectation,
)
from dflash_tui.fmt import count, duration
from dflash_tui.state import Store
from trainer.contract.heartbeat import (
    SAVING_CHECKPOINT,
    Heartbeat,
    WandbInfo,
)
from trainer.contract.phases import (
    CHECKPOINTING,
    COMPILING,
    LOADING_DATA,
    LOADING_TARGET,
    STOPPING,
    TARGET_WAIT,
    TRAINING,
    phase_spans,
)

# The visits slow_phase compares with earlier runs (start-up ones that can stall on a disk,
# a network mount or a cold compile cache).
SLOW_VISITS = (LOADING_DATA, LOADING_TARGET, COMPILING, TARGET_WAIT)


@rule(
    Code("loop_stalled", ("critical",), "the process lives but the training loop makes no step"),
    Code("checkpoint_stalled", ("critical",), "a checkpoint save does not finish"),
    reads="the heartbeat (phase, last step time, threads and their states), the run's earlier "
    "checkpoint phases, else earlier comparable runs' (facts.py)",
    decides="Training or checkpointing, the heartbeat fresh (within `stale_factor` × 2 s), "
    "the process not ended, and no step for `stall_s` or more. While checkpointing, a save "
    "is a stall only past the larger of `stall_s` and `slow_phase_factor` × the usual save "
    "plus `slow_phase_margin_s` (the run's own earlier saves, else earlier runs'): "
    "checkpoint_stalled, naming the saving thread. Otherwise loop_stalled, naming the "
    "pipeline thread at work longest in one state (not those waiting on it).",
    thresholds=("stale_factor", "stall_s", "slow_phase_factor", "slow_phase_margin_s"),
    action="dump stacks (d) to see where it waits; a stalled checkpoint: check the disk under "
    "the run dir (free space, a slow or hung mount)",
)
def stalled_loop(s: Store, now: float, cfg: DiagnosisConfig = DEFAULT_CONFIG) -> list[Finding]:
    """Fresh heartbeat, old last_step_at: the process lives but the training loop is stuck;
    name the pipeline thread that has been in one state the longest. A checkpoint that does
    not finish stops the loop too (a full or hung disk): said as such."""
    hb = s.heartbeat
    if hb is None or hb.phase not in (TRAINING, CHECKPOINTING) or not hb.last_step_at:
        return []
    if (s.heartbeat_age(now) or 0) > cfg.stale_factor * HEARTBEAT_MAX_INTERVAL_S:
        return []  # the process itself is stale: stale_heartbeat says it
    if not possible(s, now, cfg).signal:
        return []  # a dead process's last heartbeat: how it ended is the finding, not a stall
    since_step = hb.now - hb.last_step_at
    if since_step < cfg.stall_s:
        return []
    usual = _usual_checkpoint(s, hb) if hb.phase == CHECKPOINTING else None
    if usual is not None:
        # A save that always takes minutes (a big drafter's optimizer state, a network disk)
        # is not a stall at `stall_s`: the run's own saves, else earlier runs', set the bar.
        in_save = hb.now - hb.phase_started_at
        if in_save < max(cfg.stall_s, cfg.slow_phase_factor * usual[0] + cfg.slow_phase_margin_s):
            return []
    threads = [t for t in hb.threads if t.role in ("drafter", "target", "prefetch")]
    if hb.phase == CHECKPOINTING:  # the saving thread is where it is stuck, not its waiters
        threads = [t for t in threads if t.state == SAVING_CHECKPOINT] or threads
    # The stuck thread is the one at work, not those waiting on it: one hung replica leaves
    # its peers at the step's barrier and the targets at a full q_hs, as long or longer.
    working = [t for t in threads if not t.state.startswith("waiting")]
    stuck = max(working or threads, key=hb.in_state_s, default=None)
    where = (
        f"{stuck.name} ({stuck.state} for {dur(hb.in_state_s(stuck))})"
        if stuck
        else "an unknown thread"
    )
    if hb.phase == CHECKPOINTING:
        return [
            Finding(
                "critical",
                "checkpoint_stalled",
                f"checkpoint after step {count(hb.step)} stalled in {where}",
                f"heartbeat fresh, checkpointing for {dur(hb.now - hb.phase_started_at)}, "
                f"no step for {dur(since_step)}"
                + (f"; a save usually takes {dur(usual[0])} ({usual[1]})" if usual else ""),
                "check the disk under the run dir (free space, a slow or hung mount); dump "
                "stacks (d) to see where the save waits",
            )
        ]
    return [
        Finding(
            "critical",
            "loop_stalled",
            f"training loop stalled in {where}",
            f"heartbeat fresh, but no step for {dur(since_step)} (step {count(hb.step)})",
            "dump stacks (d) to see where it waits",
        )
    ]


def _usual_checkpoint(s: Store, hb: Heartbeat) -> tuple[float, str] | None:
    """(the median seconds of a checkpoint save, whose): this run's finished saves, else the
    saves of earlier comparable runs; None when neither has one."""
    spans = phase_spans(hb.phase_history)[:-1]  # the save under way is the last
    own = [sp.seconds(hb.now) for sp in spans if sp.phase == CHECKPOINTING]
    if own:
        return statistics.median(own), f"median of this run's {len(own)} earlier saves"
    past = [
        v for r in earlier_runs(s) for k, v in r.phases.items() if k.split("#")[0] == CHECKPOINTING
    ]
    if past:
        return statistics.median(past), f"median of {len(past)} saves of earlier runs"
    return None


@rule(
    Code("stop_stalled", ("warning",), "stopping takes far longer than earlier runs' stops"),
    reads="the heartbeat in the stopping phase, earlier comparable runs' stopping durations",
    decides="A fresh heartbeat in `stopping` for at least the larger of `slow_phase_factor` × "
    "the median stop of earlier comparable runs and that median plus `slow_phase_margin_s`; "
    "with no earlier run to compare with, `stop_stall_s`. Names the thread longest in one "
    "state.",
    thresholds=("stale_factor", "slow_phase_factor", "slow_phase_margin_s", "stop_stall_s"),
    action="dump stacks (d) to see what the stop waits for; kill (K) sends SIGKILL after its "
    "timeout (the newest good checkpoint stays)",
)
def stop_stalled(s: Store, now: float, cfg: DiagnosisConfig = DEFAULT_CONFIG) -> list[Finding]:
    """Stopping (asked to stop: the last checkpoint, then every thread's exit) far longer
    than earlier comparable runs took to stop, or than `stop_stall_s` with none: a save on a
    hung disk, or a thread that never looks at the stop flag. Until it ends, its GPU memory
    stays held and a relaunch is refused."""
    hb = live_heartbeat(s, now, cfg, STOPPING)
    if hb is None or not hb.phase_started_at:
        return []
    elapsed = s.remote_now(now) - hb.phase_started_at
    key = current_visit(hb)
    past = [(r.run_id, r.phases[key]) for r in earlier_runs(s) if key in r.phases]
    if past:
        usual = statistics.median(v for _, v in past)
        bar = max(cfg.slow_phase_factor * usual, usual + cfg.slow_phase_margin_s)
        against = f"earlier runs stopped in {dur(usual)} (median of {len(past)}; last: run "
        against += f"{past[-1][0]}, {dur(past[-1][1])})"
    else:
        bar, against = (
            cfg.stop_stall_s,
            f"no earlier comparable run to compare with; bar {dur(cfg.stop_stall_s)}",
        )
    if elapsed < bar:
        return []
    threads = [t for t in hb.threads if t.state not in ("done", "")]
    stuck = max(threads, key=hb.in_state_s, default=None)
    where = f"; {stuck.name} {stuck.state} for {dur(hb.in_state_s(stuck))}" if stuck else ""
    return [
        Finding(
            "warning",
            "stop_stalled",
            f"stopping for {dur(elapsed)} at step {count(hb.step)}",
            f"heartbeat fresh, stopping for {dur(elapsed)}; {against}{where}",
            "dump stacks (d) to see what the stop waits for; kill (K) sends SIGKILL after its "
            "timeout (the newest good checkpoint stays)",
        )
    ]


@rule(
    Code("output_buffered", ("warning",), "steps advance but train.log gets no step line"),
    reads="the heartbeat's step, train.log's step lines, metrics.jsonl rows",
    decides="Training, the followed files received, and the heartbeat at least 2 steps past "
    "the last step line. Late by the step the last line names: the first metrics row after "
    "it says when the next line was due (else the last step line's arrival, else the start "
    "of training); late by `buffered_s` or more.",
    thresholds=("buffered_s",),
    action="run python with -u or PYTHONUNBUFFERED=1, or print(..., flush=True)",
)
def output_buffered(s: Store, now: float, cfg: DiagnosisConfig = DEFAULT_CONFIG) -> list[Finding]:
    """The heartbeat's step advances but train.log gets no step line: stdout is buffered (or
    goes elsewhere), so anyone reading the log thinks the run is not training."""
    hb = s.heartbeat
    if hb is None or hb.phase != TRAINING or not s.follow_received:
        return []
    last_line_step = s.step_lines[-1].step if s.step_lines else 0
    if hb.step - last_line_step < 2:
        return []
    # By the step the last line names, not by when it was read: lines that come in bursts
    # (a block buffer flushing) arrive fresh yet name a step minutes old, and `status`
    # reads a whole tail at once. metrics.jsonl, written line by line with the step line,
    # says when the next line was due.
    due = next((r for r in s.metrics if r.step > last_line_step and r.time > 0), None)
    if due is not None:
        late = s.remote_now(now) - due.time
        since = f"; step {due.step}'s line was due {duration(late)} ago (metrics.jsonl has it)"
    else:
        reference = s.last_step_line_at
        if reference is None:
            started = [v.started_at for v in hb.phase_history if v.phase == TRAINING]
            reference = started[-1] if started else None
        if reference is None:
            return []
        late, since = s.remote_now(now) - reference, ""
    if late < cfg.buffered_s:
        return []
    return [
        Finding(
            "warning",
            "output_buffered",
            "output buffered: steps advance, no step line",
            f"heartbeat at step {count(hb.step)}, train.log's last step line is "
            f"{'step ' + str(last_line_step) if s.step_lines else 'none'}{since}",
            "run python with -u or PYTHONUNBUFFERED=1, or print(..., flush=True)",
        )
    ]


@rule(
    Code("slow_phase", ("warning",), "loading or compiling much longer than in earlier runs"),
    reads="the heartbeat's phase and its visits, earlier comparable runs' phase durations "
    "(facts.py), the compile cache's history (graphs, last time)",
    decides="A fresh heartbeat in loading_data, loading_target or compiling (or the wait for "
    "the target's weights, compared as whole loads). Slower than `slow_phase_factor` × the "
    "median of the same visit in earlier comparable runs and by more than "
    "`slow_phase_margin_s`. With no earlier run, compiling against the compile cache's "
    "last time for the same graphs, with the same factor and margin.",
    thresholds=("stale_factor", "slow_phase_factor", "slow_phase_margin_s"),
    action="compiling: check the compile cache was kept (code or shape changes recompile "
    "everything). Loading: check the disk or network the files come from. Either: dump "
    "stacks (d) if it looks stuck.",
)
def slow_phase(s: Store, now: float, cfg: DiagnosisConfig = DEFAULT_CONFIG) -> list[Finding]:
    """Loading or compiling much longer than the same visit in earlier comparable runs: a
    cleared or invalidated compile cache, a slow disk or network mount, or a thread stuck in
    the phase. Compared with the median of those runs, so one odd run does not set the bar.
    The wait for the target's weights (loading_target#2) is compared as whole loads: the load
    overlaps compiling, so this run's load so far against earlier runs' whole loads."""
    hb = live_heartbeat(s, now, cfg, LOADING_DATA, LOADING_TARGET, COMPILING)
    got = phase_comparison(s, now) if hb else None
    if hb is not None and got is None:
        return _slower_compile(s, hb, now, cfg)
    if hb is None or got is None or got.key not in SLOW_VISITS or got.so_far is None:
        return []
    elapsed, past = got.so_far, got.earlier
    usual = past.usual
    if elapsed <= cfg.slow_phase_factor * usual or elapsed - usual <= cfg.slow_phase_margin_s:
        return []
    evidence = f"{dur(elapsed)} so far; {dur(past.last)} last time (run {past.last_run})"
    if len(past.values) > 1:
        evidence += f", median {dur(usual)} over {len(past.values)} runs"
    if got.key == TARGET_WAIT:
        evidence = f"the whole load: {evidence}"
    progress = hb.phase_progress
    compiling = compile_progress.detail(hb, s.remote_now(now)) if got.key == COMPILING else None
    if compiling:  # graphs done of expected, the one under way, the cache's last time
        evidence += f"; {compiling}"
    elif progress is not None and progress.total:
        evidence += f"; {progress.done}/{progress.total} {progress.unit}"
    slower = "longer" if got.key == TARGET_WAIT else "slower"
    title = f"{got.doing} {slower} than usual"
    return [Finding("warning", "slow_phase", title, evidence, _slow_action(hb, got.key))]


def _slow_action(hb: Heartbeat, key: str) -> str:
    if key == COMPILING:
        return (
            f"check the compile cache ({hb.compile.cache_dir or 'cache_dir'}) was kept: code "
            "or shape changes recompile everything; dump stacks (d) if it looks stuck"
        )
    return "check the disk or network the files come from; dump stacks (d) to see where it is"


def _slower_compile(s: Store, hb: Heartbeat, now: float, cfg: DiagnosisConfig) -> list[Finding]:
    """No earlier comparable run in the runs list (another run root, or they were deleted),
    but the compile cache remembers what the same graphs took (trainer/runtime/compile/progress.py):
    compiling against that, with the same factor and margin."""
    last = hb.compile.last_s
    if not compile_progress.reported(hb) or last is None or not hb.phase_started_at:
        return []
    elapsed = s.remote_now(now) - hb.phase_started_at
    if elapsed <= cfg.slow_phase_factor * last or elapsed - last <= cfg.slow_phase_margin_s:
        return []
    evidence = f"{dur(elapsed)} so far; the compile cache's history: " + (
        compile_progress.detail(hb, s.remote_now(now)) or ""
    )
    return [
        Finding(
            "warning",
            "slow_phase",
            "compiling slower than last time",
            evidence,
            _slow_action(hb, COMPILING),
        )
    ]


# -- wandb ----------------------------------------------------------------------------------
_WANDB_RUN_URL = re.compile(r"View run at (https?://\S+/runs/([A-Za-z0-9]+))")
_WANDB_RUN_DIR = re.compile(r"run-\d{8}_\d{6}-([A-Za-z0-9]+)")
_WANDB_OFFLINE = re.compile(r"syncing is set to\W+offline|wandb sync ", re.IGNORECASE)


def _wandb_lines(s: Store) -> list[str]:
    return [ln for ln in s.log_lines if ln.startswith("wandb:")]


def wandb_info(s: Store) -> WandbInfo | None:
    """The run's wandb run: from the heartbeat, else from the `wandb:` lines wandb printed
    into train.log ("View run at https://wandb.ai/…/runs/<id>"). `mode` is "" when neither
    says it."""
    hb_w = s.heartbeat.wandb if s.heartbeat else None
    if hb_w is not None and (hb_w.id or hb_w.url):
        return hb_w
    run_id: str | None = None
    url: str | None = None
    mode: str | None = None
    for ln in _wandb_lines(s):
        if m := _WANDB_RUN_URL.search(ln):
            url, run_id, mode = m.group(1), m.group(2), "online"
        elif (m := _WANDB_RUN_DIR.search(ln)) and not run_id:
            run_id = m.group(1)
        if _WANDB_OFFLINE.search(ln):
            mode = "offline"
    if run_id or url:
        return WandbInfo(mode=mode or (hb_w.mode if hb_w else ""), id=run_id, url=url)
    return hb_w


@rule(
    Code("no_step_line", ("info",), "train.log has wandb's lines and no step line yet"),
    reads="train.log's `wandb:` lines and step lines, the heartbeat's phase, step and last "
    "step, earlier runs' phase durations",
    decides="The followed files received, wandb's start-up lines and no step line, the run "
    "not ended. Says the heartbeat's phase and how long it has been in it, whether steps "
    "advance, and the wandb run: readers otherwise guess between still loading and training.",
    action="steps advance: wait for the first logged step (unless stdout is buffered). No "
    "step yet: wait for the phase to end.",
)
def no_step_line_yet(s: Store, now: float, cfg: DiagnosisConfig = DEFAULT_CONFIG) -> list[Finding]:
    """train.log shows wandb's start-up lines and no step line: readers guess between "still
    loading" and "training". Say the heartbeat's phase, how long it has been in it, and
    whether steps advance; name the wandb run."""
    hb = s.heartbeat
    wandb_lines = _wandb_lines(s)
    if hb is None or not s.follow_received or s.step_lines or not wandb_lines or s.ended():
        return []
    age = phase_age(s, now)
    in_phase = f"{hb.phase} for {dur(age)}" if age is not None else hb.phase
    expect = phase_expectation(s, now)
    wb = wandb_info(s)
    run = f"; wandb run {wb.id} ({wb.mode or '?'})" if wb and wb.id else ""
    log = f"train.log: {len(wandb_lines)} wandb lines, no step line"
    if hb.step > 0 and hb.last_step_at is not None:
        ago = dur(s.remote_now(now) - hb.last_step_at)
        return [
            Finding(
                "info",
                "no_step_line",
                f"{in_phase}, step {count(hb.step)}, no step line yet",
                f"heartbeat: {in_phase}, steps advance (step {count(hb.step)}, last {ago} ago); "
                f"{log}{run}",
                "training runs; step lines appear at the first logged step unless stdout is "
                "buffered",
            )
        ]
    return [
        Finding(
            "info",
            "no_step_line",
            f"{in_phase}, no step yet",
            f"heartbeat: {in_phase}"
            + (f" ({expect})" if expect else "")
            + f", step {count(hb.step)}; "
            f"{log}{run}",
            "not training yet: wandb prints at start-up; wait for the phase to end",
        )
    ]

"""Record the diagnosis scenarios from real CPU runs: `scripts/record-scenarios [NAME ...]`.

Each scenario runs the operator's path for real: `deploy` and `launch` through the agent
(a local one), the tiny CPU config, a fault injected with DFLASH_FAULT where the scenario
needs one (a thread that raises, hangs or is slow, a NaN loss, a SIGKILL, a slow load,
compile or checkpoint). Once the run is in the state the scenario is about, a second link
connects as an operator's monitor would and everything the agent sends it for a few
seconds is the scenario: tests/fixtures/scenarios/recorded/NAME.jsonl.

Edits, and only these, so the files are stable and readable:
- times: every timestamp is shifted by one constant so that the last event is at
  NOW = 1_800_000_000 (the tests' clock); durations are untouched;
- identities: pids are renumbered in order of appearance from 4000, the host is `cpu-box`,
  the temporary folder is /workspace/dflash, the interpreter /usr/bin/python3.
The header of each file says what was run, when and where.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import platform
import re
import shutil
import socket
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from dflash_tui import control
from dflash_tui.link.events import SinkEvent, event_json
from dflash_tui.link.link import BadInput, Link, LinkError
from dflash_tui.state import Store
from dflash_tui.targets import resolve_target
from trainer.contract.heartbeat import WAIT_HS_EMPTY, WAIT_HS_FULL, WAIT_PRE_EMPTY, Heartbeat
from trainer.contract.phases import TARGET_WAIT
from trainer.contract.protocol import Launch
from trainer.contract.typed import decode

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "tests" / "fixtures" / "scenarios" / "recorded"
TINY = ROOT / "trainer" / "configs" / "tiny-cpu.toml"
NOW = 1_800_000_000.0
BASE = ["runtime.wandb_mode=disabled", "train.max_steps=2000"]
TIME_KEYS = {
    "t", "now", "started_at", "phase_started_at", "last_step_at", "ended_at", "since", "at",
    "created", "time", "launched_at",
}  # fmt: skip
PID_KEYS = {"pid", "pgid", "wrapper_pid", "agent_pid", "ppid", "leader"}  # leader, ppid: procs

Ready = Callable[[Store], bool]


@dataclasses.dataclass
class Run:
    fault: str = ""
    overrides: list[str] = dataclasses.field(default_factory=list)
    until: Ready | None = None  # None: until the run has ended
    wait_s: float = 400.0  # for `until`


@dataclasses.dataclass
class Scenario:
    name: str
    about: str  # what happened, in a sentence or two
    runs: list[Run]  # the earlier runs of the same config first, the scenario's run last
    observe_s: float = 4.0  # how long the operator's monitor is connected
    wait_after_s: float = 0.0  # after the last run is ready, before the monitor connects


def _threads_in(s: Store, role: str, state: str, for_s: float) -> bool:
    hb = s.heartbeat
    if hb is None or hb.phase != "training":
        return False
    threads = hb.threads_of(role)
    # Blocked since after training began: a wait from warm-up ends at the first step.
    return bool(threads) and all(
        t.state == state and hb.in_state_s(t) >= for_s and t.since >= hb.phase_started_at
        for t in threads
    )


def _step(n: int) -> Ready:
    return lambda s: s.heartbeat is not None and s.heartbeat.step >= n


def _in_visit(key: str, for_s: float) -> Ready:
    def ready(s: Store) -> bool:
        hb = s.heartbeat
        return hb is not None and hb.visit == key and hb.now - hb.phase_started_at >= for_s

    return ready


def _stalled(for_s: float) -> Ready:
    def ready(s: Store) -> bool:
        hb: Heartbeat | None = s.heartbeat
        return hb is not None and hb.last_step_at is not None and hb.now - hb.last_step_at >= for_s

    return ready


def _evals(n: int) -> Ready:
    def ready(s: Store) -> bool:
        ev = s.heartbeat.eval if s.heartbeat is not None else None
        return ev is not None and sum(p.tau is not None for p in ev.history) >= n

    return ready


def _lines_late(for_s: float) -> Ready:
    """Step lines have come (a burst was flushed), and the line after the last one was due
    `for_s` ago: metrics.jsonl (line by line) has its row."""

    def ready(s: Store) -> bool:
        hb = s.heartbeat
        if not s.step_lines or hb is None:
            return False
        last = s.step_lines[-1].step
        due = next((r for r in s.metrics if r.step > last), None)
        return due is not None and hb.now - due.time >= for_s

    return ready


HISTORY = Run(overrides=["train.max_steps=20"])
LOG_5 = ["train.log_every=5"]
# Held-out eval during training, as small as it goes: 8 samples held out, 2 prompts × 8 new
# tokens every 10 steps, on the demo's target and data (trainer/configs/demo-cpu.toml), so
# that τ moves.
EVAL = [
    "target.path=builtin:tiny-qwen3-chat", "data.path=builtin:tiny-chat-answers",
    "data.held_out=8", "eval.every=10", "eval.prompts=2", "eval.new_tokens=8",
]  # fmt: skip
SCENARIOS = [
    Scenario(
        "healthy",
        "The demo config training normally: 2 target threads, 2 drafter replicas, 2 "
        "prefetch threads, all on one device.",
        [HISTORY, Run(until=_step(60))],
    ),
    Scenario(
        "stage_times",
        "The demo config training normally, from a trainer that times each pipeline "
        "thread's stages (ThreadInfo.stages_ms in the heartbeat, stages_ms in metrics.jsonl): "
        "2 target threads, 2 drafter replicas, 2 prefetch threads, all on one device.",
        [HISTORY, Run(until=_step(60))],
    ),
    Scenario(
        "fingerprinted",
        "The demo config trained twice, the second run followed at step 30: each run's "
        "config.json carries its environment fingerprint and fast-kernel preflight (run."
        "environment, run.preflight), sent in the runs list; the heartbeat carries the "
        "preflight.",
        [HISTORY, Run(until=_step(30))],
    ),
    Scenario(
        "held_out_eval",
        "The demo config evaluating held-out τ during training (data.held_out=8, eval.every=10, "
        "eval.prompts=2, eval.new_tokens=8) trained twice: the first run 40 steps, the second "
        "followed once its heartbeat has 3 evals with a τ: the heartbeat's `eval`, each run's "
        "in the runs list (RunInfo.eval), metrics rows with the eval that finished.",
        [Run(overrides=[*EVAL, "train.max_steps=40"]), Run(overrides=EVAL, until=_evals(3))],
    ),
    Scenario(
        "host_context",
        "The demo config training normally with a checkpoint every 20 steps, followed at "
        "step 50 (checkpoints at 20 and 40 in the runs list: RunInfo.checkpoints): the "
        "agent's host sample (CPUs, load, host CPU use, memory, free disk under the run root).",
        [Run(overrides=["train.checkpoint_every=20"], until=_step(50))],
    ),
    Scenario(
        "crashed_in_thread",
        "An exception in a drafter thread at its 16th batch (DFLASH_FAULT=drafter:15): the "
        "run stops, the traceback is in the heartbeat, exit code 1.",
        [Run(fault="drafter:15")],
    ),
    Scenario(
        "died_before_start",
        "A bad override (train.lr=abc): the trainer exits 2 before its first heartbeat; "
        "the run dir has only launch.json, launch.log, train.log and exit.json.",
        [Run(overrides=["train.lr=abc"])],
    ),
    Scenario(
        "killed_sigkill",
        "The trainer SIGKILLs itself after step 30 (DFLASH_FAULT=sigkill:30), as the OOM "
        "killer would: no handler runs; the monitor connects 8 s later.",
        [Run(fault="sigkill:30")],
        wait_after_s=8.0,
    ),
    Scenario(
        "stalled_loop",
        "Both drafter threads hang inside their forward at their 31st batch "
        "(DFLASH_FAULT=hang:drafter:30): the heartbeat stays fresh, the steps stop; "
        "recorded 125 s into the stall.",
        [Run(fault="hang:drafter:30", until=_stalled(125.0))],
    ),
    Scenario(
        "prefetch_bottleneck",
        "Each batch takes 45 s longer to build (DFLASH_FAULT=slow:prefetch:45): q_pre empty, "
        "the targets and drafters wait; recorded with every target blocked >= 32 s.",
        [
            Run(
                fault="slow:prefetch:45",
                until=lambda s: _threads_in(s, "target", WAIT_PRE_EMPTY, 32),
            )
        ],
    ),
    Scenario(
        "targets_bottleneck",
        "Each target forward takes 45 s longer (DFLASH_FAULT=slow:target:45): q_hs empty, the "
        "drafters wait; recorded with every drafter blocked >= 32 s.",
        [Run(fault="slow:target:45", until=lambda s: _threads_in(s, "drafter", WAIT_HS_EMPTY, 32))],
    ),
    Scenario(
        "drafters_bottleneck",
        "Each drafter step takes 90 s longer (DFLASH_FAULT=slow:drafter:90): q_hs and q_pre "
        "back up, the targets wait; recorded with every target blocked >= 32 s.",
        [Run(fault="slow:drafter:90", until=lambda s: _threads_in(s, "target", WAIT_HS_FULL, 32))],
    ),
    Scenario(
        "thread_straggler",
        "Target thread 1's forward takes 1.5 s longer (DFLASH_FAULT=slow:target-1:1.5) under "
        "fixed routing: drafter-1 waits on q_hs for target-1's batches, drafter-0 at the "
        "step's barrier for drafter-1, target-0 on its full q_hs; recorded at step 20.",
        [Run(fault="slow:target-1:1.5", until=_step(20))],
    ),
    Scenario(
        "shared_routing",
        "The same slowed target 1 (DFLASH_FAULT=slow:target-1:1.5) under runtime.routing = "
        '"shared": one q_pre and one q_hs, target-0 takes the batches target-1 cannot, the '
        "drafters keep working; recorded at step 20.",
        [
            Run(
                fault="slow:target-1:1.5",
                overrides=["runtime.routing=shared"],
                until=_step(20),
            )
        ],
    ),
    Scenario(
        "one_replica_hung",
        "One drafter replica (drafter-1) hangs inside its forward at its 31st batch "
        "(DFLASH_FAULT=hang:drafter-1:30); the other waits for it at the step's barrier, "
        "the targets at a full q_hs; recorded 125 s into the stall.",
        [Run(fault="hang:drafter-1:30", until=_stalled(125.0))],
    ),
    Scenario(
        "nan_loss",
        "The drafter loss turns NaN from step 40 on (DFLASH_FAULT=nan:40), as a diverged run's "
        "does; recorded at step 70.",
        [Run(fault="nan:40", until=_step(70))],
    ),
    Scenario(
        "healthy_training",
        "The demo config training normally past the training-health rules' warm-up (step "
        "100), from a trainer that logs each row's gradient norm (grad_norm); recorded at "
        "step 250.",
        [Run(until=_step(250))],
    ),
    Scenario(
        "loss_diverging",
        "From step 130 the optimizer's learning rate is 1000× the schedule's "
        "(DFLASH_FAULT=diverge:130:1000): the loss jumps and settles far above its best; "
        "recorded at step 200.",
        [Run(fault="diverge:130:1000", until=_step(200))],
    ),
    Scenario(
        "not_learning",
        "The optimizer's learning rate is 0 from the first step (DFLASH_FAULT=zero_lr): "
        "the drafter keeps its init, loss and accuracy stay flat; recorded at step 170.",
        [Run(fault="zero_lr", until=_step(170))],
    ),
    Scenario(
        "grad_norm_spike",
        "The loss is scaled by 100 before its backward at steps 130, 160, 190 "
        "(DFLASH_FAULT=grad_spike:130:30:100): the gradient norm of those steps is 100× "
        "larger, clipping bounds the update; recorded at step 210.",
        [Run(fault="grad_spike:130:30:100", until=_step(210))],
    ),
    Scenario(
        "stalled_checkpoint",
        "The checkpoint at step 20 takes 150 s longer (DFLASH_FAULT=stall_checkpoint:150, "
        "checkpoint_every=20), as on a full or hung disk; recorded 125 s into it.",
        [
            Run(
                fault="stall_checkpoint:150",
                overrides=["train.checkpoint_every=20"],
                until=_in_visit("checkpointing", 125.0),
            )
        ],
    ),
    Scenario(
        "target_wait_as_usual",
        "The target's weights take 80 s to load in every run (DFLASH_FAULT=slow:load_target:80), "
        "longer than the drafters take to compile: the run waits for them "
        "(loading_target, second visit). An earlier run of the same config waited as long. "
        "Recorded 60 s into this run's wait: the old monitor's false alarm.",
        [
            Run(fault="slow:load_target:80", overrides=["train.max_steps=20"]),
            Run(fault="slow:load_target:80", until=_in_visit(TARGET_WAIT, 60.0)),
        ],
    ),
    Scenario(
        "target_load_slower",
        "An earlier run's weights loaded in ~4 s (DFLASH_FAULT=slow:load_target:3); this "
        "run's take 90 s (slow:load_target:90). Recorded 70 s into its wait.",
        [
            Run(fault="slow:load_target:3", overrides=["train.max_steps=20"]),
            Run(fault="slow:load_target:90", until=_in_visit(TARGET_WAIT, 70.0)),
        ],
    ),
    # A sleep shorter than a step on the shared CPU hides behind the other threads' work
    # (0.3 s did nothing): the faults below are 3 s a drafter step, and the rows every 5 steps
    # (log_every is not part of a run's shape) so the runs stay short.
    Scenario(
        "throughput_drop",
        "The demo config trained once for 20 steps; this run's drafter steps take 3 s longer "
        "from step 50 on (DFLASH_FAULT=slow_from:50:drafter:3), as when something else takes "
        "the devices mid-run; a metrics row every 5 steps; recorded at step 85.",
        [HISTORY, Run(fault="slow_from:50:drafter:3", overrides=LOG_5, until=_step(85))],
    ),
    Scenario(
        "below_earlier_runs",
        "The demo config trained twice for 20 steps; this run's drafter steps take 3 s longer "
        "from the start (DFLASH_FAULT=slow:drafter:3); a metrics row every 5 steps; recorded "
        "at step 45.",
        [HISTORY, HISTORY, Run(fault="slow:drafter:3", overrides=LOG_5, until=_step(45))],
    ),
    Scenario(
        "smaller_batch",
        "The demo config trained once for 20 steps; this run, healthy, with half the batch "
        "(train.batch_size=2: another shape, not comparable); a metrics row every 5 steps; "
        "recorded at step 100.",
        [HISTORY, Run(overrides=["train.batch_size=2", *LOG_5], until=_step(100))],
    ),
    Scenario(
        "buffered_bursts",
        "train.log written in 8 KB blocks (DFLASH_FAULT=buffer_log:8192), as `python "
        "train.py > train.log` without -u writes it: step lines come in bursts of ~45. "
        "Recorded after the first burst, once the next line is 70 s overdue (metrics.jsonl "
        "has its row); the monitor connects then, as `status` does, and reads the whole "
        "tail at once.",
        [
            Run(
                fault="buffer_log:8192",
                overrides=["train.max_steps=5000"],
                until=_lines_late(70),
                wait_s=900,
            )
        ],
    ),
    Scenario(
        "slow_compile",
        "An earlier run compiled in well under a second (CPU); this one is 90 s slower "
        "(DFLASH_FAULT=slow:compile:90), as with a cold or invalidated compile cache. "
        "Recorded 65 s into compiling.",
        [HISTORY, Run(fault="slow:compile:90", until=_in_visit("compiling", 65.0))],
    ),
]


# -- recording -----------------------------------------------------------------------------
class Monitor:
    """A link and a store, as a view has them; `events` is what the sink got, as JSON."""

    def __init__(self, target: Any, follow: str | None) -> None:
        self.store = Store(target.name)
        self.events: list[dict[str, Any]] = []
        self.link = Link(target, self.sink, follow=follow)

    def sink(self, event: SinkEvent) -> None:
        self.events.append(event_json(event))
        self.store.apply(event)

    async def until(self, ready: Ready, timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while not ready(self.store):
            if time.monotonic() > deadline:
                raise TimeoutError(f"{what}: not within {timeout:.0f} s")
            await asyncio.sleep(0.1)


def _ended(run_id: str) -> Ready:
    def ready(s: Store) -> bool:
        info = next((r for r in s.runs if r.run_id == run_id), None)
        return info is not None and not info.alive and info.exit is not None

    return ready


async def connect(target: Any, fault: str = "") -> Monitor:
    """A monitor whose agent (and so every trainer it launches) has DFLASH_FAULT=`fault`:
    a local agent's environment is the one it was started with."""
    os.environ["DFLASH_FAULT"] = fault
    try:
        m = Monitor(target, follow="latest")
        m.link.start()
        await m.link.wait_connected(60)
    finally:
        os.environ.pop("DFLASH_FAULT", None)
    return m


async def drive(target: Any, run: Run, name: str, config: Path) -> bool:
    """Launch one run and wait until it is ready; False when it died at start."""
    driver = await connect(target, run.fault)
    try:
        try:
            # Sent as is, not through control.launch: that refuses a bad override before it
            # is sent, and `died_before_start` records the trainer refusing one at start.
            text, config_name = control.read_config(config)
            launch = Launch(config_toml=text, overrides=[*BASE, *run.overrides], name=config_name)
            launched = decode(control.Launched, await driver.link.request(launch), "launch")
        except LinkError as e:  # a run that dies at start is answered with an error
            if not isinstance(e, BadInput) and "exited at start" not in str(e):
                raise
            return False
        ready = run.until or _ended(launched.run_id)
        try:
            await driver.until(ready, run.wait_s, f"{name}: run {launched.run_id}")
        except TimeoutError:  # never ready: stop the run, not leave it training for ever
            if driver.store.alive_run:
                await control.kill(driver.link, timeout_s=10, drain_timeout_s=1)
            raise
        return True
    finally:
        await driver.link.close()


async def record(sc: Scenario, workdir: Path, config: Path) -> list[dict[str, Any]]:
    target = resolve_target("local", remote_dir=str(workdir), python=sys.executable)
    first = await connect(target)
    await control.deploy(first.link)
    await first.link.close()
    for run in sc.runs:
        if not await drive(target, run, sc.name, config):
            break
    await asyncio.sleep(sc.wait_after_s)
    observer = await connect(target)
    try:
        await asyncio.sleep(sc.observe_s)
        events = [e for e in observer.events if e["type"] not in ("link", "rtt", "unreadable")]
        if observer.store.alive_run:
            await control.kill(observer.link, timeout_s=10, drain_timeout_s=1)
        return events
    finally:
        await observer.link.close()


# -- the edits: times and identities --------------------------------------------------------
class Normalise:
    def __init__(self, events: list[dict[str, Any]], workdir: Path) -> None:
        self.shift = NOW - max(float(e.get("t", 0.0)) for e in events)
        self.pids: dict[int, int] = {}
        self.text = [(str(workdir), "/workspace/dflash"), (sys.executable, "/usr/bin/python3")]
        # The host name as a whole word only: a host called "vm" must not turn nvml into
        # "ncpu-boxl".
        self.host = re.compile(rf"(?<![\w.-]){re.escape(socket.gethostname())}(?![\w.-])")

    def pid(self, p: Any) -> Any:
        if isinstance(p, bool) or not isinstance(p, int) or p <= 0:
            return p
        return self.pids.setdefault(p, 4000 + len(self.pids))

    def value(self, key: str, v: Any) -> Any:
        if isinstance(v, dict):
            return {k: self.value(k, x) for k, x in v.items()}
        if isinstance(v, list):
            if key == "pids":
                return [self.pid(p) for p in v]
            return [self.value(key, x) for x in v]
        if key in TIME_KEYS and isinstance(v, int | float) and not isinstance(v, bool) and v > 1e9:
            return v + self.shift
        if key in PID_KEYS:
            return self.pid(v)
        if isinstance(v, str):
            return self.string(key, v)
        return v

    def string(self, key: str, s: str) -> str:
        for old, new in self.text:
            s = s.replace(old, new)
        s = self.host.sub("cpu-box", s)
        if key == "text" and s.startswith("{"):  # a metrics.jsonl or telemetry.jsonl line
            try:
                data = json.loads(s)
            except ValueError:
                return s
            return json.dumps(self.value("", data), sort_keys=True)
        if key in ("text", "message", "traceback", "error"):
            s = re.sub(r"\bpid (\d+)", lambda m: f"pid {self.pid(int(m.group(1)))}", s)
        return s

    def event(self, e: dict[str, Any]) -> dict[str, Any]:
        out: dict[str, Any] = self.value("", e)
        return out


def _gpu_names() -> str:
    """ ", 1 NVIDIA H200" where NVML answers; "" on a machine without a GPU."""
    try:
        import pynvml

        pynvml.nvmlInit()
        n = pynvml.nvmlDeviceGetCount()
        names = {
            str(pynvml.nvmlDeviceGetName(pynvml.nvmlDeviceGetHandleByIndex(i))) for i in range(n)
        }
        return f", {n} {'/'.join(sorted(names))}" if n else ""
    except Exception:
        return ""


def write(
    sc: Scenario, events: list[dict[str, Any]], workdir: Path, config: Path, out: Path, name: str
) -> Path:
    norm = Normalise(events, workdir)
    faults = ", ".join(f"DFLASH_FAULT={r.fault}" for r in sc.runs if r.fault) or "no fault"
    header = [
        f"# {name}: {sc.about}",
        f"# Recorded {time.strftime('%Y-%m-%d')} by scripts/record-scenarios on a "
        f"{os.cpu_count()}-core {platform.machine()} "
        f"(Python {platform.python_version()}{_gpu_names()}): "
        f"{config.resolve().relative_to(ROOT)} through "
        f"dflash-tui deploy + launch, {len(sc.runs)} run(s), {faults}.",
        "# Then a fresh monitor connected; below is every event the agent sent it in "
        f"{sc.observe_s:.0f} s.",
        "# Edits: times shifted by one constant (last event at 1800000000); pids "
        "renumbered; host cpu-box; paths /workspace/dflash, /usr/bin/python3.",
    ]
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{name}.jsonl"
    lines = [json.dumps(norm.event(e), sort_keys=True) for e in events]
    path.write_text("\n".join(header + lines) + "\n")
    return path


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="scripts/record-scenarios", description=__doc__)
    p.add_argument("names", nargs="*", help="scenarios to record (default: all)")
    p.add_argument("--config", type=Path, default=TINY, help="trainer config (default tiny-cpu)")
    p.add_argument("--out", type=Path, default=OUT, help=f"folder (default {OUT})")
    p.add_argument("--suffix", default="", help="added to each file name, e.g. _h200")
    args = p.parse_args(argv)
    chosen = [s for s in SCENARIOS if not args.names or s.name in args.names]
    unknown = set(args.names) - {s.name for s in SCENARIOS}
    if unknown:
        print(f"record-scenarios: no scenario {sorted(unknown)}; known: "
              f"{', '.join(s.name for s in SCENARIOS)}", file=sys.stderr)  # fmt: skip
        return 2
    for sc in chosen:
        workdir = Path(tempfile.mkdtemp(prefix=f"dflash-{sc.name}-"))
        t0 = time.monotonic()
        try:
            events = asyncio.run(record(sc, workdir, args.config))
            name = sc.name + args.suffix
            path = write(sc, events, workdir, args.config, args.out, name)
        finally:
            shutil.rmtree(workdir, ignore_errors=True)
        print(f"{name}: {len(events)} events in {time.monotonic() - t0:.0f} s -> {path}",
              flush=True)  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())

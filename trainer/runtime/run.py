"""One training run, start to exit code, reporting through its run dir all the way.

starting -> loading_data -> loading_target -> compiling -> [loading_target] -> warmup
         -> training (<-> checkpointing) -> stopping -> checkpointing -> finished   exit 0
SIGTERM/SIGINT before the last step: ... -> stopping -> checkpointing -> stopped     exit 0
any failure, in any thread                                          -> crashed    exit 1
(bad input: 2). The phases are the contract's (trainer/contract/phases.py).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

import trainer
from trainer.config import Config, ConfigError, one_line
from trainer.contract.checkpoints import CHECKPOINTS, CheckpointPlan
from trainer.contract.codehash import code_hash
from trainer.contract.heartbeat import DataInfo, DeviceId, ErrorInfo, WandbInfo
from trainer.contract.phases import (
    CHECKPOINTING,
    CRASHED,
    FINISHED,
    LOADING_TARGET,
    STOPPED,
    STOPPING,
    WARMUP,
)
from trainer.data.samples import DataError
from trainer.evaluation.online import OnlineEval
from trainer.fsutil import atomic_write_json
from trainer.model.checkpoint import (
    CheckpointFailed,
    CheckpointWriter,
    Saved,
    TrainPosition,
    checkpoint_path,
    forecast_bytes,
    load_checkpoint,
    size,
)
from trainer.reporting.heartbeat import HeartbeatWriter, LiveFields
from trainer.reporting.memory import device_memory
from trainer.reporting.runstate import RunState
from trainer.reporting.steplog import RunLog
from trainer.runtime.compile.artifacts import load_shipped, save_after_warmup
from trainer.runtime.compile.cache import compile_cache_dir
from trainer.runtime.faults import FaultPlan
from trainer.runtime.retention import prune
from trainer.runtime.signals import SignalHandlers

if TYPE_CHECKING:
    from trainer.runtime.setup import RunSetup

EXIT_OK, EXIT_CRASH, EXIT_BAD_INPUT = 0, 1, 2
# A SIGTERM ends an eval between prompts; this bounds one that hangs.
FINAL_EVAL_WAIT_S = 600.0
BAD_INPUT = (ConfigError, DataError, ValueError, FileNotFoundError, PermissionError)


def restore(run: Any, checkpoint: Path) -> TrainPosition:
    return restore_state(run, load_checkpoint(checkpoint), checkpoint)


def restore_state(run: Any, data: dict[str, Any], checkpoint: Path | str) -> TrainPosition:
    """A checkpoint's contents (`load_checkpoint`'s dict) into the drafter and optimizer."""
    primary = run.replicas.primary
    result = primary.load_state_dict(data["model"], strict=False)
    if result.unexpected_keys:
        raise ValueError(f"checkpoint {checkpoint}: unexpected weights {result.unexpected_keys}")
    absent = set(primary.trainable_state_dict()) - set(data["model"])
    if absent:
        raise ValueError(f"checkpoint {checkpoint}: missing weights {sorted(absent)[:3]}")
    run.optimizer.load_state_dict(data["optimizer"])
    run.replicas.broadcast_params()
    return TrainPosition(**data["position"])


class Run:
    def __init__(self, cfg: Config, run_dir: Path, meta: dict[str, Any], echo: bool = True) -> None:
        """`echo`: step lines to stdout too (processes mode: the writer rank's only)."""
        self.cfg, self.run_dir, self.meta = cfg, run_dir, meta
        # The process's start on the monotonic clock: `python -m trainer` records its wall
        # time in meta["created"] before importing torch.
        self.process_started = time.monotonic() - max(
            0.0, time.time() - meta.get("created", time.time())
        )
        self.state = RunState(run_dir.name)
        self.faults = FaultPlan("")  # the real plan is read in _execute: bad input exits 2
        self.log = RunLog(run_dir, echo=echo)
        self.stop_request = threading.Event()
        self._stop_said = False  # _on_stop: the first stop request only
        self.pipeline: Any = None
        self.setup: Any = None
        self.graphs_after_warmup: int | None = None
        self._signal_takers: set[str] = set()  # libraries that took our signals (said once)
        self._devices: dict[str, DeviceId] | None = None
        self.checkpoints = CheckpointWriter(
            run_dir, self._on_checkpoint_saved, self._on_checkpoint_failed
        )
        self.hb_stop = threading.Event()
        self.heartbeat = HeartbeatWriter(
            run_dir,
            self.state,
            self.hb_stop,
            cfg.runtime.heartbeat_interval,
            code_sha256=code_hash(Path(trainer.__file__).parent),
            collect=self._live_fields,
        )

    # -- heartbeat fields that need the pipeline -------------------------------------
    def _live_fields(self) -> LiveFields:
        from trainer.runtime.warmup import graphs_compiled

        out = LiveFields()
        if self.pipeline is not None:
            out.queues = self.pipeline.queue_depths()
        if self.setup is not None:
            out.memory = device_memory(self.setup.devices)
            out.devices = self._device_ids()
            if self.graphs_after_warmup is not None:
                graphs = graphs_compiled()
                self.state.compile.graphs = graphs
                self.state.compile.recompiles = graphs - self.graphs_after_warmup
        return out

    def _device_ids(self) -> dict[str, DeviceId]:
        """Each CUDA device's UUID, so the monitor can match it to NVML's physical index
        whatever CUDA_VISIBLE_DEVICES did to the numbering."""
        if self._devices is None:
            ids: dict[str, DeviceId] = {}
            for dev in self.setup.devices:
                if dev.type == "cuda":
                    props = torch.cuda.get_device_properties(dev)
                    uuid = str(getattr(props, "uuid", ""))
                    ids[str(dev)] = DeviceId(
                        uuid=uuid if uuid.startswith("GPU-") or not uuid else f"GPU-{uuid}",
                        name=props.name,
                    )
                else:
                    ids[str(dev)] = DeviceId(uuid=None, name="cpu")
            self._devices = ids
        return self._devices

    def _on_stop(self, signame: str) -> None:
        # Called on the signals thread (trainer/runtime/signals.py), once per pass of a storm
        # of SIGTERMs: the first one is said, the rest would only repeat it.
        if self._stop_said:
            return
        self._stop_said = True
        self.stop_request.set()
        if self.pipeline is not None:
            self.pipeline.stop_request.set()
        self.log.line(f"{signame}: finishing the current step, then checkpoint and exit")

    def _on_signals_taken(self, taken: dict[str, str]) -> None:
        """Said once per library: a library that keeps taking them would flood the log."""
        for lib in sorted(set(taken.values()) - self._signal_takers):
            sigs = ", ".join(sorted(s for s, by in taken.items() if by == lib))
            self.log.line(
                f"signals: {sigs} taken over at the C level by {lib} (a native library's "
                "sigaction; SIGUSR1 stack dumps would be lost): ours put back"
            )
        self._signal_takers |= set(taken.values())

    def _on_dump(self, path: Path) -> None:
        self.log.line(f"SIGUSR1: thread stacks written to {path.name}")

    def _report_data(self, setup: RunSetup) -> None:
        """One line on what a batch is made of, and the same in the heartbeat."""
        from trainer.data.packing import planned_padding

        rep, data = setup.data_report, self.cfg.data
        padding = planned_padding(
            setup.samples, data.seq_buckets, self.cfg.train.batch_size, data.packing
        )
        layout = "packed" if data.packing else "one sample per row"
        self.log.line(
            f"data: {rep.samples:,} samples, {setup.batches_per_epoch:,} batches per epoch"
            f" ({layout}), {padding:.1%} padding; {rep.truncated:,} samples truncated"
            f" ({rep.truncated_tokens:,} tokens)"
        )

    def _update_config_json(self, **run_fields: Any) -> None:
        self.meta.update(run_fields)
        atomic_write_json(self.run_dir / "config.json", {**self.cfg.to_dict(), "run": self.meta})

    def _preflight(self, target_path: Path, device: str, keep_layers: int) -> None:
        """Which fast kernels the target needs and the path it will take, and the
        environment, into the heartbeat and config.json before the weights load."""
        from trainer.contract.typed import encode
        from trainer.targets.preflight import environment, run_preflight

        state = self.state.thread_state
        state("preflight")
        pf = run_preflight(target_path, device, keep_layers, note=state)
        self.state.preflight = pf
        env = environment(pf)
        self._update_config_json(environment=encode(env), preflight=encode(pf))
        if pf.error or pf.slow() or device.startswith("cuda"):
            self.log.line(f"preflight: {pf.summary() or pf.error} ({pf.seconds:.2f}s)")
        state("setting up")

    def save(self, position: TrainPosition, loss: float | None = None) -> Path:
        """Snapshot the drafter and optimizer for the writer thread; returns the path the
        checkpoint will have. Training waits only for the copy to host memory."""
        s = self.setup
        self.faults.stall_checkpoint()
        self.checkpoints.save(
            position,
            s.replicas.primary.trainable_state_dict(),
            s.optimizer.state_dict(),
            s.arch.to_dict(),
            self.cfg.to_dict(),
            loss,
        )
        return checkpoint_path(self.run_dir, position.step)

    def _on_checkpoint_saved(self, saved: Saved) -> None:
        """From the writer thread, once the file and its sidecar are on disk."""
        m = saved.meta
        rel = f"{CHECKPOINTS}/{m.file}"
        self.state.checkpoint_saved(m.step, rel)
        bad = m.why_not_good()
        self.log.line(
            f"checkpoint {rel}: {size(m.bytes)} in {m.seconds:.1f}s (training waited "
            f"{saved.snapshot_s:.1f}s)" + (f"; NOT GOOD: {bad}, a restart skips it" if bad else "")
        )
        try:
            removed = prune(self.run_dir, self.cfg.train.keep_checkpoints, self.cfg.eval.every)
        except OSError as e:  # a file that will not go: the run and its checkpoints go on
            self.log.line(f"checkpoints: pruning failed: {e.strerror or e} ({e.filename})")
            return
        if removed:
            self.log.line(
                f"checkpoints: removed {', '.join(removed)} (train.keep_checkpoints = "
                f"{self.cfg.train.keep_checkpoints}; the best held-out τ's and the resume "
                "point kept)"
            )

    def _on_checkpoint_failed(self, failed: CheckpointFailed) -> None:
        """From the writer thread: no part of it is on disk, the previous one stays the
        resume point, and the run goes on (the operator frees disk; the next save retries)."""
        self.state.checkpoint_failed(failed.step, failed.message)
        last = self.state.last_checkpoint
        self.log.line(
            f"checkpoint failed: {failed.message} (step {failed.step}; "
            + (f"the resume point stays step {last.step})" if last else "no checkpoint yet)")
        )

    def _publish_checkpoint_plan(self, setup: RunSetup) -> None:
        """The forecast size of a checkpoint, before the first is written: the heartbeat
        carries it (disk_short) and the log says it beside the run dir's free disk."""
        trainable = setup.replicas.primary.trainable_state_dict().values()
        each = forecast_bytes(trainable, setup.arch.to_dict(), self.cfg.to_dict())
        train = self.cfg.train
        self.state.checkpoint_plan(
            CheckpointPlan(each, train.checkpoint_every, train.keep_checkpoints)
        )
        try:
            st = os.statvfs(self.run_dir)
            free = f"; {size(st.f_bavail * st.f_frsize)} free under the run dir"
        except OSError:
            free = ""
        self.log.line(f"checkpoints: about {size(each)} each (forecast){free}")

    def _final_checkpoint(self, position: TrainPosition, loss: float | None, stopped: bool) -> None:
        """The last step's checkpoint, and the line that says how the run ended. A final
        save that failed ends the run all the same (stopped or finished, exit 0): the
        previous checkpoint is where a restart continues."""
        self.state.set_phase(CHECKPOINTING)
        path = self.save(position, loss)
        self.checkpoints.wait()
        word = "stopped" if stopped else "finished"
        at = f"{word} at step {position.step} of {self.state.total_steps}"
        failed = self.checkpoints.failed
        if failed is None or failed.step != position.step:
            self.log.line(f"{at}; checkpoint {path.relative_to(self.run_dir)}")
            return
        last = self.state.last_checkpoint
        resumes = f"resumes from step {last.step}" if last else "no checkpoint of its own"
        self.log.line(f"{at}; final checkpoint failed: {failed.message}; {resumes}")

    # -- the run ---------------------------------------------------------------------
    def execute(self, checkpoint: Path | None) -> int:
        self.state.register_thread("main", "cpu")
        self.state.thread_state("setting up")
        handlers = SignalHandlers(self.run_dir, self._on_stop, self.state.roles, self._on_dump)
        handlers.install()
        handlers.start_guard(self._on_signals_taken)
        self.heartbeat.write()
        self.heartbeat.start()
        code = EXIT_CRASH
        wandb = None
        try:
            code, wandb = self._execute(checkpoint)
            self.checkpoints.wait()  # the last checkpoint is on disk before the run says so
        except BAD_INPUT as e:
            self.state.fail(e)
            self.log.line(f"error: {one_line(str(e))}")
            print(f"error: {one_line(str(e))}", file=sys.stderr, flush=True)
            code = EXIT_BAD_INPUT
        except BaseException as e:
            self.state.fail(e)
            self.log.line("error: the run crashed:\n" + "".join(traceback.format_exception(e)))
            code = EXIT_CRASH
        finally:
            if code != EXIT_OK:
                with contextlib.suppress(BaseException):  # keep what a crash left whole
                    self.checkpoints.wait()
                self.state.set_phase(CRASHED)
                self._after_crash(code)
            self.state.exit_code = code
            self.state.thread_state("exiting")
            self.hb_stop.set()
            self.heartbeat.write(final=True)
            handlers.ignore_stops()
            if wandb is not None:
                wandb.finish(exit_code=code)
            self.log.close()
        if code == EXIT_CRASH and self.pipeline is not None and self.pipeline.alive_threads():
            # A thread stuck in C code would hang interpreter shutdown: leave now.
            sys.stderr.write(f"stuck threads: {self.pipeline.alive_threads()}\n")
            sys.stderr.flush()
            os._exit(code)
        return code

    def _after_crash(self, code: int) -> None:
        """Before the final heartbeat of a run that did not end well (processes mode: find
        the rank that failed first, trainer/distributed/run.py)."""

    def _on_data(self, info: DataInfo) -> None:
        from trainer.data.tokenized import summary

        self.state.data_loaded(info)
        self.log.line(summary(info))

    def _on_recompile(self, message: str) -> None:
        """A graph compiled after warm-up: say which and why, in the log and heartbeat."""
        from trainer.runtime.warmup import recompile_summary

        summary = recompile_summary(message)
        self.state.compile.last_recompile = summary
        self.log.line(f"recompile: {summary}")

    def _set_up(
        self, checkpoint: Path | None, batches_per_step: int | None = None
    ) -> tuple[RunSetup, TrainPosition, Any]:
        """What both modes do before their warm-up: the fault plan, everything `build_run`
        makes, the data and start-up lines, the resumed position, wandb. Returns the setup,
        the position to start from and the wandb handle. `batches_per_step`: processes
        mode's job-wide drafter count (a rank holds one replica)."""
        from trainer.reporting.wandb_log import start_wandb
        from trainer.runtime.setup import StartupLaps, build_run

        self.faults = faults = FaultPlan()  # a bad DFLASH_FAULT: bad input, before any loading
        if faults.log_buffer_bytes:
            self.log.buffer_in_blocks(faults.log_buffer_bytes)
        laps = StartupLaps()
        laps.laps.append(("imports", laps.t - self.process_started))
        self.setup = setup = build_run(
            self.cfg,
            warn=self.log.warn,
            phase=self.state.set_phase,
            progress=self.state.progress,
            load_span=(self.state.target_load_started, self.state.target_load_ended),
            faults=faults,
            preflight=self._preflight,
            on_data=self._on_data,
            laps=laps,
            batches_per_step=batches_per_step,
            **self._build_options(),
        )
        self.state.total_steps = setup.total_steps
        self._publish_checkpoint_plan(setup)
        self._report_data(setup)
        if setup.warm_start:
            self.log.line(setup.warm_start)
        if setup.held_out:
            self.log.line(
                f"held out {len(setup.held_out)} samples (by id) for evaluation: never trained on"
            )
        position = self._resume(setup, checkpoint)
        if checkpoint is not None or position.step:  # (a rank resumed by its writer: none)
            laps("checkpoint")
        self.log.line(laps.line())
        self.state.record_step(position.step, position.tokens, 0.0)
        self.state.last_step_at = None

        wandb = start_wandb(
            self.cfg.runtime.wandb_mode,
            self.cfg.runtime.wandb_project,
            self.wandb_dir,
            self.wandb_dir.name,
            self.cfg.to_dict(),
            self.log.line,
        )
        self.state.wandb = WandbInfo(**wandb.info)
        self._update_config_json(wandb=wandb.info)
        return setup, position, wandb

    @property
    def wandb_dir(self) -> Path:
        return self.run_dir

    def _build_options(self) -> dict[str, Any]:
        """More `build_run` keywords (processes mode: what a rank's role needs built)."""
        return {}

    def _resume(self, setup: RunSetup, checkpoint: Path | None) -> TrainPosition:
        if checkpoint is None:
            return TrainPosition(step=0, batches=0, tokens=0)
        position = restore(setup, checkpoint)
        self.log.line(f"resumed from {checkpoint} at step {position.step}{position.retrain_note()}")
        return position

    def _execute(self, checkpoint: Path | None) -> tuple[int, Any]:
        from trainer.runtime.pipeline import Pipeline
        from trainer.runtime.warmup import (
            compile_breakdown,
            compile_cache_counts,
            graphs_compiled,
            warm_up,
            warm_up_targets,
            watch_recompiles,
        )

        setup, position, wandb = self._set_up(checkpoint)
        faults = self.faults
        comp = self.state.compile
        comp.cache_dir = os.environ.get("TORCHINDUCTOR_CACHE_DIR", "")
        cache_root = compile_cache_dir(self.cfg)
        first_drafter = setup.drafter_devices[0]
        load_shipped(cache_root / "artifacts", first_drafter, self.log.line)
        warmup_s = warm_up(
            setup, self.state, self.heartbeat.process.code_sha256, extra_s=faults.slow_s("compile")
        )
        self.graphs_after_warmup = graphs_compiled()
        counts = compile_cache_counts()
        comp.warmup_s, comp.graphs = warmup_s, self.graphs_after_warmup
        comp.breakdown = compile_breakdown()
        comp.cache_hits, comp.cache_misses = counts["cache_hits"], counts["cache_misses"]
        comp.cache_bypasses = counts["cache_bypasses"]
        if comp.graphs:  # something compiled: keep it for a fresh host (pull-cache, deploy)
            save_after_warmup(cache_root, first_drafter, self.log.line, new=comp.cache_misses > 0)
        if setup.loader is not None and setup.loader.is_alive():
            self.state.set_phase(LOADING_TARGET)  # compiled first: now wait for the weights
        setup.finish_loading()
        fp8 = next(iter(setup.targets.values())).fp8 if setup.targets else None
        if fp8 is not None:  # target.dtype = "fp8": what went FP8, for whoever reads the log
            self.log.line(fp8.line())
        target_s = warm_up_targets(setup)  # target.compile: its graphs, before any thread
        if target_s:
            self.graphs_after_warmup = comp.graphs = graphs_compiled()
            self.log.line(f"warm-up: the target's compiled layers in {target_s:.1f}s")
        watch_recompiles(self._on_recompile)
        self.log.line(
            f"warm-up: {len(self.cfg.data.seq_buckets)} bucket(s) in {warmup_s:.1f}s, "
            f"{graphs_compiled()} graph(s) compiled; compile cache {comp.cache_hits} hit(s), "
            f"{comp.cache_misses} miss(es)"
        )
        if self.stop_request.is_set():
            self.state.set_phase(STOPPING)
            self.state.set_phase(STOPPED)
            return EXIT_OK, wandb

        self.state.set_phase(WARMUP)
        evaluator = None
        if self.cfg.eval.every or (self.cfg.eval.final and setup.held_out):
            evaluator = OnlineEval(
                setup, self.state, self.log.line, self.run_dir, self.stop_request
            )
            evaluator.start()
        self.pipeline = pipe = Pipeline(
            setup, self.state, self.log, position, self.save, wandb.log, faults, evaluator
        )
        if self.stop_request.is_set():
            pipe.stop_request.set()
        self.state.thread_state("supervising")
        pipe.start()
        outcome = pipe.wait()
        if outcome == "crashed":
            err = self.state.error or ErrorInfo("?", "no error recorded")
            self.log.line(f"error in {err.thread}: {err.traceback.rstrip()}")
            print(f"error: {err.message} (in {err.thread})", file=sys.stderr)
            return EXIT_CRASH, wandb
        self.state.set_phase(STOPPING)
        if evaluator is not None:  # the last step's eval, if one is under way
            self.state.thread_state("waiting for the last step's eval")
            evaluator.close(timeout=FINAL_EVAL_WAIT_S)
            final = evaluator.take_result()
            if final is not None:
                wandb.log({"eval": dataclasses.asdict(final)}, pipe.position.step)
        stopped = outcome == "stopped"
        self._final_checkpoint(pipe.position, pipe.recent_loss(), stopped)
        self.state.set_phase(STOPPED if stopped else FINISHED)
        return EXIT_OK, wandb


def set_threads_for_cpu(cfg: Config, ranks: int | None = None) -> None:
    """On CPU, every role's thread would start its own full-size OpenMP team: share the
    cores instead of oversubscribing them. `ranks`: processes mode, one process per role
    on this machine, each with its share of the cores."""
    roles = len(cfg.runtime.targets) + len(cfg.runtime.drafters)
    if all(d == "cpu" for d in [*cfg.runtime.targets, *cfg.runtime.drafters]):
        share = ranks if ranks is not None else max(1, roles // 2)
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // share))


def run_training(cfg: Config, run_dir: Path, meta: dict[str, Any], checkpoint: Path | None) -> int:
    started = time.time()
    meta.setdefault("created", started)
    set_threads_for_cpu(cfg)
    return Run(cfg, run_dir, meta).execute(checkpoint)

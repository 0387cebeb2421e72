"""processes mode: one rank's life, from torchrun's environment to its exit code.

The same run as threads mode (trainer/runtime/run.py: phases, heartbeat, logs, signals, the crash
path), with a rank's pipeline (trainer/distributed/pipeline.py) in place of the threaded one. The
writer rank (the lowest drafter rank) makes the job's run dir and writes the job's files
into it; every rank writes heartbeat-rank{R}.json beside them, and the others keep their
own train.log and heartbeat under ranks/rank-{R}/.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import socket
import sys
import time
from pathlib import Path
from typing import Any

from trainer.config import Config, ConfigError, one_line
from trainer.contract.heartbeat import ErrorInfo, Heartbeat
from trainer.contract.phases import FINISHED, STOPPED, STOPPING, WARMUP
from trainer.contract.ranks import RANK_SCHEMA_VERSION, RankHeartbeat, rank_heartbeat_name
from trainer.distributed.eval_rank import (
    EvalLink,
    EvalRank,
    RemoteEval,
    check_eval_layout,
    eval_wanted,
    rank_eval_config,
)
from trainer.distributed.launcher_watch import watch_launcher
from trainer.distributed.layout import Job, RankLayout, layout_from_env, rank_config, rank_dir
from trainer.distributed.rank_relay import RankCollector, RankSender, relay_group, senders
from trainer.distributed.routing import check_routing
from trainer.fsutil import atomic_write_json
from trainer.runtime.run import (
    EXIT_BAD_INPUT,
    EXIT_CRASH,
    EXIT_OK,
    FINAL_EVAL_WAIT_S,
    Run,
    set_threads_for_cpu,
)


class RankRun(Run):
    def __init__(
        self,
        cfg: Config,
        job_dir: Path,
        meta: dict[str, Any],
        layout: RankLayout,
        job: Job,
        job_cfg: Config,
        relay: Any = None,
    ) -> None:
        """`cfg`: this rank's (its one device); `job_cfg`: the job's, as config.json has it;
        `relay`: the rank relay's group (rank_relay.py), None for a job on one host."""
        super().__init__(cfg, rank_dir(job_dir, layout), meta, echo=layout.node_lead)
        self.job_dir, self.layout, self.job, self.job_cfg = job_dir, layout, job, job_cfg
        self.state.run_id = self.heartbeat.process.run_id = job_dir.name
        self.heartbeat.also = self._write_rank_heartbeat
        self._own_error: ErrorInfo | None = None
        self.failed_rank: int | None = None
        # The other hosts' ranks: sent to the writer, kept in its heartbeat.json's `ranks`.
        self._sender: RankSender | None = None
        self._collector: RankCollector | None = None
        if relay is not None and layout.writer:
            self._collector = RankCollector(layout, relay)
            self._collector.start()
            self.heartbeat.before = self._take_relayed_ranks
        elif relay is not None and layout.rank in senders(layout):
            self._sender = RankSender(layout, relay)
            self._sender.start()

    def _take_relayed_ranks(self, final: bool) -> None:
        assert self._collector is not None
        got = self._collector.wait_final() if final else self._collector.ranks()
        self.heartbeat.process.ranks = got

    # -- the rank's heartbeat ------------------------------------------------------------
    def _write_rank_heartbeat(self, beat: Heartbeat, final: bool) -> None:
        pipe, lay = self.pipeline, self.layout
        # Its loop thread (the target's or the drafter's: the role's own thread) and its
        # stage medians, and the rank's own rate: what the straggler rules compare.
        loop = next((t for t in beat.threads if t.role == lay.role), None)
        tok_s, batches_s = pipe.own_rate.rates() if pipe is not None else (0.0, 0.0)
        rank_beat = RankHeartbeat(
            schema=RANK_SCHEMA_VERSION,
            run_id=self.job_dir.name,
            rank=lay.rank,
            world_size=lay.world_size,
            role=lay.role,
            index=lay.index,
            device=self.cfg.runtime.targets[0],
            pid=os.getpid(),
            host=socket.gethostname(),
            now=beat.now,
            phase=beat.phase,
            step=pipe.rank_step if pipe is not None else beat.step,
            writer=lay.node_lead,
            queues=beat.queues,
            error=self._own_error or beat.error,
            exit_code=beat.exit_code,
            failed_rank=self.failed_rank,
            tok_s=tok_s,
            batches_s=batches_s,
            loop=loop.name if loop is not None else "",
            stages_ms=dict(loop.stages_ms) if loop is not None else {},
        )
        path = self.job_dir / rank_heartbeat_name(lay.rank)
        data = rank_beat.to_json()
        atomic_write_json(path, data, durable=False)
        if self._sender is not None:
            self._sender.offer(data, final)

    def _after_crash(self, code: int) -> None:
        """Say this rank's failure at once (the others look for it), then find the rank
        that failed first and name it: in this rank's heartbeat, and on the writer in the
        job's heartbeat.json and train.log."""
        from trainer.distributed.blame import find_failed_rank

        if self.failed_rank is not None:  # found already (_a_rank_failed)
            return
        self._own_error = self.state.error
        self.heartbeat.write()  # crashed, with its error: what the others read
        blame = find_failed_rank(
            self.job_dir, self.layout.world_size, self.layout.rank, self._own_error
        )
        if blame is None:
            self.log.line("error: no rank's own failure found (a peer lost, cause unknown)")
            return
        self.failed_rank = blame.rank
        self.log.line(f"error: {blame.why}")
        if blame.rank != self.layout.rank:
            own = self._own_error
            self.state.error = ErrorInfo(
                thread=f"rank {blame.rank}",
                message=f"{blame.why} (so rank {self.layout.rank} stopped)",
                traceback=own.traceback if own is not None else "",
            )
        self.heartbeat.process.failed_rank = blame.rank

    def _a_rank_failed(self) -> bool:
        """A stop can be torchrun's, sent to every rank because one failed: then this rank
        stopped cleanly but the job did not. Named as a crash, with the rank at fault."""
        from trainer.distributed.blame import find_failed_rank

        lay = self.layout
        blame = find_failed_rank(self.job_dir, lay.world_size, lay.rank, None, wait_s=1.0)
        if blame is None:
            return False
        self.failed_rank = blame.rank
        self.heartbeat.process.failed_rank = blame.rank
        self.log.line(f"error: {blame.why} (so {lay.name} stopped)")
        self.state.error = ErrorInfo(
            thread=f"rank {blame.rank}", message=f"{blame.why} (so {lay.name} stopped)"
        )
        return True

    # -- the run -------------------------------------------------------------------------
    def save(self, position: Any, loss: float | None = None) -> Path:
        if not self.layout.writer:  # one copy of the drafter: the writer's
            return self.run_dir / "no-checkpoint"
        return super().save(position, loss)

    def _update_config_json(self, **run_fields: Any) -> None:
        if self.layout.writer:  # the job's config.json is the writer's, with the job's config
            self.meta.update(run_fields)
            config = {**self.job_cfg.to_dict(), "run": self.meta}
            atomic_write_json(self.run_dir / "config.json", config)

    @property
    def wandb_dir(self) -> Path:
        return self.job_dir

    def _build_options(self) -> dict[str, Any]:
        # A drafter rank reads features from the wire: the target's layers would only take
        # its GPU's memory (~50 GB of a 27B target) and its start-up's time.
        return {"run_target": self.layout.role == "target"}

    def _resume(self, setup: Any, checkpoint: Path | None) -> Any:
        from trainer.distributed.resume import resume_from_writer

        position = resume_from_writer(setup, checkpoint, self.layout, self.job)
        if position.step or checkpoint is not None:
            where = checkpoint if checkpoint is not None else "the writer rank's checkpoint"
            self.log.line(f"resumed from {where} at step {position.step}{position.retrain_note()}")
        return position

    def _execute(self, checkpoint: Path | None) -> tuple[int, Any]:
        from trainer.distributed.pipeline import DrafterRankPipeline, TargetRankPipeline
        from trainer.runtime.warmup import warm_up, warm_up_targets

        lay = self.layout
        setup, position, wandb = self._set_up(checkpoint, batches_per_step=lay.drafters)
        faults = self.faults
        self.log.line(f"{lay.name} of {lay.world_size}, {self.job.backend}")
        # Held-out τ: on target 0's rank, the writer's weights sent to it (eval_rank.py).
        link = EvalLink(self.job, lay) if eval_wanted(self.job_cfg) else None
        if lay.role == "drafter":  # a target rank's drafter is never trained
            warm_up(setup, self.state, self.heartbeat.process.code_sha256)
        setup.finish_loading()
        if lay.role == "target":
            warm_up_targets(setup)  # target.compile: its graphs, before the rank's threads
        evaluator, eval_here = self._start_eval(link, setup)
        self.state.set_phase(WARMUP)
        self.state.thread_state("waiting for every rank")
        self.job.barrier()  # no rank's transfers wait out another's start-up
        kind = TargetRankPipeline if lay.role == "target" else DrafterRankPipeline
        self.pipeline = pipe = kind(
            setup,
            self.state,
            self.log,
            position,
            self.save,
            wandb.log,
            faults,
            evaluator,
            layout=lay,
            job=self.job,
        )
        if self.stop_request.is_set():
            pipe.stop_request.set()
        self.state.thread_state("supervising")
        pipe.start()
        outcome = pipe.wait()
        if outcome == "crashed":
            err = self.state.error or ErrorInfo("?", "no error recorded")
            self.log.line(f"error in {err.thread}: {err.traceback.rstrip()}")
            print(f"error: {lay.name}: {err.message} (in {err.thread})", file=sys.stderr)
            return EXIT_CRASH, wandb
        stopped = outcome == "stopped"
        if stopped and self._a_rank_failed():
            return EXIT_CRASH, wandb
        self.state.set_phase(STOPPING)
        self._finish_eval(evaluator, eval_here, wandb, pipe.position.step)
        if lay.writer:
            self._final_checkpoint(pipe.position, pipe.recent_loss(), stopped)
        self.state.set_phase(STOPPED if stopped else FINISHED)
        return EXIT_OK, wandb

    def _start_eval(self, link: EvalLink | None, setup: Any) -> tuple[Any, EvalRank | None]:
        """The writer's end of the eval (the evaluator its pipeline offers each step to),
        or the eval rank's (decoding beside its target thread); neither on other ranks."""
        if link is None:
            return None, None
        if self.layout.writer:
            remote = RemoteEval(link, setup, self.state, self.log.line)
            remote.start()
            return remote, None
        if self.layout.rank == link.evaluator:
            here = EvalRank(link, setup, self.state, self.log.line, self.job_dir, self.stop_request)
            here.start()
            return None, here
        return None, None

    def _finish_eval(self, evaluator: Any, here: EvalRank | None, wandb: Any, step: int) -> None:
        """The last step's eval: the writer waits for its answer (as threads mode does) and
        then ends the eval rank's loop; the eval rank stays until then."""
        if evaluator is not None:
            self.state.thread_state("waiting for the last step's eval")
            evaluator.close(timeout=FINAL_EVAL_WAIT_S)
            final = evaluator.take_result()
            if final is not None:
                wandb.log({"eval": dataclasses.asdict(final)}, step)
        if here is not None:
            self.state.thread_state("waiting for the writer's last eval")
            here.join(timeout=FINAL_EVAL_WAIT_S + 60.0)


def node_run_dir(
    args: argparse.Namespace, cfg: Config, layout: RankLayout, run_id: str, job_meta: dict[str, Any]
) -> Path:
    """The run dir of a host other than the writer's: the launcher's `--run-dir` (the same
    run id on every host: `dflash-tui launch GROUP`), else `<run root>/<run id>`. Its lead
    writes config.json (the job's, with this node's place), so the host's monitor sees a
    processes-mode run from the first second."""
    run_dir: Path = args.run_dir if args.run_dir is not None else args.run_root / run_id
    where = f"--run-dir {run_dir}"
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ConfigError(f"{where}: cannot create it ({e.strerror or e})") from None
    if layout.node_lead:
        if (run_dir / "config.json").exists():
            raise ConfigError(f"{where}: already holds a run (run dirs are never reused)")
        node_meta = {
            **job_meta,
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "argv": sys.argv,
            "node": layout.node,
        }
        atomic_write_json(run_dir / "config.json", {**cfg.to_dict(), "run": node_meta})
    return run_dir


def main_processes(args: argparse.Namespace, cfg: Config, meta: dict[str, Any]) -> int:
    """`python -m trainer` as one rank of a torchrun job: exit 0, 1 (crashed) or 2 (bad
    input: said once, by the writer, or by rank 0 before any rendezvous)."""
    # Before any thread starts: the first optimizer imports torch._dynamo, which imports
    # torch.distributed.fsdp; a thread of this rank importing torch.distributed meanwhile
    # met the half-initialised package (ImportError, once in a loaded CI-like run).
    import torch._dynamo
    import torch.distributed.fsdp  # noqa: F401

    from trainer.distributed.replica_sync import check_reduce_setting
    from trainer.runtime.run_dir import prepare_run_dir

    started = time.time()
    try:
        layout = layout_from_env(cfg)
        check_routing(layout)  # before the rendezvous: no rank waits for a refused job
        check_reduce_setting(cfg, layout)
        check_eval_layout(cfg)  # an eval this layout cannot run: before any rendezvous
    except ConfigError as e:
        rank = os.environ.get("RANK", "0")
        if rank in ("", "0"):  # one line for the job, not one per rank
            print(f"error: {one_line(str(e))}", file=sys.stderr)
        return EXIT_BAD_INPUT
    job = Job(cfg, layout)
    relay = relay_group(layout)  # every rank, in the same order: a group is made by all

    def make_run_dir() -> tuple[str, dict[str, Any]]:
        run_dir = prepare_run_dir(args.run_root, args.run_dir, cfg.name)
        job_meta = {
            **meta,
            "run_id": run_dir.name,
            "created": started,
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "argv": sys.argv,
            "ranks": {
                "world_size": layout.world_size,
                "targets": layout.targets,
                "drafters": layout.drafters,
                "writer": layout.writer_rank,
                "backend": job.backend,
            },
        }
        atomic_write_json(run_dir / "config.json", {**cfg.to_dict(), "run": job_meta})
        return str(run_dir), job_meta

    try:
        shared_dir, job_meta = job.share(make_run_dir)
        run_dir = Path(shared_dir)
        if layout.node != 0:  # another host: its own run dir, with the job's run id
            run_dir = node_run_dir(args, cfg, layout, run_dir.name, job_meta)
    except ConfigError as e:
        if layout.writer or (layout.node_lead and layout.node != 0):
            print(f"error: {one_line(str(e))}", file=sys.stderr)
        return EXIT_BAD_INPUT
    if layout.node_lead:
        print(f"run dir: {run_dir}", flush=True)
    mine = rank_config(cfg, layout)
    rank_eval_config(mine, cfg, layout)
    set_threads_for_cpu(mine, ranks=layout.per_node)
    # The writer's meta is the job's (config.json's "run"); the others' only their own.
    meta = job_meta if layout.writer else {**meta, "created": started, "rank": layout.rank}
    # Only the writer reads a checkpoint; the others are sent it (trainer/distributed/resume.py).
    checkpoint = Path(meta["checkpoint"]) if layout.writer and meta.get("checkpoint") else None
    run = RankRun(mine, run_dir, meta, layout, job, cfg, relay)
    watch_launcher(run._on_stop)  # no orphan rank: trainer/distributed/launcher_watch.py
    code = run.execute(checkpoint)
    # Leave without tearing the process group down: a peer that already left (or one that
    # will never answer) must not hold this rank's exit; everything is on disk by now.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)

"""Held-out acceptance length during training: the eval thread.

Every `eval.every` optimizer steps (and at the last step of a run that finishes), the
drafter of that step decodes the held-out prompts speculatively, as a server would
(trainer/evaluation/speculative.py): it proposes a block, the whole target verifies greedily. τ, the
tokens per verify step, is what the drafter is worth when served. The prompts decode as one
batch, its step a CUDA graph on a GPU (trainer/evaluation/decoding.py; a hybrid target's one
at a time): the decoder is built once and kept for every eval of the run, and whether its
graph works goes to the heartbeat (`graphs["eval"]`).

The training never waits for it:
  - the drafter's weights are copied, on the training thread's own stream, into the eval
    thread's drafter (the target's dtype) only while no eval runs; an eval due while the
    last one still runs is skipped and counted (`EvalInfo.skipped`);
  - the eval thread verifies with the target training already holds (trainer/targets/whole.py:
    the same tensors, plus the layers training drops), on the first target's device, on a
    CUDA stream of its own;
  - a failure (out of memory, say) is recorded in the heartbeat and train.log; training
    goes on, and the next eval tries again.

With `eval.tree_nodes`, each eval then decodes the same prompts again with a DDTree draft tree
of that many nodes (trainer/evaluation/tree.py): its τ goes beside the chain's.

Each result goes to `eval/step-N.json` (the format `python -m trainer eval` writes, which
`export` quotes), the heartbeat (`EvalInfo`), the next metrics.jsonl row and wandb, and one
line in train.log.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from trainer.config import one_line
from trainer.contract.evaluation import HISTORY, EvalInfo, EvalPoint, EvalResult
from trainer.evaluation.acceptance import write_eval
from trainer.evaluation.decoding import HeldOutDecode
from trainer.evaluation.tree import describe_tree, held_out_tree
from trainer.model.drafter import DFlashDrafter
from trainer.targets.answers import prompt_of
from trainer.targets.load import resolve_dtype

ROLE = "eval"


class _Abandoned(Exception):
    """The run is stopping: an eval under way is left unfinished."""


@dataclasses.dataclass
class _Job:
    step: int
    train_acc: float | None
    ready: Any  # torch.cuda.Event | None: the weights' copy has finished


class EvalHandoff:
    """The eval's side of what the training pipeline calls after a step (`offer` is each
    kind's own): its lock and condition, the finished result for the next metrics row, and
    the thread that ends at `close`. Threads mode's OnlineEval; processes mode's writer end,
    trainer/distributed/eval_rank.py's RemoteEval."""

    def __init__(self, run: Callable[[], None], name: str) -> None:
        self._lock = threading.Lock()
        self._idle = threading.Condition(self._lock)
        self._result: EvalResult | None = None  # for the next metrics row
        self._closed = False
        self._thread = threading.Thread(target=run, name=name, daemon=True)

    # Each kind sets these: its EvalInfo, its log, whether an eval runs, its publish.
    info: EvalInfo
    log: Callable[[str], None]
    _busy: bool

    def _publish_locked(self) -> None:
        raise NotImplementedError

    def _skipped(self, step: int, ready: bool) -> bool:
        """Under the lock, in `offer`: an eval still runs (or the eval end is not `ready`),
        so step `step`'s is skipped, counted and said; True then."""
        if ready and not self._busy:
            return False
        self.info.skipped += 1
        busy = self.info.running_step
        self.log(f"eval: step {step} skipped (the eval of step {busy} is still running)")
        self._publish_locked()
        return True

    def _started(self, step: int, t0: float) -> None:
        """Under the lock, in `offer`: step `step`'s weights are handed over (since `t0`)."""
        self.info.running_step = step
        self.info.snapshot_s += time.monotonic() - t0
        self._idle.notify_all()
        self._publish_locked()

    def take_result(self) -> EvalResult | None:
        """The result finished since the last call (the metrics row carries it)."""
        with self._lock:
            out, self._result = self._result, None
            return out

    def close(self, timeout: float) -> None:
        """Let an eval under way finish (at most `timeout` s), then end the thread."""
        with self._lock:
            self._closed = True
            self._idle.notify_all()
        self._thread.join(timeout)


class OnlineEval(EvalHandoff):
    def __init__(
        self,
        setup: Any,  # RunSetup (after finish_loading)
        state: Any,  # RunState: the heartbeat's eval field, and this thread's name and state
        log: Callable[[str], None],
        run_dir: Path,
        stop: threading.Event,
    ) -> None:
        cfg = setup.cfg
        self.setup, self.state, self.log, self.run_dir = setup, state, log, run_dir
        self.every = cfg.eval.every
        self.new_tokens = cfg.eval.new_tokens
        self.final = cfg.eval.final
        self.cuda_graphs = cfg.eval.cuda_graphs
        self.tree_nodes = cfg.eval.tree_nodes
        self.stream_priority = -1 if cfg.eval.stream_priority == "high" else 0
        self.device: torch.device = setup.target_devices[0]
        self.dtype = resolve_dtype(cfg.target.dtype, self.device)
        prompts = (prompt_of(s, cfg.eval.prompt_len) for s in setup.held_out)
        self.prompts = [p for p in prompts if p][: cfg.eval.prompts]
        self.stop = stop  # the run is ending: leave between prompts
        self.info = EvalInfo(
            every=self.every,
            held_out=len(setup.held_out),
            prompts=len(self.prompts),
            new_tokens=self.new_tokens,
            device=str(self.device),
            tree_nodes=self.tree_nodes,
        )
        super().__init__(self._run, "eval-0")
        self._busy = True  # until the thread has built its target and drafter
        self._job: _Job | None = None
        self._drafter: DFlashDrafter | None = None
        self._pairs: list[tuple[torch.Tensor, torch.Tensor]] = []

    # -- on the training thread ----------------------------------------------------------
    def start(self) -> None:
        self._publish()
        if not self.prompts:
            self.info.error = "no held-out sample has a prompt to decode from"
            self.log(f"eval: off: {self.info.error}")
            self._publish()
            return
        self._thread.start()

    def due(self, step: int, last: bool) -> bool:
        return bool(self.prompts) and (
            (self.every > 0 and step % self.every == 0) or (last and self.final)
        )

    def offer(self, step: int, primary: DFlashDrafter, train_acc: float | None, wait: bool) -> None:
        """On drafter 0's thread, right after optimizer step `step`: copy the weights into
        the eval's drafter and start an eval, unless one runs (then skip it, or with `wait`,
        the run's last step, wait for it first)."""
        with self._lock:
            if wait:  # the last step: training is over, the eval before it may finish
                while self._busy and self._thread.is_alive() and not self.stop.is_set():
                    self._idle.wait(0.1)
            t0 = time.monotonic()
            if not self._thread.is_alive():
                return  # it never started, or could not build its target: said once, then
            if self._skipped(step, ready=self._drafter is not None):
                return
            ready = self._copy_weights(primary)
            self._busy = True
            self._job = _Job(step, train_acc, ready)
            self._started(step, t0)

    @torch.no_grad()
    def _copy_weights(self, primary: DFlashDrafter) -> Any:
        if not self._pairs:
            assert self._drafter is not None
            mine = dict(self._drafter.named_parameters())
            self._pairs = [
                (mine[name], p) for name, p in primary.named_parameters() if p.requires_grad
            ]
        for dst, src in self._pairs:
            dst.copy_(src, non_blocking=True)
        if self.device.type != "cuda" and all(s.device.type != "cuda" for _, s in self._pairs):
            return None
        event = torch.cuda.Event()
        event.record()  # on this (training) thread's current stream, after the copies
        return event

    def wait_idle(self) -> bool:
        """Block until no eval runs (or its thread has ended); True while it can take one.
        Processes mode's eval rank (trainer/distributed/eval_rank.py) answers the writer then."""
        with self._lock:
            while self._busy and self._thread.is_alive():
                self._idle.wait(0.1)
            return self._thread.is_alive() and not self._busy

    # -- on the eval thread --------------------------------------------------------------
    def _run(self) -> None:
        from trainer.targets.whole import whole_target

        # The lowest CPU priority (Linux schedules threads apart): on a host whose cores the
        # training threads keep busy, the eval takes what they leave. Measured on the CPU
        # demo (bench/eval_cost.py): 10 % slower training at the default priority.
        with contextlib.suppress(OSError, AttributeError):
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)
        self.state.register_thread(ROLE, str(self.device))
        self.state.thread_state("building the verifying target")
        # "high" (the default): its small kernels (a 16-token verify, a drafter block) start
        # as SMs free up rather than queueing behind training's; at the default priority,
        # before the decode was batched and graphed, one eval beside the 8B config's training
        # had not finished after 150 s on the H200. "low": the default stream priority.
        stream = (
            torch.cuda.Stream(self.device, priority=self.stream_priority)
            if self.device.type == "cuda"
            else None
        )
        with torch.cuda.stream(stream) if stream is not None else contextlib.nullcontext():
            try:
                loaded = self.setup.targets[self.device]
                model = whole_target(loaded, self.dtype, self.device)
                primary = self.setup.replicas.primary
                drafter = DFlashDrafter(primary.arch, loaded.embed_weight, loaded.lm_head_weight)
                drafter = drafter.to(device=self.device, dtype=self.dtype).eval()
                decode = HeldOutDecode(
                    model, drafter, self.prompts, self.new_tokens, self.cuda_graphs, self.log
                )
                self._publish_graphs(decode)
            except Exception as e:
                with self._lock:
                    self.info.error = f"cannot build the verifying target: {one_line(str(e))}"
                    self.log(f"eval: off: {self.info.error}")
                    self._publish_locked()
                return
            with self._lock:
                self._drafter, self._busy = drafter, False
                self._idle.notify_all()
            while True:
                self.state.thread_state("waiting for a step to evaluate")
                with self._lock:
                    while self._job is None and not self._closed:
                        self._idle.wait()
                    if self._job is None:
                        self.state.thread_state("done")
                        return
                    job = self._job
                self.state.thread_state(f"evaluating step {job.step}")
                try:
                    if job.ready is not None:
                        torch.cuda.current_stream(self.device).wait_event(job.ready)
                    result, summary = self._evaluate(decode, job)
                except _Abandoned:
                    self.log(f"eval: step {job.step} left unfinished: the run is stopping")
                except Exception as e:
                    with self._lock:
                        self.info.error = f"step {job.step}: {one_line(str(e))}"
                        self.log(f"eval: failed at step {job.step}: {self.info.error}")
                else:
                    self._record(result, summary)
                finally:
                    if stream is not None:  # the next copy of the weights must not race it
                        stream.synchronize()
                    self._publish_graphs(decode)
                    with self._lock:
                        self._job, self._busy = None, False
                        self.info.running_step = None
                        self._idle.notify_all()
                        self._publish_locked()

    def _evaluate(self, decode: HeldOutDecode, job: _Job) -> tuple[EvalResult, dict[str, Any]]:
        t0 = time.monotonic()
        if self.stop.is_set():
            raise _Abandoned
        stats = decode.run(cancel=self.stop.is_set).total()
        if self.stop.is_set():
            raise _Abandoned
        s = stats.summary()
        tree: dict[str, Any] = {}
        if self.tree_nodes:
            tree = held_out_tree(
                decode.model, decode.layer_ids, decode.drafter, self.prompts, self.new_tokens,
                self.tree_nodes, cancel=self.stop.is_set,
            )  # fmt: skip
            if self.stop.is_set():
                raise _Abandoned
            s["tree"] = tree
        result = EvalResult(
            step=job.step,
            tau=s["tau"],
            per_position=s["per_position"],
            verify_steps=s["verify_steps"],
            tokens=s["tokens"],
            prompts=len(self.prompts),
            tok_s=s["tok_s"],
            seconds=round(time.monotonic() - t0, 3),
            at=time.time(),
            train_acc=job.train_acc,
            tree_nodes=self.tree_nodes,
            tree_tau=tree.get("tau"),
            tree_seconds=tree.get("seconds"),
            tree_not_measured=tree.get("not_measured"),
        )
        return result, s

    def _record(self, r: EvalResult, summary: dict[str, Any]) -> None:
        write_eval(self.run_dir, self.run_dir.name, r.step, True, r.prompts, self.new_tokens,
                   str(self.device), summary, r.seconds, during_training=True)  # fmt: skip
        tau = f"{r.tau:.2f}" if r.tau is not None else "-"
        shares = " ".join(f"{x:.2f}" for x in r.per_position[:4])
        with self._lock:
            info = self.info
            best = info.best()
            info.last = r
            point = EvalPoint(r.step, r.tau, r.train_acc, r.tree_tau)
            info.history = [*info.history, point][-HISTORY:]
            info.seconds += r.seconds
            info.error = None
            self._result = r
            was = f"; best before: {best.tau:.2f} at step {best.step}" if best else ""
            self.log(
                f"eval: step {r.step}: held-out τ {tau} of {self.setup.arch.block_size} over "
                f"{r.prompts} prompts × {self.new_tokens} tokens (accepted by position "
                f"{shares} …); {r.tok_s} tok/s, {r.seconds:.1f}s{was}"
                f"{describe_tree(summary.get('tree'))}"
            )

    def _publish_graphs(self, decode: HeldOutDecode) -> None:
        self.state.set_graphs(ROLE, copy.deepcopy(decode.graphs))

    def _publish(self) -> None:
        with self._lock:
            self._publish_locked()

    def _publish_locked(self) -> None:
        self.state.set_eval(copy.deepcopy(self.info))

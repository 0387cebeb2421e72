"""The threaded pipeline: prefetch -> target (one thread per target) -> drafter (one per replica).

Two routings (runtime.routing), both with one optimizer step = one batch per replica, a
barrier between steps, and gradients averaged weighted by each batch's real tokens
(trainer/model/replicas.py):

"fixed": routing by the global batch number g (counted from this run's start, g0):
  - target t = (g - g0) % T forwards it, drafter replica r = (g - g0) % D trains on it,
  - optimizer step s trains batches g0 + (s - s0)*D + r, r = 0..D-1,
  - each target has its own `q_pre[t]`, each (target, drafter) pair its own bounded FIFO
    `q_hs[t][r]`.
  So every replica sees the same batches whatever the thread timing: runs are reproducible
  and a resume continues the same trajectory. It cannot deadlock: the smallest batch not
  yet trained has all its predecessors consumed, so its target and prefetch thread are free
  to produce it. But one slow target stalls every replica that waits for its batches.

"shared": one `q_pre` feeds every target and one `q_hs` feeds every replica: an idle target
  takes the next built batch, an idle replica the next forwarded one, so a slow target or
  replica holds no batch hostage. Step s trains whichever D batches the replicas took. The
  data position is the lowest batch index not yet trained (`TrainPosition.batches`); the
  batches trained beyond it (`ahead`: those trained while an older one was still in flight,
  usually a few; a target hung on a batch makes it grow) are trained again by a resume,
  which says how many. It cannot deadlock either: prefetch builds every batch of the run
  and blocks only on a full q_pre, which the targets drain; a target claims a batch only
  while some are still to come (`_next_for_target`), so every claim is met by a batch
  prefetch will build, and it blocks only on a full q_hs, which the replicas drain; a
  replica waits on an empty q_hs only while a batch is still due to it (batches built =
  batches trained = steps × D), and that batch is upstream, in a thread that is not
  waiting on the replicas. A replica at the step barrier holds no queue room.

Any exception in any thread sets `abort`: every queue wait and the step barrier give up
within ~0.1 s, the traceback goes into the run state (and the heartbeat), and the main
thread reports the crash.
"""

from __future__ import annotations

import contextlib
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

import torch
from torch import Tensor

from trainer.contract.heartbeat import (
    SAVING_CHECKPOINT,
    STAGE_BACKWARD,
    STAGE_BUILD,
    STAGE_CHECKPOINT,
    STAGE_FORWARD,
    STAGE_MASK,
    STAGE_OPTIMIZER,
    STAGE_TRANSFER,
    STAGE_WAIT_HS,
    STAGE_WAIT_PRE,
    STAGE_WAIT_REPLICAS,
    WAIT_HS_EMPTY,
    WAIT_HS_FULL,
    WAIT_PRE_EMPTY,
    WAIT_PRE_FULL,
    WAIT_REPLICAS,
    QueueDepth,
    Queues,
)
from trainer.contract.phases import CHECKPOINTING, TRAINING
from trainer.contract.records import MetricsRow
from trainer.data.packing import collate_packs, epoch_pack_batches
from trainer.data.samples import collate, epoch_batches, pick_bucket
from trainer.evaluation.online import OnlineEval
from trainer.model.checkpoint import TrainPosition
from trainer.model.drafter import DFlashDrafter
from trainer.model.loss import STAT_NAMES, LossOutput
from trainer.model.optim import clip_in_step, lr_at, noise_at, set_lr
from trainer.model.step import BlockBatch, attach_mask, batch_seed, drafter_loss, prepare_blocks
from trainer.reporting.memory import device_memory
from trainer.reporting.profile_window import ProfileWindow
from trainer.reporting.runstate import RunState
from trainer.reporting.stages import StageClock
from trainer.reporting.steplog import RunLog
from trainer.runtime.faults import FaultPlan
from trainer.runtime.setup import RunSetup
from trainer.runtime.transfer import hand_over, send, wait_ready

_POLL_S = 0.1  # how often a blocked thread looks up to see whether the run is ending


class Aborted(Exception):
    """Raised inside a worker when the run is ending for a reason found elsewhere."""


@dataclass
class FeatureItem:
    g: int
    blocks: BlockBatch  # on the drafter's device
    features: Tensor  # on the drafter's device
    ready: Any  # torch.cuda.Event | None: the copy to the drafter device has finished


def autocast_for(device: torch.device) -> Any:
    # bf16 compute with fp32 master weights on GPU; plain fp32 on CPU.
    if device.type == "cuda":
        return torch.autocast("cuda", dtype=torch.bfloat16)
    return contextlib.nullcontext()


class Pipeline:
    def __init__(
        self,
        run: RunSetup,
        state: RunState,
        log: RunLog,
        position: TrainPosition,
        save_checkpoint: Callable[[TrainPosition, float | None], object],
        on_metrics: Callable[[dict[str, Any], int], None] = lambda _m, _s: None,
        faults: FaultPlan | None = None,
        evaluator: OnlineEval | None = None,
    ) -> None:
        self.run, self.state, self.log = run, state, log
        self.evaluator = evaluator  # held-out τ every eval.every steps (evaluation/online.py)
        self.cfg = run.cfg
        self.save_checkpoint, self.on_metrics = save_checkpoint, on_metrics
        self.faults = faults or FaultPlan()
        self.T, self.D = len(run.target_devices), len(run.drafter_devices)
        rt = self.cfg.runtime
        self.P = rt.prefetch_threads or self.T
        self.shared = rt.routing == "shared"
        # shared: one queue each, with the room the T (and T×D) private queues had in all.
        n_pre = 1 if self.shared else self.T
        pre_room = rt.q_pre_size * (self.T if self.shared else 1)
        self.q_pre: list[queue.Queue[BlockBatch]] = [
            queue.Queue(maxsize=pre_room) for _ in range(n_pre)
        ]
        self.q_hs: list[list[queue.Queue[FeatureItem]]] = [
            [queue.Queue(maxsize=rt.q_hs_size) for _ in range(self.D)]
            for _ in range(0 if self.shared else self.T)
        ]
        self.q_hs_shared: queue.Queue[FeatureItem] = queue.Queue(
            maxsize=rt.q_hs_size * self.T * self.D
        )
        # shared: where a target puts its features, when every replica is on one device
        # (one GPU, or the CPU); else each replica copies its batch over itself.
        drafter_devs = set(run.drafter_devices)
        self._shared_dst = next(iter(drafter_devs)) if len(drafter_devs) == 1 else None
        self.position = TrainPosition(**position.__dict__)
        self.position.ahead = 0  # a resume starts at the lowest untrained batch
        self.s0, self.g0 = position.step, position.batches
        self.g_end = self.g0 + (run.total_steps - self.s0) * self.D
        self._to_claim = self.g_end - self.g0  # shared: batches no target has taken yet
        self._claim_lock = threading.Lock()
        self.out_g: dict[int, int] = {}  # replica -> the batch it trained this step
        self._trained_ahead: set[int] = set()  # shared: trained batches above the position
        self.abort = threading.Event()  # a thread failed
        self.shutdown = threading.Event()  # the drafters are done: everyone leaves
        self.stop_request = threading.Event()  # SIGTERM: finish this step, then stop
        self.stopped_early = False
        self.barrier = threading.Barrier(self.D)
        self.outs: list[LossOutput | None] = [None] * self.D
        self.out_tokens = [0] * self.D
        self.out_slots = [0] * self.D  # batch positions, padding included
        self._slots = 0
        self._finish = False
        self._orders: dict[int, list[list[list[int]]]] = {}
        self._orders_lock = threading.Lock()
        self._target_batches = 0
        self._target_n: dict[int, int] = {}  # fixed: batches each target thread has taken
        self._count_lock = threading.Lock()
        self._window = _Window(self)
        self._last_loss: float | None = None
        self._last_acc: float | None = None
        self._lr = 0.0  # the lr the last optimizer step applied (faults included)
        self.threads: list[threading.Thread] = []
        self.drafter_threads: list[threading.Thread] = []
        # DFLASH_PROFILE=START:STEPS: a profiler trace of those steps in the run dir.
        self.profile = ProfileWindow.from_env(log.train_log_path.parent, log.line)

    # -- queue helpers that give up when the run ends ----------------------------------
    def _ending(self) -> bool:
        return self.abort.is_set() or self.shutdown.is_set()

    def _get(self, q: queue.Queue[Any], state: str) -> Any:
        self.state.thread_state(state)
        while True:
            try:
                return q.get(timeout=_POLL_S)
            except queue.Empty:
                if self._ending():
                    raise Aborted from None

    def _put(self, q: queue.Queue[Any], item: Any, state: str) -> None:
        self.state.thread_state(state)
        while True:
            try:
                q.put(item, timeout=_POLL_S)
                return
            except queue.Full:
                if self._ending():
                    raise Aborted from None

    def _barrier_wait(self) -> None:
        """No timeout: a Barrier breaks for everyone when one waiter times out, so a long
        optimizer step or checkpoint on replica 0 would crash the run. A failing thread
        aborts the barrier instead (`_spawn`), which is what ends this wait early."""
        self.state.thread_state(WAIT_REPLICAS)
        try:
            self.barrier.wait()
        except threading.BrokenBarrierError:
            if self._ending():
                raise Aborted from None
            raise

    # -- data order ----------------------------------------------------------------------
    def _epoch_order(self, epoch: int) -> list[list[list[int]]]:
        """The epoch's batches, each a list of rows of sample indices (one sample per row
        unless packing)."""
        with self._orders_lock:
            if epoch not in self._orders:
                c = self.cfg
                args = (self.run.samples, c.data.seq_buckets, c.train.batch_size, c.train.seed)
                if c.data.packing:
                    order = epoch_pack_batches(*args, epoch, shuffle=c.data.shuffle)
                else:
                    plain = epoch_batches(*args, epoch, shuffle=c.data.shuffle)
                    order = [[[i] for i in batch] for batch in plain]
                self._orders[epoch] = order
                # Prefetch threads straddle at most two epochs; older orders are done.
                for old in [e for e in self._orders if e < epoch - 1]:
                    del self._orders[old]
            return self._orders[epoch]

    def make_batch(self, g: int) -> BlockBatch:
        per_epoch = self.run.batches_per_epoch
        epoch, index = divmod(g, per_epoch)
        rows = self._epoch_order(epoch)[index]
        samples = self.run.samples
        longest = max(sum(len(samples[i].input_ids) for i in row) for row in rows)
        bucket = pick_bucket(longest, self.cfg.data.seq_buckets)
        pad_id = self.run.tokenizer.pad_token_id or 0
        if self.cfg.data.packing:
            batch = collate_packs(samples, rows, bucket, pad_id, index)
        else:
            batch = collate(samples, [row[0] for row in rows], bucket, pad_id, index)
        blocks = prepare_blocks(batch, self.cfg.train.num_anchors, self.cfg.train.seed, epoch)
        return blocks

    # -- thread bodies -------------------------------------------------------------------
    def _target_device(self, t: int) -> torch.device:
        return self.run.target_devices[t]

    def _target_of(self, g: int) -> int:
        """The target that forwards batch g (processes mode: trainer/distributed/routing.py)."""
        return (g - self.g0) % self.T

    def _prefetch_targets(self, p: int) -> set[int]:
        """The targets prefetch thread `p` builds batches for."""
        return {t for t in range(self.T) if t % self.P == p}

    def _prefetch(self, p: int) -> None:
        mine = self._prefetch_targets(p)
        pin = any(self._target_device(t).type == "cuda" for t in mine)
        n = 0
        clock = self.state.stage_clock("cpu")
        for g in range(self.g0, self.g_end):
            t = self._target_of(g)
            if self.shared:  # one q_pre: prefetch thread p builds every P-th batch
                if (g - self.g0) % self.P != p:
                    continue
                t = 0
            elif t not in mine:
                continue
            clock.lap()
            self.state.thread_state("building batch")
            with clock.work(STAGE_BUILD):
                # Inside the stage: DFLASH_FAULT=slow:prefetch:S is a slow build, as timed.
                self.faults.check("prefetch", n, p)
                blocks = self.make_batch(g)
                if pin:
                    blocks = _pin(blocks)
            with clock.wait(STAGE_WAIT_PRE):
                self._put(self.q_pre[t], blocks, WAIT_PRE_FULL)
            n += 1
        self.state.thread_state("done")

    def _target(self, t: int) -> None:
        dev = self.run.target_devices[t]
        side = None
        if dev.type == "cuda" and self.cfg.runtime.target_stream:
            side = torch.cuda.Stream(dev)
        with torch.cuda.stream(side) if side is not None else contextlib.nullcontext():
            self._target_loop(t, dev, side)
        self.state.thread_state("done")

    def _target_loop(self, t: int, dev: torch.device, side: torch.cuda.Stream | None) -> None:
        features_of = self.run.targets[dev].features
        clock = self.state.stage_clock(str(dev))
        n = 0
        while True:
            clock.lap()
            with clock.wait(STAGE_WAIT_PRE):
                got = self._next_for_target(t)
            if got is None:
                return
            g, blocks = got
            self.state.thread_state("forward")
            with clock.work(STAGE_FORWARD):
                self.faults.check("target", n, t)  # inside: a slowed target's forward is slow
                # A packed row's document boundaries for varlen, from the host's copy.
                docs = features_of.packed_docs(blocks.batch.position_ids, dev)
                on_dev = blocks.to(dev, non_blocking=True)
                b = on_dev.batch
                if b.position_ids is None:
                    features = features_of(b.input_ids)
                else:  # packed: the target keeps the documents apart
                    features = features_of(b.input_ids, b.position_ids, docs)
            r = (g - self.g0) % self.D
            dst = (self._shared_dst or dev) if self.shared else self.run.drafter_devices[r]
            self.state.thread_state("copy to drafter")
            with clock.work(STAGE_TRANSFER):
                moved, ready = send([features], dst)
                blocks_dst = on_dev.to(dst, non_blocking=True)
            self.state.thread_state("building mask")
            with clock.work(STAGE_MASK):
                attach_mask(blocks_dst, self.run.settings.backend, self.run.settings.block_size)
            item = FeatureItem(g=g, blocks=blocks_dst, features=moved[0], ready=ready)
            if side is not None and dst == dev:
                item.ready = hand_over((item.blocks, item.features), side, dst)
            elif self.shared and self._shared_dst is None and dev.type == "cuda":
                # Left here for the replica that takes it (`_pull`): when it was made.
                item.ready = _made_on(torch.cuda.current_stream(dev))
            with self._count_lock:
                self._target_batches += 1
            queue_hs = self.q_hs_shared if self.shared else self.q_hs[t][r]
            with clock.wait(STAGE_WAIT_HS):
                self._put(queue_hs, item, WAIT_HS_FULL)
            n += 1

    def _next_for_target(self, t: int) -> tuple[int, BlockBatch] | None:
        """The next batch for target t and its number g, or None when it has no more:
        fixed, every T-th batch from its own q_pre; shared, whatever the one q_pre holds
        next, once it has claimed one of the batches still to come."""
        if not self.shared:
            done = self._target_n.get(t, 0)
            g = self.g0 + t + done * self.T
            if g >= self.g_end:
                return None
            self._target_n[t] = done + 1
            return g, self._get(self.q_pre[t], WAIT_PRE_EMPTY)
        with self._claim_lock:
            if self._to_claim <= 0:
                return None
            self._to_claim -= 1
        blocks: BlockBatch = self._get(self.q_pre[0], WAIT_PRE_EMPTY)
        return blocks.epoch * self.run.batches_per_epoch + blocks.batch.index, blocks

    def _drafter(self, r: int) -> None:
        run, cfg = self.run, self.cfg
        dev, model = self._replica(r)
        model.train()
        clock = self.state.stage_clock(str(dev))
        for n, s in enumerate(range(self.s0, run.total_steps)):
            clock.lap()
            g = self.g0 + (s - self.s0) * self.D + r
            t = self._target_of(g)
            with clock.wait(STAGE_WAIT_HS):
                if self.shared:
                    item: FeatureItem = self._get(self.q_hs_shared, WAIT_HS_EMPTY)
                else:
                    item = self._get(self.q_hs[t][r], WAIT_HS_EMPTY)
                    assert item.g == g, f"drafter {r} expected batch {g}, got {item.g}"
                if item.features.device == dev:
                    wait_ready(item.ready, dev)
            if item.features.device != dev:  # shared, replicas on several devices
                with clock.work(STAGE_TRANSFER):
                    item = self._pull(item, dev)
            g = item.g
            self.state.thread_state("forward")
            noise = noise_at(s, run.total_steps, cfg.train)
            gen = None
            if noise > 0:
                gen = torch.Generator(dev).manual_seed(batch_seed(cfg.train.seed + 1, 0, g))
            with clock.work(STAGE_FORWARD), autocast_for(dev):
                self.faults.check("drafter", n, r)  # inside: a slowed drafter's forward is slow
                out = self._loss(model, item, noise, gen)
            if self.faults.poison_loss(s):  # DFLASH_FAULT=nan:N, as a diverged run does
                out.loss = out.loss * float("nan")
            self._before_backward(item.blocks.tokens, clock)
            self.state.thread_state("backward")
            with clock.work(STAGE_BACKWARD):
                # DFLASH_FAULT=grad_spike: the gradients of this step scaled, the logged
                # loss not (it is the loss trained on; only the backward sees the factor).
                scale = self.faults.loss_scale(s)
                (out.loss * scale if scale != 1.0 else out.loss).backward()
            self.outs[r] = out
            self.out_g[r] = g
            self.out_tokens[r] = item.blocks.tokens
            self.out_slots[r] = item.blocks.batch.input_ids.numel()
            del item, out
            self._end_of_step(r, s, clock)
            if self._finish:
                break
        self.state.thread_state("done")

    def _pull(self, item: FeatureItem, dev: torch.device) -> FeatureItem:
        """shared routing with replicas on several GPUs: the target left its batch on its
        own device; the replica copies it over, after the target's stream made it, and
        waits for the copy before the source can be freed (the target's allocator does not
        know this stream reads it)."""
        stream = torch.cuda.current_stream(dev)
        if item.ready is not None:
            stream.wait_event(item.ready)
        blocks = item.blocks.to(dev, non_blocking=True)
        features = item.features.to(dev, non_blocking=True)
        attach_mask(blocks, self.run.settings.backend, self.run.settings.block_size)
        _made_on(stream).synchronize()
        return FeatureItem(g=item.g, blocks=blocks, features=features, ready=None)

    def _replica(self, r: int) -> tuple[torch.device, DFlashDrafter]:
        """Replica r's device and model (processes mode: this rank's one replica)."""
        return self.run.drafter_devices[r], self.run.replicas.models[r]

    def _loss(
        self, model: DFlashDrafter, item: FeatureItem, noise: float, gen: torch.Generator | None
    ) -> LossOutput:
        """The drafter's forward and loss on one batch (processes mode: through DDP)."""
        return drafter_loss(model, item.blocks, item.features, self.run.settings, noise, gen)

    def _before_backward(self, tokens: int, clock: StageClock) -> None:
        """Nothing here: the replicas meet at the step's barrier (processes mode: the drafter
        ranks' token sum, which the gradients' reduce divides by)."""

    def _end_of_step(self, r: int, s: int, clock: StageClock) -> None:
        """Every replica's backward is done: replica 0 steps while the others wait."""
        with clock.wait(STAGE_WAIT_REPLICAS):
            self._barrier_wait()
        if r == 0:
            self._optimizer_step(s, clock)
        with clock.wait(STAGE_WAIT_REPLICAS):
            self._barrier_wait()

    def _average_grads(self) -> None:
        self.run.replicas.average_grads(self.out_tokens)

    def _sync_params(self) -> None:
        self.run.replicas.broadcast_params()

    def _stop_now(self) -> bool:
        """Whether this step is the last one asked for (SIGTERM)."""
        return self.stop_request.is_set()

    def _optimizer_step(self, s: int, clock: StageClock) -> None:
        """On replica 0's thread while the others wait at the barrier."""
        run, cfg = self.run, self.cfg
        self.state.thread_state("optimizer step")
        replicas = run.replicas
        with clock.work(STAGE_OPTIMIZER):
            self._average_grads()
            # The total norm before clipping, a 0-d tensor on the device: kept, not read
            # (no sync); the window reads it with the loss when a row is due.
            params = list(replicas.primary.parameters())
            grad_norm: Tensor | None
            if cfg.train.grad_clip > 0:  # a fused AdamW clips inside its step (optim.py)
                grad_norm = clip_in_step(run.optimizer, params, cfg.train.grad_clip)
            else:
                grads = [q.grad for q in params if q.grad is not None]
                grad_norm = torch.nn.utils.get_total_norm(grads) if grads else None
            # DFLASH_FAULT=diverge / zero_lr act here, on the lr the optimizer really uses.
            self._lr = lr_at(s, run.total_steps, cfg.train) * self.faults.lr_factor(s)
            set_lr(run.optimizer, self._lr)
            run.optimizer.step()
            self._sync_params()
            replicas.zero_grads()

        tokens, slots = sum(self.out_tokens), sum(self.out_slots)
        p = self.position
        p.step, p.tokens = s + 1, p.tokens + tokens
        if self.shared:
            self._advance_position(list(self.out_g.values()))
        else:
            p.batches += self.D
        self._slots += slots
        epoch = p.batches / max(1, run.batches_per_epoch)
        self.state.record_step(p.step, p.tokens, epoch, self._slots)
        if self.profile is not None:
            self.profile.after_step(p.step)
        if p.step == self.s0 + 1:
            self.state.set_phase(TRAINING)
        done = [(o, t) for o, t in zip(self.outs, self.out_tokens, strict=True) if o is not None]
        self._window.add(done, slots, grad_norm)
        self.outs = [None] * self.D
        last = p.step >= run.total_steps
        if p.step % cfg.train.log_every == 0 or last:
            self._log_step()
        if cfg.train.checkpoint_every and p.step % cfg.train.checkpoint_every == 0 and not last:
            self.state.set_phase(CHECKPOINTING)
            self.state.thread_state(SAVING_CHECKPOINT)
            with clock.work(STAGE_CHECKPOINT):
                self.save_checkpoint(self.position, self.recent_loss())
            self.state.set_phase(TRAINING)
        ev = self.evaluator
        if ev is not None and ev.due(p.step, last):
            # A copy of the weights on this stream, or nothing if an eval still runs; the
            # last step's eval waits for the one before it (the run is over anyway).
            ev.offer(p.step, replicas.primary, self._last_acc, wait=last)
        if self._stop_now() and not last:
            self.stopped_early = True
            self._finish = True
        self.faults.after_step(p.step)  # DFLASH_FAULT=sigkill:N

    def _advance_position(self, trained: list[int]) -> None:
        """shared: the position is the lowest batch not yet trained; `ahead` counts those
        trained beyond it, which a resume from this position trains again."""
        p = self.position
        self._trained_ahead.update(trained)
        while p.batches in self._trained_ahead:
            self._trained_ahead.discard(p.batches)
            p.batches += 1
        p.ahead = len(self._trained_ahead)

    def recent_loss(self) -> float | None:
        """The mean loss of the steps since the last step line (else that line's): what a
        checkpoint's sidecar records. Reads the device once; only checkpoints ask."""
        w = self._window
        if w.loss is not None and w.steps:
            return float(w.loss) / w.steps
        return self._last_loss

    def _log_step(self) -> None:
        row = self._window.record()
        self._last_loss, self._last_acc = row.loss, row.acc
        self.log.record(row)
        self.on_metrics(row.to_json(), row.step)
        self._window = _Window(self)

    # -- lifecycle -----------------------------------------------------------------------
    def queue_depths(self) -> Queues:
        rt = self.cfg.runtime
        if self.shared:
            hs = self.q_hs_shared
            return Queues(
                q_pre=[QueueDepth(self.q_pre[0].qsize(), self.q_pre[0].maxsize)],
                q_hs=[QueueDepth(hs.qsize(), hs.maxsize)],
                routing="shared",
            )
        return Queues(
            q_pre=[QueueDepth(q.qsize(), rt.q_pre_size) for q in self.q_pre],
            q_hs=[
                QueueDepth(
                    sum(self.q_hs[t][r].qsize() for t in range(self.T)), rt.q_hs_size * self.T
                )
                for r in range(self.D)
            ],
        )

    def _spawn(self, name: str, role: str, device: str, fn: Callable[[], None]) -> threading.Thread:
        def body() -> None:
            self.state.register_thread(role, device)
            try:
                fn()
            except Aborted:
                self.state.thread_state("aborted")
            except BaseException as e:
                self.state.fail(e)
                self.abort.set()
                self.barrier.abort()
                self.state.thread_state("failed")

        th = threading.Thread(target=body, name=name, daemon=True)
        self.threads.append(th)
        return th

    def start(self) -> None:
        for p in range(self.P):
            self._spawn(f"prefetch-{p}", "prefetch", "cpu", partial(self._prefetch, p))
        for t, dev in enumerate(self.run.target_devices):
            self._spawn(f"target-{t}", "target", str(dev), partial(self._target, t))
        for r, dev in enumerate(self.run.drafter_devices):
            th = self._spawn(f"drafter-{r}", "drafter", str(dev), partial(self._drafter, r))
            self.drafter_threads.append(th)
        for th in self.threads:
            th.start()

    def wait(self) -> str:
        """Supervise until the drafters finish or a thread fails: "done", "stopped" or
        "crashed". Waits in short slices so the main thread's signal handlers run."""
        while True:
            if self.abort.wait(0.2):
                break
            self.faults.supervise(self.position.step)
            if not any(th.is_alive() for th in self.drafter_threads):
                break
        self.shutdown.set()
        deadline = time.monotonic() + 10.0
        for th in self.threads:
            th.join(timeout=max(0.0, deadline - time.monotonic()))
        if self.abort.is_set():
            return "crashed"
        return "stopped" if self.stopped_early else "done"

    def alive_threads(self) -> list[str]:
        return [th.name for th in self.threads if th.is_alive()]


def _made_on(stream: torch.cuda.Stream) -> torch.cuda.Event:
    done = torch.cuda.Event()
    done.record(stream)
    return done


def _pin(blocks: BlockBatch) -> BlockBatch:
    b = blocks.batch
    b.input_ids, b.loss_mask = b.input_ids.pin_memory(), b.loss_mask.pin_memory()
    if b.doc_ids is not None and b.position_ids is not None:
        b.doc_ids, b.position_ids = b.doc_ids.pin_memory(), b.position_ids.pin_memory()
    blocks.anchors, blocks.keep = blocks.anchors.pin_memory(), blocks.keep.pin_memory()
    return blocks


class _Window:
    """Sums between two step lines; stays on the device until the line is due."""

    def __init__(self, pipe: Pipeline) -> None:
        self.pipe = pipe
        self.t0 = time.monotonic()
        self.steps = 0
        self.tokens = 0
        self.slots = 0
        with pipe._count_lock:
            self.target_batches0 = pipe._target_batches
        self.loss: Tensor | None = None
        self.stats: Tensor | None = None
        # The largest pre-clip gradient norm of the window's steps: a spike in one step of
        # log_every is what a median or the last value would hide, and the rule compares a
        # row's with the median of earlier rows' (dflash_tui/diagnosis/training.py grad_norm_spike).
        # A running torch.maximum on the device (NaN propagates: a NaN step shows).
        self.grad_norm: Tensor | None = None

    def add(self, outs: list[tuple[LossOutput, int]], slots: int, grad_norm: Tensor | None) -> None:
        """One optimizer step's replicas, each (its loss, its batch's real tokens)."""
        self.steps += 1
        if grad_norm is not None:
            g = grad_norm.detach().float()
            self.grad_norm = g if self.grad_norm is None else torch.maximum(self.grad_norm, g)
        tokens = sum(t for _, t in outs)
        self.tokens += tokens
        self.slots += slots
        dev = self.pipe.run.drafter_devices[0]
        # Weighted by tokens, as the gradient is (replicas.average_grads): the loss logged is
        # the one the step descends, not a short batch's counted as much as a long one's.
        loss = sum(o.loss.detach().to(dev) * t for o, t in outs) / max(1, tokens)
        outs_only = [o for o, _ in outs]
        stats = sum(o.stats.to(dev) for o in outs_only)
        assert isinstance(loss, Tensor) and isinstance(stats, Tensor)
        self.loss = loss if self.loss is None else self.loss + loss
        self.stats = stats if self.stats is None else self.stats + stats

    def record(self) -> MetricsRow:
        pipe = self.pipe
        run, p = pipe.run, pipe.position
        dt = max(time.monotonic() - self.t0, 1e-9)
        zero = torch.zeros(len(STAT_NAMES))
        mean = LossOutput(
            loss=(self.loss if self.loss is not None else torch.zeros(())) / max(1, self.steps),
            stats=self.stats if self.stats is not None else zero,
        ).metrics()
        with pipe._count_lock:
            tgt = pipe._target_batches - self.target_batches0
        step_rate = self.steps / dt
        eta = (run.total_steps - p.step) / step_rate if step_rate > 0 else None
        queues = pipe.queue_depths()
        now = time.time()
        return MetricsRow(
            time=now,
            elapsed_s=now - pipe.state.started_at,
            step=p.step,
            loss=mean["loss"],
            acc=mean["acc"],
            streak=mean["streak"],
            lr=pipe._lr,
            noise=noise_at(p.step - 1, run.total_steps, run.cfg.train),
            tgt_bps=tgt / dt,
            dft_bps=self.steps * pipe.D / dt,
            tok_s=self.tokens / dt,
            q_pre=[q.depth for q in queues.q_pre],
            q_hs=[q.depth for q in queues.q_hs],
            epoch=p.batches / max(1, run.batches_per_epoch),
            padding=1 - self.tokens / self.slots if self.slots else None,
            eta_s=eta,
            topk=mean["topk"],
            tokens=p.tokens,
            memory=device_memory(run.devices),
            stages_ms=pipe.state.stages_by_thread(),
            eval=pipe.evaluator.take_result() if pipe.evaluator is not None else None,
            # Read here, after the loss and stats above synced the device: no extra wait.
            grad_norm=float(self.grad_norm) if self.grad_norm is not None else None,
        )

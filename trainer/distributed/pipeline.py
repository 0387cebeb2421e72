"""processes mode: the pipeline of one rank, a target or a drafter replica
(trainer/distributed/layout.py).

Batch g is trained by replica r = (g - g0) % D (step s trains batches g0 + (s - s0)*D + r,
as in the threaded pipeline) and forwarded by the target trainer/distributed/routing.py
names: t = (g - g0) % T ("fixed"), or one on r's own node ("node"). Only the hops between
roles change:

  target rank t:   prefetch thread -> q_pre -> target thread -> isend to drafter rank T + r
                   (at most q_hs_size sends in flight per drafter: trainer/distributed/transfer.py)
  drafter rank r:  receiver thread (recv from target rank t, build the mask) -> q_hs ->
                   drafter thread: forward through DDP, the step's token sum all-reduced,
                   backward (DDP all-reduces the token-weighted gradients in buckets as
                   they are made: trainer/distributed/replica_sync.py), then its own
                   optimizer step (the same on every drafter rank: same init, same averaged
                   gradients, same optimizer)

The loss, the metrics sums, the token counts, a stop request and the queue depths each rank
knows are all-reduced after backward, so every drafter rank logs the job's numbers and they
all stop at the same step. With one drafter rank no collective runs at all.
"""

from __future__ import annotations

import queue
import threading
import time
from collections import deque
from functools import partial
from typing import Any

import torch
import torch.distributed as dist

from trainer.contract.heartbeat import (
    STAGE_FORWARD,
    STAGE_MASK,
    STAGE_TRANSFER,
    STAGE_WAIT_HS,
    STAGE_WAIT_PRE,
    STAGE_WAIT_REPLICAS,
    WAIT_HS_FULL,
    WAIT_PRE_EMPTY,
    QueueDepth,
    Queues,
)
from trainer.contract.phases import TRAINING
from trainer.distributed.blame import is_peer_loss
from trainer.distributed.layout import Job, RankLayout
from trainer.distributed.replica_sync import ReplicaSync
from trainer.distributed.routing import crosses_nodes, route
from trainer.distributed.transfer import FeatureSender, receive
from trainer.model.drafter import DFlashDrafter
from trainer.model.loss import STAT_NAMES, LossOutput
from trainer.model.step import BlockBatch, attach_mask
from trainer.reporting.stages import StageClock
from trainer.runtime.pipeline import FeatureItem, Pipeline


class OwnRate:
    """This rank's own batches and their tokens over its last ~10 s: what heartbeat-rank's
    `tok_s`/`batches_s` say (a drafter rank's job-level numbers are all-reduced: not its own)."""

    WINDOW_S = 10.0

    def __init__(self) -> None:
        self._lock = threading.Lock()  # the loop thread counts, the heartbeat thread reads
        self._batches = self._tokens = 0
        self._recent: deque[tuple[float, int, int]] = deque(maxlen=512)

    def count(self, tokens: int) -> None:
        with self._lock:
            self._batches += 1
            self._tokens += tokens
            self._recent.append((time.monotonic(), self._batches, self._tokens))

    def rates(self) -> tuple[float, float]:
        """(tokens/s, batches/s) between the oldest and newest batch of the window."""
        with self._lock:
            recent = list(self._recent)
        if len(recent) < 2:
            return 0.0, 0.0
        inside = [r for r in recent if recent[-1][0] - r[0] <= self.WINDOW_S]
        if len(inside) < 2:  # batches slower than the window: the last two
            inside = recent[-2:]
        (t0, b0, k0), (t1, b1, k1) = inside[0], inside[-1]
        if t1 <= t0:
            return 0.0, 0.0
        return (k1 - k0) / (t1 - t0), (b1 - b0) / (t1 - t0)


class _RankPipeline(Pipeline):
    """The threaded pipeline's state, sized for the whole job's T and D."""

    def __init__(self, *args: Any, layout: RankLayout, job: Job, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.layout, self.job = layout, job
        self.T, self.D, self.P = layout.targets, layout.drafters, 1
        self.g_end = self.g0 + (self.run.total_steps - self.s0) * self.D
        rt = self.cfg.runtime
        self.q_pre = [queue.Queue(maxsize=rt.q_pre_size) for _ in range(self.T)]
        self.q_hs = [
            [queue.Queue(maxsize=rt.q_hs_size) for _ in range(self.D)] for _ in range(self.T)
        ]
        self.outs = [None] * self.D
        self.out_tokens, self.out_slots = [0] * self.D, [0] * self.D
        self.barrier = threading.Barrier(1)
        # The rank's progress for heartbeat-rank{R}.json: a drafter's step, a target's last
        # batch's step.
        self.rank_step = self.s0
        self.own_rate = OwnRate()

    def _target_device(self, t: int) -> torch.device:
        return self.run.target_devices[0]

    def _target_of(self, g: int) -> int:
        return route(g - self.g0, self.layout).target

    def _replica(self, r: int) -> tuple[torch.device, DFlashDrafter]:
        return self.run.drafter_devices[0], self.run.replicas.models[0]


class TargetRankPipeline(_RankPipeline):
    """Target t's rank: its prefetch thread and its target thread."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.t = self.layout.index
        self.off_node = 0  # batches whose drafter is on another node
        self.sender = FeatureSender(self.cfg.runtime.q_hs_size, self.job.comm_device)

    def _prefetch_targets(self, p: int) -> set[int]:
        return {self.t}

    def _target(self, t: int) -> None:
        dev = self.run.target_devices[0]
        features_of = self.run.targets[dev].features
        clock = self.state.stage_clock(str(dev))
        mine = (g for g in range(self.g0, self.g_end) if self._target_of(g) == t)
        for n, g in enumerate(mine):
            clock.lap()
            with clock.wait(STAGE_WAIT_PRE):
                blocks: BlockBatch = self._get(self.q_pre[t], WAIT_PRE_EMPTY)
            self.state.thread_state("forward")
            with clock.work(STAGE_FORWARD), torch.no_grad():
                self.faults.check("target", n, t)
                # A packed row's document boundaries for varlen, from the host's copy.
                docs = features_of.packed_docs(blocks.batch.position_ids, dev)
                on_dev = blocks.to(dev, non_blocking=True)
                b = on_dev.batch
                if b.position_ids is None:
                    features = features_of(b.input_ids)
                else:
                    features = features_of(b.input_ids, b.position_ids, docs)
            r = route(g - self.g0, self.layout).replica
            dst = self.layout.drafter_rank(r)
            try:
                with clock.wait(STAGE_WAIT_HS):
                    self.state.thread_state(WAIT_HS_FULL)
                    self.sender.wait_room(dst)
                self.state.thread_state(f"send to rank {dst}")
                with clock.work(STAGE_TRANSFER):
                    if late := self.faults.slow_s("link"):  # DFLASH_FAULT=slow:link:S
                        time.sleep(late)
                    self.sender.send(dst, g, blocks, features, self.q_pre[t].qsize())
            except RuntimeError as e:
                if self._stopped_by_drafters(e):
                    return
                raise
            with self._count_lock:
                self._target_batches += 1
            self.off_node += crosses_nodes(g - self.g0, self.layout)
            self.own_rate.count(blocks.tokens)
            step = self.s0 + (g - self.g0) // self.D + 1
            if step > self.rank_step:
                self.rank_step = step
                self.state.record_step(step, 0, 0.0)
            if n == 0:
                self.state.set_phase(TRAINING)
        # What routing did to the inter-node link: the batches this target sent off its node.
        self.log.line(
            f"{self.layout.name}: forwarded {self._target_batches} batches, {self.off_node} to"
            f" another node's drafters (runtime.routing = {self.layout.routing})"
        )
        self.state.thread_state("waiting for the drafters to take the last batches")
        try:
            self.sender.flush()
        except RuntimeError as e:
            if not self._stopped_by_drafters(e):
                raise
        self.state.thread_state("done")

    def _stopped_by_drafters(self, e: RuntimeError) -> bool:
        """A stop (SIGTERM) reaches every rank; the drafters agree on their last step and
        leave, so the sends after it find no one: for a stopping target that is the end."""
        if self.stop_request.is_set() and is_peer_loss(str(e)):
            self.stopped_early = True
            self.state.thread_state("stopped: the drafters left")
            return True
        return False

    def queue_depths(self) -> Queues:
        rt = self.cfg.runtime
        return Queues(
            q_pre=[QueueDepth(self.q_pre[self.t].qsize(), rt.q_pre_size)],
            q_hs=[
                QueueDepth(self.sender.in_flight(self.layout.drafter_rank(r)), rt.q_hs_size)
                for r in range(self.D)
            ],
        )

    def start(self) -> None:
        t = self.t
        self._spawn(f"prefetch-{t}", "prefetch", "cpu", partial(self._prefetch, 0))
        dev = str(self.run.target_devices[0])
        th = self._spawn(f"target-{t}", "target", dev, partial(self._target, t))
        self.drafter_threads.append(th)  # the thread whose end is this rank's end
        for th in self.threads:
            th.start()


class DrafterRankPipeline(_RankPipeline):
    """Replica r's rank: its receiver thread and its drafter thread."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.r = self.layout.index
        # What this rank knows of the queues: each target's q_pre as its last batch here
        # said, and every drafter's q_hs as the last step's all_reduce said.
        self._q_pre_seen = [0] * self.T
        self._q_pre_known = [0] * self.T
        self._q_hs_known = [0] * self.D
        self._stop_agreed = False
        self._received = 0  # batches this rank has taken in from the targets
        self.sync = ReplicaSync(self.run.replicas.models[0], self.layout, self.job, self.cfg)

    def _receive(self) -> None:
        dev = self.run.drafter_devices[0]
        comm = self.job.comm_device
        r = self.r
        clock = self.state.stage_clock(str(dev))
        settings = self.run.settings
        for s in range(self.s0, self.run.total_steps):
            clock.lap()
            g = self.g0 + (s - self.s0) * self.D + r
            t = self._target_of(g)
            src = self.layout.target_rank(t)
            self.state.thread_state(f"receiving from rank {src}")
            with clock.wait(STAGE_WAIT_HS):
                got = receive(src, dev, comm)
            if got.g != g:
                raise RuntimeError(f"drafter {r} expected batch {g} from rank {src}, got {got.g}")
            self._q_pre_seen[t] = got.q_pre
            self._received += 1
            self.state.thread_state("building mask")
            with clock.work(STAGE_MASK):
                attach_mask(got.blocks, settings.backend, settings.block_size)
            item = FeatureItem(g=g, blocks=got.blocks, features=got.features, ready=None)
            with clock.wait(STAGE_WAIT_PRE):
                self._put(self.q_hs[t][r], item, WAIT_HS_FULL)
        self.state.thread_state("done")

    def _loss(
        self, model: DFlashDrafter, item: FeatureItem, noise: float, gen: torch.Generator | None
    ) -> LossOutput:
        """Through DDP (replica_sync.py), whose backward reduces the gradients in buckets."""
        out: LossOutput = self.sync.forward_loss(
            item.blocks, item.features, self.run.settings, noise, gen
        )
        return out

    def _before_backward(self, tokens: int, clock: StageClock) -> None:
        # The step's token sum: the first collective of the step, so it is where a rank
        # waits for a slower replica's forward, timed as a wait (not as its own backward).
        with clock.wait(STAGE_WAIT_REPLICAS):
            self.sync.before_backward(tokens)

    def _end_of_step(self, r: int, s: int, clock: StageClock) -> None:
        self.own_rate.count(self.out_tokens[r])  # its own batch, before the sums replace it
        # The gradients are averaged already (DDP, during backward); the step's numbers
        # wait for the slowest replica too: timed as the step's barrier (a wait), not as
        # this rank's optimizer work, so a straggler's peers do not look slow too.
        with clock.wait(STAGE_WAIT_REPLICAS):
            self._share_step_numbers()
        self._optimizer_step(s, clock)
        self.rank_step = s + 1

    def _average_grads(self) -> None:
        """Done by DDP during backward (replica_sync.py), weighted by tokens."""

    def _share_step_numbers(self) -> None:
        r, out = self.r, self.outs[self.r]
        assert out is not None
        dev = self.run.drafter_devices[0]
        n_stats = len(STAT_NAMES)
        sums = torch.zeros(1 + n_stats + 4, dtype=torch.float64, device=dev)
        sums[0] = out.loss.detach().double() * self.out_tokens[r]  # token-weighted, as threads
        sums[1 : 1 + n_stats] = out.stats.detach().double()
        sums[1 + n_stats] = float(self.out_tokens[r])
        sums[2 + n_stats] = float(self.out_slots[r])
        sums[3 + n_stats] = 1.0 if self.stop_request.is_set() else 0.0
        sums[4 + n_stats] = float(self._received)
        depths = torch.zeros(self.T + self.D, dtype=torch.int64, device=dev)
        depths[: self.T] = torch.tensor(self._q_pre_seen, dtype=torch.int64)
        depths[self.T + r] = self.q_hs_depth()
        if self.D > 1:  # one drafter rank: its own numbers are the job's, no collective
            comm = self.job.comm_device
            sums, depths = sums.to(comm), depths.to(comm)
            dist.all_reduce(sums, group=self.job.drafters)
            dist.all_reduce(depths, op=dist.ReduceOp.MAX, group=self.job.drafters)
        sums, depths = sums.to(dev), depths.cpu()
        loss = (sums[0] / sums[1 + n_stats].clamp(min=1)).to(out.loss.dtype)
        stats = sums[1 : 1 + n_stats].to(out.stats.dtype)
        self.outs = [LossOutput(loss=loss, stats=stats)] + [None] * (self.D - 1)
        self.out_tokens = [int(sums[1 + n_stats])] + [0] * (self.D - 1)
        self.out_slots = [int(sums[2 + n_stats])] + [0] * (self.D - 1)
        self._stop_agreed = bool(sums[3 + n_stats] > 0)
        with self._count_lock:  # the targets' output, as every drafter rank took it in
            self._target_batches = int(sums[4 + n_stats])
        known = depths.tolist()
        self._q_pre_known, self._q_hs_known = known[: self.T], known[self.T :]

    def _sync_params(self) -> None:
        """Nothing to send: every drafter rank stepped the same optimizer on the same mean."""

    def _stop_now(self) -> bool:
        return self._stop_agreed  # any rank's SIGTERM, seen by all at the same step

    def q_hs_depth(self) -> int:
        return sum(self.q_hs[t][self.r].qsize() for t in range(self.T))

    def queue_depths(self) -> Queues:
        rt = self.cfg.runtime
        hs = list(self._q_hs_known)
        hs[self.r] = self.q_hs_depth()  # its own, live
        return Queues(
            q_pre=[QueueDepth(d, rt.q_pre_size) for d in self._q_pre_known],
            q_hs=[QueueDepth(d, rt.q_hs_size * self.T) for d in hs],
        )

    def start(self) -> None:
        r = self.r
        dev = str(self.run.drafter_devices[0])
        self._spawn(f"receiver-{r}", "receiver", dev, self._receive)
        th = self._spawn(f"drafter-{r}", "drafter", dev, partial(self._drafter, r))
        self.drafter_threads.append(th)
        for th in self.threads:
            th.start()

"""processes mode: the drafter ranks' gradients averaged by torch's own DDP, weighted by tokens.

Every drafter rank holds a whole replica (same init, same averaged gradients, same
optimizer: they stay identical without a parameter broadcast). DistributedDataParallel over
the drafter ranks' group all-reduces the gradients in buckets while backward still runs.

The objective is threads mode's (trainer/model/replicas.py `average_grads`): the gradient
is Σ_r tokens_r ∇L_r / Σ_r tokens_r over the step's batches (BlockBatch.tokens, the real
tokens). Each replica's loss is a mean over its own batch, so its gradient is scaled by its
tokens, summed over the ranks, and divided by the step's token sum: the same operations,
in the same order, as threads mode's, so the two modes agree on CPU. The token sum is
all-reduced before backward (`before_backward`), which is also where a rank waits for a
slower replica's forward: timed as `wait replicas`, not as its own backward.

`runtime.grad_reduce_dtype = "bf16"` sends the buckets as bfloat16 (half the bytes over a
PCIe box's links); the sum lands back in the fp32 gradients.

With one drafter rank nothing is wrapped and no collective runs: its gradient is the step's.

Why DDP and not FSDP2 (`fully_shard`): bench/README.md, "Drafter replicas: DDP or FSDP2".
"""

# No `from __future__ import annotations`: DDP checks the comm hook's annotations as objects.
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor, nn
from torch.nn.parallel import DistributedDataParallel

from trainer.config import Config, bad_value
from trainer.distributed.layout import Job, RankLayout
from trainer.model.drafter import DFlashDrafter
from trainer.model.loss import LossOutput
from trainer.model.step import BlockBatch, LossSettings, drafter_loss

WIRE_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def check_reduce_setting(cfg: Config, layout: RankLayout) -> None:
    """A reduce setting this layout cannot honour: a ConfigError (one line, exit 2), said
    before any model loads."""
    dtype = cfg.runtime.grad_reduce_dtype
    if dtype != "fp32" and layout.drafters == 1:
        rule = (
            "this job has one drafter rank, so no gradient is reduced (its own is the "
            'step\'s); set runtime.grad_reduce_dtype = "fp32" or add drafter ranks'
        )
        raise bad_value("runtime.grad_reduce_dtype", dtype, rule)


class _DrafterLoss(nn.Module):
    """The drafter's whole loss as one forward, so DDP sees every use of its parameters
    (`drafter_loss` reaches the drafter through more than its `forward`)."""

    def __init__(self, drafter: DFlashDrafter) -> None:
        super().__init__()
        self.drafter = drafter

    def forward(
        self,
        blocks: BlockBatch,
        features: Tensor,
        settings: LossSettings,
        noise_std: float,
        gen: torch.Generator | None,
    ) -> LossOutput:
        return drafter_loss(self.drafter, blocks, features, settings, noise_std, gen)


class ReplicaSync:
    """This drafter rank's part in averaging the step's gradient over the drafter ranks."""

    def __init__(self, drafter: DFlashDrafter, layout: RankLayout, job: Job, cfg: Config):
        self.layout, self.job = layout, job
        self.wire = WIRE_DTYPES[cfg.runtime.grad_reduce_dtype]
        self._tokens = 0.0  # this rank's batch's real tokens, for the hook
        self._total: Tensor | None = None  # the step's token sum (before_backward)
        self.ddp: DistributedDataParallel | None = None
        # The forward and loss: through DDP with several drafter ranks, so backward reduces.
        self.forward_loss: nn.Module = _DrafterLoss(drafter)
        if layout.drafters > 1:
            self.forward_loss = self.ddp = DistributedDataParallel(
                self.forward_loss,
                process_group=job.drafters,
                # Every rank built the same weights from the same seed, or was sent the
                # writer's checkpoint: no init broadcast (it would send the frozen
                # embedding and head too). The drafter has no buffers to sync.
                init_sync=False,
                gradient_as_bucket_view=True,  # the buckets are the .grad: no second copy
            )
            self.ddp.register_comm_hook(self, _weighted_sum_hook)

    def before_backward(self, tokens: int) -> None:
        """The step's token sum, all-reduced before the gradients that it divides."""
        if self.ddp is None:
            return
        self._tokens = float(tokens)
        # float64: an exact sum of counts. A fill, not a copy from the host, and read by the
        # hook as a tensor: on a GPU nothing here waits for the forward's kernels.
        total = torch.full((1,), float(tokens), dtype=torch.float64, device=self.job.comm_device)
        dist.all_reduce(total, group=self.job.drafters)
        self._total = total.clamp_min(1.0).to(torch.float32).reshape(())


def _weighted_sum_hook(sync: ReplicaSync, bucket: dist.GradBucket) -> torch.futures.Future[Tensor]:
    """A bucket of this rank's gradients scaled by its tokens, summed over the drafter ranks
    (in `sync.wire`'s dtype), divided by the step's token sum."""
    buf = bucket.buffer()
    total = sync._total
    if total is None:
        raise RuntimeError("a drafter rank reduced gradients before the step's token sum")
    buf.mul_(sync._tokens)
    wire = buf if buf.dtype == sync.wire else buf.to(sync.wire)
    fut = dist.all_reduce(wire, group=sync.job.drafters, async_op=True)
    assert fut is not None

    def land(done: Any) -> Tensor:
        summed = done.value()[0]
        if summed is not buf:
            buf.copy_(summed)
        return buf.div_(total)

    return fut.get_future().then(land)

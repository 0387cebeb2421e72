"""Drafter replicas, one per drafter device, kept identical, with one optimizer state.

Every optimizer step: each replica computes gradients on its own batch; the gradients are
averaged into replica 0, weighted by each batch's real tokens (torch.cuda.comm's NCCL reduce
across GPUs, plain adds on one device); replica 0 clips and steps the single optimizer; its
parameters are broadcast back.
"""

from __future__ import annotations

import torch
import torch.cuda.comm as cuda_comm
from torch import Tensor

from trainer.model.drafter import DFlashDrafter


def _distinct_cuda(devices: list[torch.device]) -> bool:
    return all(d.type == "cuda" for d in devices) and len({d.index for d in devices}) == len(
        devices
    )


class DrafterReplicas:
    def __init__(
        self,
        primary: DFlashDrafter,
        devices: list[torch.device],
        embed_for: dict[torch.device, tuple[Tensor, Tensor]],
    ) -> None:
        """`primary` lives on devices[0]; `embed_for[device]` = that device's frozen
        (embedding, lm_head) from the target, so replicas never copy them needlessly."""
        self.devices = devices
        self.models: list[DFlashDrafter] = [primary]
        for dev in devices[1:]:
            embed, head = embed_for[dev]
            with torch.device(dev):  # initialised there: a host init is slow and discarded
                replica = DFlashDrafter(primary.arch, embed, head)
            replica.load_state_dict(primary.trainable_state_dict(), strict=False)
            self.models.append(replica)
        self._params: list[list[Tensor]] = [
            [p for p in m.parameters() if p.requires_grad] for m in self.models
        ]

    @property
    def primary(self) -> DFlashDrafter:
        return self.models[0]

    def __len__(self) -> int:
        return len(self.models)

    @torch.no_grad()
    def average_grads(self, tokens: list[int]) -> None:
        """Replica 0's .grad becomes the token-weighted mean over replicas,
        Σ_r tokens_r ∇L_r / Σ_r tokens_r: each replica's loss is a mean over its own batch,
        so a short batch would otherwise count as much as a long one. Scaled, then summed
        in replica order, then divided: the same operations as processes mode's DDP comm hook
        (trainer/distributed/replica_sync.py), so the two agree."""
        n = len(self.models)
        if n == 1:
            return
        if len(tokens) != n:
            raise ValueError(f"{len(tokens)} token counts for {n} replicas")
        grads = [[p.grad for p in params] for params in self._params]
        if any(g is None for gs in grads for g in gs):
            raise RuntimeError("a drafter replica has no gradient: did its backward run?")
        for gs, t in zip(grads, tokens, strict=True):
            torch._foreach_mul_(gs, float(t))  # type: ignore[arg-type]
        if _distinct_cuda(self.devices):
            reduced = cuda_comm.reduce_add_coalesced(grads, destination=self.devices[0].index)
            for g0, r in zip(grads[0], reduced, strict=True):
                assert g0 is not None
                g0.copy_(r)
        else:
            for r in range(1, n):
                torch._foreach_add_(grads[0], grads[r])  # type: ignore[arg-type]
        torch._foreach_div_(grads[0], float(max(1, sum(tokens))))  # type: ignore[arg-type]

    @torch.no_grad()
    def broadcast_params(self) -> None:
        if len(self.models) == 1:
            return
        src = self._params[0]
        if _distinct_cuda(self.devices):
            copies = cuda_comm.broadcast_coalesced(src, [d.index for d in self.devices])
            for params, fresh in zip(self._params[1:], copies[1:], strict=True):
                torch._foreach_copy_(params, list(fresh))
        else:
            for params in self._params[1:]:
                torch._foreach_copy_(params, src)

    def zero_grads(self) -> None:
        for m in self.models:
            m.zero_grad(set_to_none=True)

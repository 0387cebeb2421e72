"""The held-out prompts decoded for an eval, the fastest way the target allows.

A full-attention target (Qwen3) decodes every prompt at once (batched.py), its step captured as
a CUDA graph on a GPU unless `eval.cuda_graphs` says off (graphs.py). A hybrid target
(Qwen3.5, Gated DeltaNet) decodes one prompt at a time, eagerly (speculative.py): its
recurrent state cannot leave a batch's rejected drafts out. Both give the same tokens and τ
as speculative.py's loop (tests/trainer/test_batched_decode.py).

Built once and run at every eval (trainer/evaluation/online.py), so the buffers and the graph
are made once; `python -m trainer eval` runs it once.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from trainer.contract.graphs import GraphInfo
from trainer.evaluation.batched import BatchedDecoder, DrafterBlocks, batch_refusal
from trainer.evaluation.graphs import GraphedStep, graphs_off_reason
from trainer.evaluation.speculative import (
    Decoded,
    DecodeStats,
    drafter_proposer,
    speculative_decode,
)


class HeldOutDecode:
    def __init__(
        self,
        model: Any,
        drafter: Any,  # DFlashDrafter, on the model's device
        prompts: list[list[int]],
        new_tokens: int,
        cuda_graphs: str = "auto",  # eval.cuda_graphs
        log: Callable[[str], None] = lambda _: None,
    ) -> None:
        arch = drafter.arch
        self.model, self.drafter, self.prompts, self.new_tokens = (
            model,
            drafter,
            prompts,
            new_tokens,
        )
        self.layer_ids, self.block_size = list(arch.target_layer_ids), arch.block_size
        device = next(model.parameters()).device
        refusal = batch_refusal(model)
        off = graphs_off_reason(cuda_graphs, device)
        if refusal:
            off = f"{refusal}: its prompts decode one at a time, eagerly"
        self.graphs = GraphInfo(enabled=off is None, off_reason=off)
        self.batched: BatchedDecoder | None = None
        if refusal is None:
            graph = GraphedStep(device, self.graphs, log) if off is None else None
            self.batched = BatchedDecoder(
                model, self.layer_ids, DrafterBlocks(drafter), prompts, new_tokens,
                self.block_size, graph=graph,
            )  # fmt: skip

    @property
    def batch(self) -> bool:
        return self.batched is not None

    @torch.no_grad()
    def run(self, cancel: Callable[[], bool] = lambda: False) -> Decoded:
        """Every prompt decoded (see BatchedDecoder.run and speculative_decode for `cancel`)."""
        if self.batched is not None:
            return self.batched.run(cancel)
        return one_at_a_time(
            self.model, self.layer_ids, drafter_proposer(self.drafter), self.prompts,
            self.new_tokens, self.block_size, cancel,
        )  # fmt: skip


def one_at_a_time(
    model: Any,
    layer_ids: list[int],
    propose: Any,  # speculative.Proposer
    prompts: list[list[int]],
    new_tokens: int,
    block_size: int,
    cancel: Callable[[], bool] = lambda: False,
) -> Decoded:
    """speculative.py's loop over the prompts; a cancel leaves the prompts after it undone."""
    tokens: list[list[int]] = []
    rows: list[DecodeStats] = []
    seconds = 0.0
    for prompt in prompts:
        if cancel():
            break
        out, stats = speculative_decode(
            model, layer_ids, propose, prompt, new_tokens, block_size, cancel=cancel
        )
        seconds += stats.seconds
        stats.seconds = 0.0
        tokens.append(out)
        rows.append(stats)
    return Decoded(block_size, tokens, rows, seconds)

"""The held-out prompts decoded speculatively as one batch, for full-attention targets (Qwen3).

The same decode as speculative.py's loop, which stays the reference (the tests compare the
two token for token), but every prompt steps at once: one drafter forward proposes a block
for every row, one target forward verifies them all.

How a batch shares one cache:
  - the prompts are left-padded to the longest (P slots); every step then appends the whole
    verified block (block_size slots) for every row, accepted or not, so the cache's slots
    are the same for the whole batch and nothing is ever cut back or moved;
  - what a row sees is its own: a boolean mask per row marks the slots that hold its accepted
    tokens (left padding and rejected drafts stay masked out), and each row has its own RoPE
    positions (its tokens' true positions, not their slots);
  - the drafter's context is kept the same way: the fused features of every slot, their
    positions, the same mask.
Every step therefore has the same shapes, and the step (propose, verify, the new context) can
be captured once as a CUDA graph and replayed (graphs.py); eager, it is the same function.

A row that has finished (its tokens, or eos) keeps stepping with the others, masked: its
results are not read and its slots are never marked. Dropping it would change the shapes.

The cache is this module's own `SlotCache`, not HF's StaticCache: StaticCache writes where its
own counter says (an int in some transformers versions, a device tensor in others), while a
graph needs the slots named by a buffer it reads. HF's layers call only a cache's `update`
(transformers 5.17 and 5.25 alike), and take the 4-D masks built here as made already (the
`attention_mask` as {layer type: mask}, as `generate` passes it), so HF builds no mask of
its own, which would read the cache's length on the host, inside a capture.

A hybrid target (Qwen3.5, Gated DeltaNet) cannot be batched this way: its recurrent state sums
every token it is fed, rejected drafts included, and no mask takes them back out. It keeps
speculative.py's loop, one prompt at a time, eagerly (`batch_refusal` says why).

Memory: the cache holds B x (P + (new_tokens - 1) x block_size) slots per layer, the most a
decode can use (every draft rejected): 1.8 GB on the 8B target for 8 prompts of 512 tokens
and 64 new tokens; prefill's hidden states are bounded by `PREFILL_TOKENS`.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, Protocol

import torch
from torch import Tensor

from trainer.evaluation.graphs import GraphedStep
from trainer.evaluation.speculative import (
    Decoded,
    DecodeStats,
    cache_argument,
    has_linear_attention,
    layer_features,
)
from trainer.model.attention import DenseMask
from trainer.model.vocab_logits import no_logits, target_logits
from trainer.targets.packing import install_packed_attention

# Rows prefilled in one forward: at most this many prompt tokens (HF returns every layer's
# hidden states for all of them: 0.6 GB on the 8B target).
PREFILL_TOKENS = 2048
SLOT_ALIGN = 64  # the cache's length, rounded up to this


class BlockProposer(Protocol):
    """What proposes a block for every row from the context kept so far (the drafter:
    `DrafterBlocks`)."""

    def context(self, feats: Tensor) -> Tensor:
        """The target's features [B, L, n*H] as the context kept per slot [B, L, C]."""
        ...

    def propose(
        self, ctx: Tensor, ctx_positions: Tensor, ctx_valid: Tensor, anchors: Tensor, at: Tensor
    ) -> Tensor:
        """Drafts [B, block_size - 1] after each row's anchor (token `anchors[b]` at
        position `at[b]`), from the slots `ctx_valid` marks (ctx [B, S, C], positions and
        marks [B, S])."""
        ...


class DrafterBlocks:
    """The drafter as speculative.py's `drafter_proposer` runs it, for a batch: anchor + mask
    tokens, one forward over the row's whole context, greedy at each mask position."""

    def __init__(self, drafter: Any) -> None:
        self.drafter = drafter
        arch = drafter.arch
        self.block_size, self.mask_id = arch.block_size, arch.mask_token_id

    def context(self, feats: Tensor) -> Tensor:
        return self.drafter.fuse_context(feats.to(self.drafter.fc.weight.dtype))

    def propose(
        self, ctx: Tensor, ctx_positions: Tensor, ctx_valid: Tensor, anchors: Tensor, at: Tensor
    ) -> Tensor:
        B, bs = anchors.shape[0], self.block_size
        masks = torch.full((B, bs - 1), self.mask_id, dtype=anchors.dtype, device=anchors.device)
        block = torch.cat([anchors[:, None], masks], dim=1)
        positions = at[:, None] + torch.arange(bs, device=at.device)
        # Every block token sees the row's accepted context and the whole block.
        keys = torch.cat([ctx_valid, ctx_valid.new_ones(B, bs)], dim=1)[:, None, None, :]
        mask = DenseMask(mask=keys, empty_rows=keys.new_zeros(B, 1, 1, 1))
        hidden = self.drafter(block, positions, ctx, mask, context_positions=ctx_positions)
        return self.drafter.logits(hidden[:, 1:]).argmax(-1)


def batch_refusal(model: Any) -> str | None:
    """Why this target cannot be decoded as a batch here (None: it can)."""
    if has_linear_attention(model):
        return (
            "the target has Gated DeltaNet layers, whose recurrent state cannot leave "
            "rejected drafts out"
        )
    cfg = getattr(model.config, "text_config", None) or model.config
    kinds = set(getattr(cfg, "layer_types", None) or ["full_attention"])
    if kinds != {"full_attention"}:
        return f"the target's layer types {sorted(kinds)} are not all full attention"
    impl = getattr(cfg, "_attn_implementation", None) or "sdpa"
    if impl not in ("sdpa", "eager"):
        return f"the target's attention {impl!r} takes no 4-D mask (sdpa or eager do)"
    return None


class SlotCache:
    """K/V of every layer in fixed buffers [B, kv heads, slots, head dim], written at the
    slots `write` names (a device tensor: a graph reads it), for the rows `rows` holds (the
    prefill goes a few rows at a time). Zero-filled: a masked slot must hold a finite value,
    since SDPA adds the mask to q.k, and NaN + -inf is NaN."""

    def __init__(self, batch: int, slots: int) -> None:
        self.batch, self.slots = batch, slots
        self.keys: dict[int, Tensor] = {}
        self.values: dict[int, Tensor] = {}
        self.write: Tensor | None = None
        self.rows = slice(None)

    def update(self, keys: Tensor, values: Tensor, layer: int, *_: Any, **__: Any) -> Any:
        """HF's call, from each attention layer: store this forward's K/V, return the rows'
        whole buffers (the mask says which slots count)."""
        if layer not in self.keys:
            shape = (self.batch, keys.shape[1], self.slots, keys.shape[-1])
            self.keys[layer] = keys.new_zeros(shape)
            self.values[layer] = values.new_zeros(shape)
        assert self.write is not None, "SlotCache.write is set before every forward"
        k, v = self.keys[layer][self.rows], self.values[layer][self.rows]
        k.index_copy_(2, self.write, keys)
        v.index_copy_(2, self.write, values)
        return k, v

    def get_seq_length(self, layer: int = 0) -> int:
        return self.slots


class BatchedDecoder:
    """Decodes the same prompts again at each `run` (one eval after another): the buffers,
    and the step's CUDA graph once captured, are kept between runs; a drafter whose weights
    were copied in place is read anew by every replay."""

    def __init__(
        self,
        model: Any,
        layer_ids: list[int],
        proposer: BlockProposer,
        prompts: list[list[int]],
        new_tokens: int,
        block_size: int,
        eos: int | None = None,
        graph: GraphedStep | None = None,
    ) -> None:
        refusal = batch_refusal(model)
        if refusal:
            raise ValueError(refusal)
        if not prompts or not all(prompts):
            raise ValueError("every prompt needs a token")
        self.model, self.layer_ids, self.proposer = model, layer_ids, proposer
        self.prompts, self.new_tokens, self.bs, self.eos = prompts, new_tokens, block_size, eos
        dev = self.device = next(model.parameters()).device
        B, P = len(prompts), max(len(p) for p in prompts)
        self.prompt_slots = P
        # The most a decode uses: every step accepts nothing and yields one token.
        need = P + max(new_tokens - 1, 0) * block_size
        self.slots = -(-need // SLOT_ALIGN) * SLOT_ALIGN
        self.cache = SlotCache(B, self.slots)
        cfg = getattr(model.config, "text_config", None) or model.config
        self.mask_kinds = sorted(set(getattr(cfg, "layer_types", None) or ["full_attention"]))
        self.additive = (getattr(cfg, "_attn_implementation", None) or "sdpa") == "eager"
        self.mask_dtype = next(model.parameters()).dtype
        self.cache_arg = cache_argument(model)
        # SDPA's masked verify reads each key/value head once (targets/grouped_attention.py)
        # through the "sdpa" function the trainer registers; HF's eager attention is as is.
        self.attention_kwargs: dict[str, Any] = {}
        if not self.additive:
            install_packed_attention()
            self.attention_kwargs = {"dflash_grouped_query": True}
        self.ctx: Tensor | None = None  # [B, slots, C], made by the first prefill
        self.ctx_positions = torch.zeros(B, self.slots, dtype=torch.long, device=dev)
        self.valid = torch.zeros(B, self.slots, dtype=torch.bool, device=dev)
        # One host-to-device copy a step: anchors, positions, the last step's accepted drafts
        # per row, this step's slots and the last step's.
        self.inputs = torch.zeros(3 * B + 2 * block_size, dtype=torch.long, device=dev)
        self.anchors, self.at, self.last_accepted = self.inputs[: 3 * B].view(3, B)
        self.write, self.last_write = self.inputs[3 * B :].view(2, block_size)
        self.block = torch.arange(block_size, device=dev)
        self.all_slots = torch.arange(self.slots, device=dev)
        self.no_logits = no_logits(dev)  # logits come from vocab_logits' GEMM instead
        self.graph = graph
        if graph is not None:
            graph.bind(self._step)

    # -- the step: the same code eager and in a graph -----------------------------------------
    def _step(self) -> Tensor:
        """[B, 2*bs - 1]: each row's drafts, then the target's greedy token after each prefix
        of anchor + drafts. Marks the last step's accepted slots first, and keeps this step's
        block in the context (unmarked until the next step knows what was accepted)."""
        self.valid.index_copy_(1, self.last_write, self.block <= self.last_accepted[:, None])
        drafts = self.proposer.propose(
            self._context(), self.ctx_positions, self.valid, self.anchors, self.at
        )
        ids = torch.cat([self.anchors[:, None], drafts], dim=1)
        positions = self.at[:, None] + self.block
        # A block token sees the row's marked slots and the block up to itself.
        in_block = (self.all_slots >= self.write[0]) & (self.all_slots <= self.write[:, None])
        mask = (self.valid[:, None, :] | in_block)[:, None]  # [B, 1, bs, slots]
        self.cache.write = self.write
        out = self.model(
            input_ids=ids, position_ids=positions, attention_mask=self._mask_arg(mask),
            use_cache=True, output_hidden_states=True, logits_to_keep=self.no_logits,
            **{self.cache_arg: self.cache}, **self.attention_kwargs,
        )  # fmt: skip
        ctx = self.proposer.context(layer_features(out.hidden_states, self.layer_ids))
        self._context().index_copy_(1, self.write, ctx)
        self.ctx_positions.index_copy_(1, self.write, positions)
        greedy = target_logits(self.model, out.hidden_states).argmax(-1)
        return torch.cat([drafts, greedy], dim=1)

    def _context(self) -> Tensor:
        assert self.ctx is not None, "prefill makes the context"
        return self.ctx

    def _mask_arg(self, allowed: Tensor) -> dict[str, Tensor]:
        """HF's `attention_mask` as made already: {layer type: 4-D mask}. SDPA takes the
        boolean mask; HF's eager attention adds it, so it gets 0 / the dtype's minimum."""
        if self.additive:
            zeros = torch.zeros(allowed.shape, dtype=self.mask_dtype, device=allowed.device)
            added = zeros.masked_fill(~allowed, torch.finfo(self.mask_dtype).min)
            return dict.fromkeys(self.mask_kinds, added)
        return dict.fromkeys(self.mask_kinds, allowed)

    # -- one decode of every prompt -------------------------------------------------------------
    @torch.no_grad()
    def run(self, cancel: Callable[[], bool] = lambda: False) -> Decoded:
        """Every prompt's `new_tokens` (fewer after eos, or if `cancel()` says so before a
        step: what each row has then)."""
        t0 = time.monotonic()
        B, bs, eos = len(self.prompts), self.bs, self.eos
        if self.graph is not None:
            self.graph.new_run()
        first = self._prefill()
        outs = [[a] for a in first]
        stats = [DecodeStats(bs) for _ in range(B)]
        at = [len(p) for p in self.prompts]  # each row's anchor position
        anchors = list(first)
        accepted = [-1] * B  # the last step's, per row; -1: nothing to mark
        step = 0

        def finished(b: int) -> bool:
            return len(outs[b]) >= self.new_tokens or (eos is not None and eos in outs[b])

        done = [finished(b) for b in range(B)]
        while not all(done) and not cancel():
            base = self.prompt_slots + step * bs
            write = list(range(base, base + bs))
            last = [w - bs for w in write] if step else write
            host = torch.tensor([*anchors, *at, *accepted, *write, *last], dtype=torch.long)
            self.inputs.copy_(host)
            step_fn = self.graph if self.graph is not None else self._step
            result = step_fn().tolist()  # the step's one wait on the device
            for b in range(B):
                if done[b]:
                    accepted[b] = -1
                    continue
                drafts, greedy = result[b][: bs - 1], result[b][bs - 1 :]
                a = 0  # greedy[k]: the target's token after the anchor and k drafts
                while a < len(drafts) and drafts[a] == greedy[a]:
                    a += 1
                bonus = greedy[a]
                outs[b] += [*drafts[:a], bonus]
                stats[b].accepted.append(a)
                accepted[b], at[b], anchors[b] = a, at[b] + a + 1, bonus
                if eos is not None and eos in outs[b]:
                    outs[b] = outs[b][: outs[b].index(eos) + 1]
                done[b] = finished(b)
            step += 1
        for b in range(B):
            outs[b] = outs[b][: self.new_tokens]
            stats[b].tokens = len(outs[b])
        return Decoded(bs, outs, stats, time.monotonic() - t0)

    def _prefill(self) -> list[int]:
        """Every prompt into the cache, right-aligned at slot P - 1: the target's greedy token
        after each (the first anchors); their context and positions kept, their slots marked."""
        B, P, dev = len(self.prompts), self.prompt_slots, self.device
        ids = torch.zeros(B, P, dtype=torch.long)
        positions = torch.zeros(B, P, dtype=torch.long)
        for b, prompt in enumerate(self.prompts):
            ids[b, P - len(prompt) :] = torch.tensor(prompt)
            positions[b, P - len(prompt) :] = torch.arange(len(prompt))
        ids, positions = ids.to(dev), positions.to(dev)
        is_prompt = torch.arange(P) >= P - torch.tensor([len(p) for p in self.prompts])[:, None]
        is_prompt = is_prompt.to(dev)
        self.valid.zero_()
        self.valid[:, :P] = is_prompt
        self.ctx_positions.zero_()
        self.ctx_positions[:, :P] = positions
        slots = self.all_slots[:P]
        causal = slots[:, None] >= slots[None, :]
        # A padding slot sees itself: a query that sees nothing would give NaN, and its K/V
        # must stay finite (see SlotCache).
        itself = torch.eye(P, dtype=torch.bool, device=dev)
        first: list[int] = []
        per = max(1, PREFILL_TOKENS // P)
        for r0 in range(0, B, per):
            rows = slice(r0, min(B, r0 + per))
            mask = torch.zeros(rows.stop - r0, 1, P, self.slots, dtype=torch.bool, device=dev)
            mask[:, 0, :, :P] = (is_prompt[rows, None, :] & causal) | itself
            self.cache.rows, self.cache.write = rows, slots
            out = self.model(
                input_ids=ids[rows], position_ids=positions[rows],
                attention_mask=self._mask_arg(mask), use_cache=True, output_hidden_states=True,
                logits_to_keep=1, **{self.cache_arg: self.cache}, **self.attention_kwargs,
            )  # fmt: skip
            first += out.logits[:, -1].argmax(-1).tolist()
            ctx = self.proposer.context(layer_features(out.hidden_states, self.layer_ids))
            if self.ctx is None:
                self.ctx = ctx.new_zeros(B, self.slots, ctx.shape[-1])
            self.ctx[rows, :P] = ctx
        self.cache.rows = slice(None)
        return first

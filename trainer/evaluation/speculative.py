"""Speculative decoding as a server runs it, to measure what a drafter is worth: the
acceptance length τ (tokens per target verify step, the bonus token included).

One step, as in DFlash inference (and SpecForge's `spec_generate`):
  1. the drafter proposes a block from the target's features of the context so far: the
     last target token as the anchor at position L, mask tokens after it, one forward, the
     greedy token at each mask position;
  2. the target verifies: one forward over context + anchor + drafts gives its greedy token
     after every prefix; drafts are accepted while they equal it, and the target's token
     after the last accepted one is the bonus;
  3. the accepted tokens and the bonus extend the context; that same forward's hidden states
     are the next step's context features.

Greedy verification is lossless: the tokens produced are the target's own greedy decoding,
whatever the drafter proposes (tests/trainer/test_speculative.py checks both that and τ
against a brute-force reference). The target here is the whole model (logits for
verification), not the truncated one training feeds on.

The target keeps its KV cache across steps (`CachedTarget`), as a server does: a verify
step runs it over the block only (16 tokens), not the whole sequence again. Without it, an
eval on the 8B config (8 prompts × 64 tokens, ~550-token contexts) had not finished after
150 s on the H200 beside training. Rejected drafts leave the cache two ways: a full-attention
target's cache is cut back (`crop`); a hybrid's Gated DeltaNet state cannot be cut, so the
block is verified on a copy of the cache and the accepted tokens are then fed to the kept one.
"""

from __future__ import annotations

import copy
import inspect
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from trainer.model.vocab_logits import no_logits, target_logits

# (context features [L, n*H], anchor token, anchor position) -> block_size - 1 draft tokens
Proposer = Callable[[Tensor, int, int], list[int]]


@dataclass
class DecodeStats:
    block_size: int
    accepted: list[int] = field(default_factory=list)  # drafts accepted, per verify step
    tokens: int = 0  # new tokens produced (the prefill's first token included)
    seconds: float = 0.0

    @property
    def tau(self) -> float | None:
        """Mean tokens per verify step: accepted drafts + the target's bonus token."""
        return sum(a + 1 for a in self.accepted) / len(self.accepted) if self.accepted else None

    def per_position(self) -> list[float]:
        """For draft position k = 1 .. block_size-1: the share of steps that accepted it."""
        n = len(self.accepted)
        return [sum(a >= k for a in self.accepted) / n if n else 0.0
                for k in range(1, self.block_size)]  # fmt: skip

    def add(self, other: DecodeStats) -> None:
        self.accepted += other.accepted
        self.tokens += other.tokens
        self.seconds += other.seconds

    def summary(self) -> dict[str, Any]:
        tau = self.tau
        return {
            "tau": round(tau, 4) if tau is not None else None,
            "per_position": [round(x, 4) for x in self.per_position()],
            "verify_steps": len(self.accepted),
            "tokens": self.tokens,
            "tok_s": round(self.tokens / self.seconds, 1) if self.seconds > 0 else None,
            "block_size": self.block_size,
        }


@dataclass
class Decoded:
    """Several prompts decoded: each one's tokens and verify steps, and the time they took
    together."""

    block_size: int
    tokens: list[list[int]]  # per prompt
    rows: list[DecodeStats]  # per prompt (their `seconds` not set)
    seconds: float

    def total(self) -> DecodeStats:
        """Every prompt's verify steps, in prompt order, as one."""
        out = DecodeStats(self.block_size)
        for row in self.rows:
            out.add(row)
        out.seconds = self.seconds
        return out


def cache_argument(model: Any) -> str:
    """The name the model's forward takes its cache by: transformers 5.24 renamed
    `past_key_values` to `cache` (the old name warns, and goes in 5.40); 5.17, on the H200,
    knows only the old one."""
    params = inspect.signature(model.forward).parameters
    return "cache" if "cache" in params else "past_key_values"


def layer_features(hidden_states: tuple[Tensor, ...], layer_ids: list[int]) -> Tensor:
    """The drafter's context from HF's `hidden_states`: layer i's output is entry i + 1 (entry
    0 is the embeddings; the last entry is the final-normed one, as trainer/targets/load.py
    feeds)."""
    return torch.cat([hidden_states[i + 1] for i in layer_ids], dim=-1)


@torch.no_grad()
def target_pass(model: Any, ids: list[int], layer_ids: list[int]) -> tuple[list[int], Tensor]:
    """(the target's greedy token after each prefix of `ids`, the context features [L, n*H])."""
    device = next(model.parameters()).device
    out = model(
        input_ids=torch.tensor([ids], device=device), output_hidden_states=True, use_cache=False
    )
    greedy = out.logits[0].argmax(-1).tolist()
    return greedy, layer_features(out.hidden_states, layer_ids)[0]


def drafter_proposer(drafter: Any) -> Proposer:
    """The drafter as at inference: anchor + mask tokens, one forward over the whole context
    (no mask: every block token sees all of it), greedy at each mask position."""
    arch = drafter.arch
    bs, mask_id = arch.block_size, arch.mask_token_id

    @torch.no_grad()
    def propose(feats: Tensor, anchor: int, position: int) -> list[int]:
        device = feats.device
        block = torch.full((1, bs), mask_id, dtype=torch.long, device=device)
        block[0, 0] = anchor
        dtype = drafter.fc.weight.dtype
        context = drafter.fuse_context(feats[None].to(dtype))
        positions = position + torch.arange(bs, device=device)[None]
        hidden = drafter(block, positions, context, None)
        return drafter.logits(hidden[:, 1:]).argmax(-1)[0].tolist()

    return propose


def has_linear_attention(model: Any) -> bool:
    """A hybrid (Qwen3.5/3.6): some layers are Gated DeltaNet, whose cached state is a running
    sum that cannot be cut back to an earlier position."""
    cfg = getattr(model.config, "text_config", None) or model.config
    return "linear_attention" in (getattr(cfg, "layer_types", None) or ())


class CachedTarget:
    """The whole target with its cache of the accepted sequence so far: `prefill` the prompt,
    then per step `verify` anchor + drafts (the target's greedy token after each of them, and
    their features) and `accept` how many of them the sequence keeps."""

    def __init__(self, model: Any, layer_ids: list[int]) -> None:
        self.model, self.layer_ids = model, layer_ids
        self.device = next(model.parameters()).device
        self.copy_to_roll_back = has_linear_attention(model)
        self.cache: Any = None
        self.length = 0  # tokens in self.cache
        self._verified: Any = None  # the cache that saw the whole block (a copy, for hybrids)
        self._block: list[int] = []
        self._cache_arg = cache_argument(model)
        self.no_logits = no_logits(self.device)  # verify's logits: vocab_logits' one GEMM

    def _forward(self, ids: list[int], cache: Any, **kw: Any) -> tuple[Any, Any]:
        """(the model's output, the cache it leaves)."""
        kw[self._cache_arg] = cache
        out = self.model(
            input_ids=torch.tensor([ids], device=self.device), use_cache=True,
            output_hidden_states=True, **kw,
        )  # fmt: skip
        kept = getattr(out, "past_key_values", None)
        return out, kept if kept is not None else getattr(out, "cache", None)

    @torch.no_grad()
    def prefill(self, ids: list[int]) -> tuple[int, Tensor]:
        """(the target's greedy token after `ids`, their features [len(ids), n*H])."""
        # The model makes the cache it needs (a hybrid's has Gated DeltaNet layers); only the
        # last position's logits are wanted, not [len, vocab] of them.
        out, self.cache = self._forward(ids, None, logits_to_keep=1)
        self.length = len(ids)
        return int(out.logits[0, -1].argmax()), layer_features(out.hidden_states, self.layer_ids)[0]

    @torch.no_grad()
    def verify(self, block: list[int]) -> tuple[list[int], Tensor]:
        """(greedy[k]: the target's token after block[: k + 1], the block's features)."""
        cache = copy.deepcopy(self.cache) if self.copy_to_roll_back else self.cache
        out, self._verified = self._forward(block, cache, logits_to_keep=self.no_logits)
        self._block = block
        feats = layer_features(out.hidden_states, self.layer_ids)[0]
        return target_logits(self.model, out.hidden_states)[0].argmax(-1).tolist(), feats

    @torch.no_grad()
    def accept(self, n: int) -> None:
        """Keep the first `n` tokens of the last verified block in the cache."""
        want = self.length + n
        if self.copy_to_roll_back:
            if n == len(self._block):
                self.cache = self._verified
            else:  # the kept cache never saw the block: feed it what was accepted
                self.cache = self._forward(self._block[:n], self.cache)[1]
        else:
            self.cache = self._verified
            extra = self.length + len(self._block) - want
            if extra:
                # negative: "remove this many" in every transformers version that has crop
                self.cache.crop(-extra)
        self._verified, self._block, self.length = None, [], want
        got = self.cache.get_seq_length()
        if got != want:  # a cache API that cut elsewhere would verify against the wrong past
            raise RuntimeError(f"the target's cache holds {got} tokens after a step, not {want}")


def speculative_decode(
    model: Any,
    layer_ids: list[int],
    propose: Proposer,
    prompt: list[int],
    new_tokens: int,
    block_size: int,
    eos: int | None = None,
    cancel: Callable[[], bool] = lambda: False,
) -> tuple[list[int], DecodeStats]:
    """Decode `new_tokens` after `prompt` (fewer if the target says `eos`, or if `cancel()`
    says so before a step: what it has then is returned)."""
    t0 = time.monotonic()
    stats = DecodeStats(block_size)
    target = CachedTarget(model, layer_ids)
    anchor, feats = target.prefill(list(prompt))  # the prefill's own token is the first anchor
    n = len(prompt)  # the anchor sits at position n; the context is positions 0 .. n-1
    out = [anchor]
    while len(out) < new_tokens and anchor != eos and not cancel():
        drafts = propose(feats, anchor, n)[: block_size - 1]
        greedy, block_feats = target.verify([anchor, *drafts])
        accepted = 0  # greedy[k]: the target's token after the anchor and k drafts
        while accepted < len(drafts) and drafts[accepted] == greedy[accepted]:
            accepted += 1
        bonus = greedy[accepted]
        target.accept(accepted + 1)  # the anchor and the accepted drafts
        feats = torch.cat([feats, block_feats[: accepted + 1]])
        n += accepted + 1
        out += [*drafts[:accepted], bonus]
        stats.accepted.append(accepted)
        anchor = bonus
        if eos is not None and eos in out:
            out = out[: out.index(eos) + 1]
            break
    out = out[:new_tokens]
    stats.tokens = len(out)
    stats.seconds = time.monotonic() - t0
    return out, stats

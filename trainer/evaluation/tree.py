"""DDTree: an unchanged DFlash drafter served with a draft tree, and the target verifying the
whole tree in one forward (issue 31; Diffusion Draft Tree, arXiv 2604.12989).

The paper was not reachable when this was written; this is the natural algorithm the issue
describes, and every choice below is ours:

- **Distributions.** The drafter's one block forward (anchor + mask tokens, as the chain's
  `drafter_proposer`) gives a distribution at each draft position 1 .. block_size-1. They are
  independent per position (a diffusion drafter predicts them all at once), so a path's
  score is the sum of its tokens' log-probs, each at its own depth.
- **The tree, best-first under a node budget.** The root is the anchor (depth 0, not
  counted). A node at depth k has children among the top tokens of position k+1. A heap
  holds candidates; the best is added, and its first child (the top token of the next
  position) and its next sibling (its parent's next-best token) become candidates. A child
  never scores above its parent, nor a sibling above the one before it, so the `nodes`
  nodes taken are the `nodes` best-scoring paths, every prefix of each among them.
- **Verify, one forward.** The root and every node follow the cached context, node i at
  position n + depth(i) and attending to the context and its ancestors only: an additive
  4-D mask, which HF's attention uses as it is (transformers' masking_utils returns a 4-D
  mask unchanged; SDPA and eager add a float one to the scores). The target's greedy
  token after node i is then its token after exactly node i's path.
- **Accept.** From the root, step to the child whose token is the target's greedy token
  after the current node; stop where no child is. The bonus is the target's token after the
  last accepted node. Lossless, as the chain: every token out is the target's greedy token
  after exactly its prefix (tests/trainer/test_tree.py checks it against greedy decoding).
- **The cache keeps the accepted path only.** The tree forward appended every node's keys
  and values after the context; the path's entries are copied down to follow the context
  (in place, per layer: path length × KV heads × head dim, twice, for each layer) and the
  rest cut off (`crop`). No second forward. The path's features come from the same forward
  (each node saw exactly its path, at its positions), so the next block's context is the
  chain's.
- **Not for a hybrid.** Gated DeltaNet's state is a running sum over one sequence: no mask
  makes it read a tree's branches apart. `TreeUnsupported` says so, and the eval reports
  "not measured" with that reason. Flash attention takes no arbitrary mask either.

With one child per node and block_size-1 nodes, the tree is the chain's block: the same
drafts, the same verification, the same τ (the tests check that too).
"""

from __future__ import annotations

import heapq
import inspect
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from trainer.evaluation.speculative import DecodeStats, has_linear_attention, layer_features
from trainer.model.vocab_logits import no_logits, target_logits

# (context features [L, n*H], anchor token, anchor position) -> log-probs [block_size-1, V]
LogProbProposer = Callable[[Tensor, int, int], Tensor]

# The attention implementations whose kernels take an arbitrary additive mask.
MASKABLE = ("sdpa", "eager")


class TreeUnsupported(Exception):
    """This target cannot verify a tree in one forward: why, in a few words."""


@dataclass
class DraftTree:
    """Node 0 is the root (the anchor); every other node's parent comes before it."""

    tokens: list[int]
    parents: list[int]  # -1 for the root
    depths: list[int]
    scores: list[float]  # the sum of the path's log-probs (0 at the root)
    children: list[dict[int, int]] = field(default_factory=list)  # token -> node, per node

    @classmethod
    def root(cls, anchor: int) -> DraftTree:
        return cls([anchor], [-1], [0], [0.0], [{}])

    @property
    def nodes(self) -> int:
        """Draft nodes: the root is the anchor, not a draft."""
        return len(self.tokens) - 1

    def add(self, token: int, parent: int, score: float) -> int:
        self.tokens.append(token)
        self.parents.append(parent)
        self.depths.append(self.depths[parent] + 1)
        self.scores.append(score)
        self.children.append({})
        self.children[parent][token] = len(self.tokens) - 1
        return len(self.tokens) - 1

    def ancestor_mask(self) -> Tensor:
        """bool [T, T]: m[i, j] is True where j is i or one of its ancestors."""
        n = len(self.tokens)
        m = torch.zeros(n, n, dtype=torch.bool)
        for i in range(n):
            m[i, i] = True
            if self.parents[i] >= 0:  # a parent's row is complete before its children's
                m[i] |= m[self.parents[i]]
        return m

    def accept(self, greedy: list[int]) -> list[int]:
        """The accepted path, root first: `greedy[i]` is the target's token after node i."""
        path = [0]
        while (child := self.children[path[-1]].get(greedy[path[-1]])) is not None:
            path.append(child)
        return path


def best_first_tree(
    anchor: int, log_probs: Tensor, nodes: int, max_children: int | None = None
) -> DraftTree:
    """The best `nodes`-node tree under `log_probs` [depth, V] (row k: draft position k+1).
    `max_children` caps each node's children (1: a chain of each position's top token)."""
    depth = log_probs.shape[0]
    width = min(nodes, log_probs.shape[1], max_children or nodes)
    top_lp, top_tok = log_probs.float().topk(width, dim=-1)  # sorted, best first
    lp, tok = top_lp.tolist(), top_tok.tolist()
    tree = DraftTree.root(anchor)
    # (-score, order, parent, depth of the candidate, its rank among its parent's children);
    # `order` settles equal scores by insertion, so the tree is the same on every run
    heap: list[tuple[float, int, int, int, int]] = []
    order = 0

    def offer(parent: int, at: int, rank: int) -> None:
        nonlocal order
        heapq.heappush(heap, (-(tree.scores[parent] + lp[at - 1][rank]), order, parent, at, rank))
        order += 1

    if depth:
        offer(0, 1, 0)
    while heap and tree.nodes < nodes:
        neg, _, parent, at, rank = heapq.heappop(heap)
        node = tree.add(tok[at - 1][rank], parent, -neg)
        if rank + 1 < width:
            offer(parent, at, rank + 1)  # the next sibling
        if at < depth:
            offer(node, at + 1, 0)  # the first child
    return tree


def drafter_log_probs(drafter: Any) -> LogProbProposer:
    """The drafter as at inference (anchor + mask tokens, one forward over the whole
    context), its log-probs at every mask position."""
    arch = drafter.arch
    bs, mask_id = arch.block_size, arch.mask_token_id

    @torch.no_grad()
    def propose(feats: Tensor, anchor: int, position: int) -> Tensor:
        block = torch.full((1, bs), mask_id, dtype=torch.long, device=feats.device)
        block[0, 0] = anchor
        context = drafter.fuse_context(feats[None].to(drafter.fc.weight.dtype))
        positions = position + torch.arange(bs, device=feats.device)[None]
        hidden = drafter(block, positions, context, None)
        return torch.log_softmax(drafter.logits(hidden[0, 1:]).float(), dim=-1)

    return propose


def tree_support(model: Any) -> str | None:
    """None when `model` can verify a tree in one forward; else why not, in a few words."""
    if has_linear_attention(model):
        return "hybrid target (Gated DeltaNet's state cannot verify a tree in one pass)"
    impl = getattr(model.config, "_attn_implementation", None) or "sdpa"
    if impl not in MASKABLE:
        return f"{impl} attention takes no tree mask (needs one of {', '.join(MASKABLE)})"
    return None


class TreeTarget:
    """A full-attention target with its cache of the accepted sequence: `prefill` the
    prompt, then per step `verify` a tree and `keep` its accepted path."""

    def __init__(self, model: Any, layer_ids: list[int]) -> None:
        if (why := tree_support(model)) is not None:
            raise TreeUnsupported(why)
        self.model, self.layer_ids = model, layer_ids
        first = next(model.parameters())
        self.device, self.dtype = first.device, first.dtype
        self.cache: Any = None
        self.length = 0  # tokens in self.cache
        self._tree_len = 0  # entries the last verify appended
        # transformers 5.24 renamed `past_key_values` to `cache`; 5.17 knows only the old one
        params = inspect.signature(model.forward).parameters
        self._cache_arg = "cache" if "cache" in params else "past_key_values"
        self.no_logits = no_logits(self.device)  # verify's logits: vocab_logits' one GEMM

    def _forward(self, ids: list[int], **kw: Any) -> Any:
        kw[self._cache_arg] = self.cache
        out = self.model(
            input_ids=torch.tensor([ids], device=self.device), use_cache=True,
            output_hidden_states=True, **kw,
        )  # fmt: skip
        # `cache` first: 5.25's `past_key_values` still answers, with a deprecation warning
        kept = getattr(out, "cache", None)
        self.cache = kept if kept is not None else getattr(out, "past_key_values", None)
        return out

    @torch.no_grad()
    def prefill(self, ids: list[int]) -> tuple[int, Tensor]:
        """(the target's greedy token after `ids`, their features [len(ids), n*H])."""
        out = self._forward(ids, logits_to_keep=1)
        self.length = len(ids)
        return int(out.logits[0, -1].argmax()), layer_features(out.hidden_states, self.layer_ids)[0]

    @torch.no_grad()
    def verify(self, tree: DraftTree) -> tuple[list[int], Tensor]:
        """(greedy[i]: the target's token after node i's path, every node's features)."""
        n, t = self.length, len(tree.tokens)
        allowed = torch.ones(t, n + t, dtype=torch.bool)
        allowed[:, n:] = tree.ancestor_mask()
        mask = torch.zeros(1, 1, t, n + t, dtype=self.dtype)
        mask.masked_fill_(~allowed, torch.finfo(self.dtype).min)
        positions = n + torch.tensor([tree.depths], device=self.device)
        out = self._forward(
            tree.tokens, attention_mask=mask.to(self.device), position_ids=positions,
            logits_to_keep=self.no_logits,
        )  # fmt: skip
        self._tree_len = t
        feats = layer_features(out.hidden_states, self.layer_ids)[0]
        return target_logits(self.model, out.hidden_states)[0].argmax(-1).tolist(), feats

    @torch.no_grad()
    def keep(self, path: list[int]) -> None:
        """Keep the nodes of `path` (root first) after the context, in that order."""
        n, k = self.length, len(path)
        index = n + torch.tensor(path, device=self.device)
        for layer in self.cache.layers:
            for kv in (layer.keys, layer.values):  # [batch, kv heads, seq, head dim]
                kv[..., n : n + k, :] = kv[..., index, :]
        if self._tree_len > k:
            self.cache.crop(-(self._tree_len - k))  # negative: remove this many
        self.length, self._tree_len = n + k, 0
        got = self.cache.get_seq_length()
        if got != self.length:  # a cache that cut elsewhere would verify against the wrong past
            raise RuntimeError(f"the target's cache holds {got} tokens after a step, not {n + k}")


def tree_decode(
    model: Any,
    layer_ids: list[int],
    propose: LogProbProposer,
    prompt: list[int],
    new_tokens: int,
    block_size: int,
    nodes: int,
    max_children: int | None = None,
    eos: int | None = None,
    cancel: Callable[[], bool] = lambda: False,
) -> tuple[list[int], DecodeStats]:
    """Decode `new_tokens` after `prompt` with a `nodes`-node draft tree per verify step
    (fewer tokens if the target says `eos`, or if `cancel()` says so before a step).
    Raises TreeUnsupported for a target that cannot verify a tree in one forward."""
    t0 = time.monotonic()
    stats = DecodeStats(block_size)
    target = TreeTarget(model, layer_ids)
    anchor, feats = target.prefill(list(prompt))
    n = len(prompt)  # the anchor sits at position n, the root of the next tree
    out = [anchor]
    while len(out) < new_tokens and anchor != eos and not cancel():
        log_probs = propose(feats, anchor, n)[: block_size - 1]
        tree = best_first_tree(anchor, log_probs, nodes, max_children)
        greedy, tree_feats = target.verify(tree)
        path = tree.accept(greedy)
        target.keep(path)
        feats = torch.cat([feats, tree_feats[path]])
        n += len(path)
        anchor = greedy[path[-1]]  # the bonus: the target's token after the last accepted
        out += [*(tree.tokens[i] for i in path[1:]), anchor]
        stats.accepted.append(len(path) - 1)
        if eos is not None and eos in out:
            out = out[: out.index(eos) + 1]
            break
    out = out[:new_tokens]
    stats.tokens = len(out)
    stats.seconds = time.monotonic() - t0
    return out, stats


def held_out_tree(
    model: Any,
    layer_ids: list[int],
    drafter: Any,
    prompts: list[list[int]],
    new_tokens: int,
    nodes: int,
    cancel: Callable[[], bool] = lambda: False,
) -> dict[str, Any]:
    """The held-out eval's DDTree figures over `prompts` (eval/step-N.json's `tree`):
    `DecodeStats.summary()` plus `nodes` and `seconds`, or `nodes`, `tau` None and
    `not_measured` (why) for a target that cannot verify a tree."""
    if (why := tree_support(model)) is not None:
        return {"nodes": nodes, "tau": None, "not_measured": why}
    t0 = time.monotonic()
    bs = drafter.arch.block_size
    propose = drafter_log_probs(drafter)
    stats = DecodeStats(bs)
    for prompt in prompts:
        if cancel():
            break
        _, one = tree_decode(model, layer_ids, propose, prompt, new_tokens, bs, nodes,
                             cancel=cancel)  # fmt: skip
        stats.add(one)
    return {"nodes": nodes, **stats.summary(), "seconds": round(time.monotonic() - t0, 3)}


def describe_tree(tree: dict[str, Any] | None) -> str:
    """The tree's clause of an eval's line (held_out_tree's figures); '' without a tree."""
    if not tree:
        return ""
    if tree.get("tau") is None:
        why = tree.get("not_measured") or "no verify step ran"
        return f"; DDTree at {tree['nodes']} nodes not measured: {why}"
    return f"; DDTree τ {tree['tau']:.2f} at {tree['nodes']} nodes ({tree['seconds']:.1f}s)"

"""DDTree (trainer/evaluation/tree.py) on the tiny random Qwen3 (fp32, CPU), against the chain
loop and against brute force (a whole forward per prefix, no cache, no mask of ours):

- a tree of one node per position is the chain's block: the same tokens, the same accepted
  drafts at every step, the same τ;
- a hand-built tree is verified in one forward as if each node's path were decoded alone,
  and accepts exactly the path the target's greedy decoding takes; a whole decode with any
  tree is the target's greedy decoding (lossless);
- the tree is the budget's best: the `nodes` best-scoring paths, added best first;
- a hybrid target is refused by name, and the held-out figures say it was not measured.
"""

from __future__ import annotations

import itertools
import random

import pytest
import torch
from tiny_drafter import arch_over
from transformers import AutoModelForCausalLM

from trainer.evaluation.speculative import drafter_proposer, speculative_decode, target_pass
from trainer.evaluation.tree import (
    DraftTree,
    TreeTarget,
    TreeUnsupported,
    best_first_tree,
    drafter_log_probs,
    held_out_tree,
    tree_decode,
)
from trainer.model.drafter import DFlashDrafter
from trainer.targets.load import default_target_layer_ids, read_target_info

BS = 6
NEW = 30
PROMPT = [9, 8, 7, 6, 5, 4]


def load(where):
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(where, dtype=torch.float32).eval()
    info = read_target_info(where)
    return model, default_target_layer_ids(info.num_layers, 2), info


@pytest.fixture(scope="module")
def target(tiny_target_dir):
    """The tiny random Qwen3, its weights drawn again at std 0.1: at the builtin's 0.02 (its
    embeddings tied) it repeats the last token whatever came before, and no error of mask,
    positions or cache would change what it decodes. At 0.1 every token depends on the
    context."""
    model, layer_ids, info = load(tiny_target_dir)
    draw = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" not in name:
                p.copy_(torch.randn(p.shape, generator=draw) * 0.1)
    return model, layer_ids, info


def drafter_for(model, layer_ids, info, seed=0):
    """A drafter at its own init (seeded): what training starts from."""
    torch.manual_seed(seed)
    arch = arch_over(info, layer_ids, BS, info.vocab_size - 1)
    embed = model.get_input_embeddings().weight
    return DFlashDrafter(arch, embed, model.get_output_embeddings().weight).eval()


def greedy(model, layer_ids, prompt, n):
    """Brute force: one token at a time, a whole forward each."""
    seq = list(prompt)
    for _ in range(n):
        seq.append(target_pass(model, seq, layer_ids)[0][-1])
    return seq


def peaked(ref, vocab, seed, wrong_share=0.7):
    """Log-probs that put each position's best on the greedy continuation `ref`, except at
    one random position of most blocks (its best is another token, the true one second), so
    a chain stops there and a tree may still find the way."""
    rng = random.Random(seed)

    def propose(_feats, _anchor, position):
        logits = torch.randn(BS - 1, vocab, generator=torch.Generator().manual_seed(position))
        truth = ref[position + 1 : position + BS]
        for k, tok in enumerate(truth):
            logits[k, tok] = 20.0
        if rng.random() < wrong_share:
            k = rng.randrange(len(truth))
            decoy = (truth[k] + 1 + rng.randrange(5)) % vocab
            logits[k, decoy] = 25.0
        return torch.log_softmax(logits, dim=-1)

    return propose


def as_chain(propose):
    """The chain's proposer from the same distributions: the best token at each position."""
    return lambda feats, anchor, position: propose(feats, anchor, position).argmax(-1).tolist()


def test_a_tree_of_one_node_per_position_is_the_chain(target):
    model, layer_ids, info = target
    drafter = drafter_for(model, layer_ids, info)
    chain_out, chain = speculative_decode(
        model, layer_ids, drafter_proposer(drafter), PROMPT, NEW, BS
    )
    tree_out, tree = tree_decode(
        model, layer_ids, drafter_log_probs(drafter), PROMPT, NEW, BS, nodes=BS - 1, max_children=1
    )
    assert tree_out == chain_out and tree.accepted == chain.accepted and tree.tau == chain.tau

    # A proposer that is often right, so the steps accept every length, not just 0.
    ref = greedy(model, layer_ids, PROMPT, NEW + 2 * BS)
    chain_out, chain = speculative_decode(
        model, layer_ids, as_chain(peaked(ref, info.vocab_size, 5)), PROMPT, NEW, BS
    )
    tree_out, tree = tree_decode(
        model, layer_ids, peaked(ref, info.vocab_size, 5), PROMPT, NEW, BS, BS - 1, max_children=1
    )
    assert chain_out == ref[len(PROMPT) : len(PROMPT) + NEW]
    assert tree_out == chain_out and tree.accepted == chain.accepted, (tree.accepted, chain)
    assert len(set(chain.accepted)) > 2 and tree.tau == chain.tau
    assert tree.per_position() == chain.per_position()


def tokens_of(tree: DraftTree, node: int) -> list[int]:
    """The node's path, root first, as tokens."""
    path = []
    while node >= 0:
        path.append(tree.tokens[node])
        node = tree.parents[node]
    return path[::-1]


def test_a_hand_built_tree_verifies_each_path_alone_and_accepts_the_greedy_one(target):
    model, layer_ids, info = target
    ref = greedy(model, layer_ids, PROMPT, 8)
    p = len(PROMPT)
    wrong = [(t + 3) % info.vocab_size for t in ref[p : p + 4]]
    target_ = TreeTarget(model, layer_ids)
    anchor, _ = target_.prefill(PROMPT)
    assert anchor == ref[p]

    tree = DraftTree.root(anchor)
    decoy = tree.add(wrong[1], 0, 0.0)  # a wrong first draft ...
    tree.add(ref[p + 2], decoy, 0.0)  # ... whose child is the right second token
    right1 = tree.add(ref[p + 1], 0, 0.0)
    tree.add(wrong[2], right1, 0.0)
    right2 = tree.add(ref[p + 2], right1, 0.0)
    tree.add(wrong[3], right2, 0.0)
    tree.add(wrong[0], 0, 0.0)
    got, feats = target_.verify(tree)

    for node in range(len(tree.tokens)):  # every branch, the wrong ones too
        alone, alone_feats = target_pass(model, PROMPT + tokens_of(tree, node), layer_ids)
        assert got[node] == alone[-1], node
        assert torch.allclose(feats[node], alone_feats[-1], atol=1e-4), node

    path = tree.accept(got)
    assert path == [0, right1, right2] and got[right2] == ref[p + 3]
    target_.keep(path)
    assert target_.length == p + 3
    # The cache now holds the prompt and the path: a chain verified on it is decoding alone.
    after = DraftTree.root(ref[p + 3])
    after.add(ref[p + 4], 0, 0.0)
    got, _ = target_.verify(after)
    assert got == ref[p + 4 : p + 6]


def fed_the_prefix(model, layer_ids, ref, propose):
    """`propose`, checking first that the drafter's context is the target's features of
    exactly the prefix before the anchor (a whole forward, no cache), and the anchor the
    greedy token there: what a kept path's cache entries and features must give."""

    def checked(feats, anchor, position):
        assert anchor == ref[position]
        want = target_pass(model, ref[:position], layer_ids)[1]
        assert feats.shape == want.shape and torch.allclose(feats, want, atol=1e-4), position
        return propose(feats, anchor, position)

    return checked


@pytest.mark.parametrize("nodes", [1, 16, 64])
def test_decoding_with_any_tree_is_the_targets_greedy_decoding(target, nodes):
    model, layer_ids, info = target
    ref = greedy(model, layer_ids, PROMPT, NEW + 2 * BS)
    want = ref[len(PROMPT) : len(PROMPT) + NEW]
    drafter = drafter_for(model, layer_ids, info, seed=nodes)
    out, _ = tree_decode(model, layer_ids, drafter_log_probs(drafter), PROMPT, NEW, BS, nodes)
    assert out == want
    propose = fed_the_prefix(model, layer_ids, ref, peaked(ref, info.vocab_size, nodes))
    out, stats = tree_decode(model, layer_ids, propose, PROMPT, NEW, BS, nodes)
    assert out == want and stats.tokens == NEW
    # A tree of one node accepts at most that node; a wider one gets past every decoy the
    # chain stops at (the true token is second best there): the whole block, every step.
    assert max(stats.accepted) == 1 if nodes == 1 else set(stats.accepted) == {BS - 1}


def all_paths(log_probs: torch.Tensor, width: int) -> dict[tuple[int, ...], float]:
    """Every path of depth 1 .. D through each position's `width` best tokens: its score."""
    depth, _ = log_probs.shape
    top = [log_probs[k].topk(width).indices.tolist() for k in range(depth)]
    out = {}
    for d in range(1, depth + 1):
        for path in itertools.product(*top[:d]):
            out[path] = sum(float(log_probs[k, t]) for k, t in enumerate(path))
    return out


@pytest.mark.parametrize("width", [None, 2, 1])
def test_the_tree_is_the_best_paths_within_the_budget_added_best_first(width):
    torch.manual_seed(1)
    log_probs = torch.log_softmax(torch.randn(3, 6) * 2, dim=-1)
    scored = all_paths(log_probs, width or 6)
    for nodes in (1, 2, 5, 17, 40, len(scored), len(scored) + 50):
        tree = best_first_tree(11, log_probs, nodes, max_children=width)
        assert tree.nodes == min(nodes, len(scored))
        paths = {tuple(tokens_of(tree, i)[1:]) for i in range(1, len(tree.tokens))}
        best = sorted(scored, key=scored.__getitem__, reverse=True)[: tree.nodes]
        assert paths == set(best), nodes
        assert tree.scores[1:] == sorted(tree.scores[1:], reverse=True)  # best first
        for i in range(1, len(tree.tokens)):
            assert tree.scores[i] == pytest.approx(scored[tuple(tokens_of(tree, i)[1:])])
            assert tree.depths[i] == len(tokens_of(tree, i)) - 1 <= 3
    chain = best_first_tree(11, log_probs, 3, max_children=1)
    assert chain.tokens == [11, *log_probs.argmax(-1).tolist()] and chain.parents == [-1, 0, 1, 2]


def test_the_ancestor_mask():
    tree = DraftTree.root(1)
    a = tree.add(2, 0, 0.0)
    b = tree.add(3, 0, 0.0)
    c = tree.add(4, a, 0.0)
    m = tree.ancestor_mask()
    assert m.tolist() == [
        [True, False, False, False],
        [True, True, False, False],
        [True, False, True, False],
        [True, True, False, True],
    ]
    assert (a, b, c) == (1, 2, 3)


def test_a_hybrid_target_is_not_measured_and_says_why(tiny_hybrid_text_dir):
    model, layer_ids, info = load(tiny_hybrid_text_dir)
    drafter = drafter_for(model, layer_ids, info)
    with pytest.raises(TreeUnsupported, match="hybrid target"):
        tree_decode(model, layer_ids, drafter_log_probs(drafter), PROMPT, NEW, BS, 16)
    got = held_out_tree(model, layer_ids, drafter, [PROMPT], NEW, 16)
    assert got["tau"] is None and got["nodes"] == 16
    assert got["not_measured"].startswith("hybrid target")

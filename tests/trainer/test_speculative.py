"""The speculative decoding loop, its target cached across steps, against brute force (a
whole forward per token, no cache), on the tiny Qwen3 and the tiny Qwen3.5 hybrid (fp32, CPU):

- whatever the drafter proposes, the tokens are the target's own greedy decoding (lossless);
- the drafts accepted at each step are those a brute-force check finds: the drafter's block
  from the target's features of exactly the prefix, matched against greedy decoding;
- a drafter that copies the target's greedy tokens reaches τ = block size.
"""

from __future__ import annotations

import random

import pytest
import torch
from tiny_drafter import arch_over
from transformers import AutoModelForCausalLM

from trainer.evaluation.speculative import (
    DecodeStats,
    drafter_proposer,
    has_linear_attention,
    speculative_decode,
    target_pass,
)
from trainer.model.drafter import DFlashDrafter
from trainer.targets.load import default_target_layer_ids, read_target_info

BS = 6
NEW = 30


@pytest.fixture(scope="module", params=["qwen3", "qwen3.5-hybrid"])
def target(request):
    """Both cache kinds: full attention (cut back after a rejection) and the Gated DeltaNet
    hybrid (verified on a copy, the accepted tokens fed to the kept cache)."""
    where = request.getfixturevalue(
        "tiny_target_dir" if request.param == "qwen3" else "tiny_hybrid_text_dir"
    )
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(where, dtype=torch.float32).eval()
    info = read_target_info(where)
    assert has_linear_attention(model) == (request.param != "qwen3")
    return model, default_target_layer_ids(info.num_layers, 2), info


def greedy(model, layer_ids, prompt, n):
    """Brute force: one token at a time, a whole forward each."""
    seq = list(prompt)
    for _ in range(n):
        seq.append(target_pass(model, seq, layer_ids)[0][-1])
    return seq


def brute_force_accepted(model, layer_ids, propose, ref, start, n):
    """The accepted drafts per step, each block proposed from a pass over exactly its prefix."""
    accepted, p, produced = [], start, 1
    while produced < n:
        feats = target_pass(model, ref[:p], layer_ids)[1]
        drafts = propose(feats, ref[p], p)[: BS - 1]
        a = 0
        while a < len(drafts) and drafts[a] == ref[p + 1 + a]:
            a += 1
        accepted.append(a)
        p += a + 1
        produced += a + 1
    return accepted


def test_a_real_drafter_changes_nothing_but_the_speed(target):
    model, layer_ids, info = target
    arch = arch_over(info, layer_ids, BS, info.vocab_size - 1)
    embed = model.get_input_embeddings().weight
    drafter = DFlashDrafter(arch, embed, model.get_output_embeddings().weight).eval()
    prompt = [5, 17, 42, 7, 99, 3, 11]
    ref = greedy(model, layer_ids, prompt, NEW)
    propose = drafter_proposer(drafter)
    out, stats = speculative_decode(model, layer_ids, propose, prompt, NEW, BS)
    assert out == ref[len(prompt) :]
    assert stats.accepted == brute_force_accepted(model, layer_ids, propose, ref, len(prompt), NEW)
    assert stats.tokens == NEW and stats.tau is not None and 1.0 <= stats.tau <= BS


def test_accepted_drafts_match_brute_force_and_a_copying_drafter_reaches_the_block_size(target):
    model, layer_ids, _ = target
    prompt = [9, 8, 7, 6, 5, 4]
    ref = greedy(model, layer_ids, prompt, NEW + 2 * BS)
    rng = random.Random(3)

    def copying(_feats, _anchor, position):
        return ref[position + 1 : position + BS]

    def sometimes_wrong(_feats, _anchor, position):
        drafts = list(ref[position + 1 : position + BS])
        k = rng.randrange(BS)  # k == BS - 1: all right
        if k < len(drafts):
            drafts[k] = (drafts[k] + 1) % 300
        return drafts

    out, stats = speculative_decode(model, layer_ids, copying, prompt, NEW, BS)
    assert out == ref[len(prompt) : len(prompt) + NEW]
    assert set(stats.accepted) == {BS - 1} and stats.tau == BS
    assert stats.per_position() == [1.0] * (BS - 1)

    rng.seed(3)
    out, stats = speculative_decode(model, layer_ids, sometimes_wrong, prompt, NEW, BS)
    rng.seed(3)
    brute = brute_force_accepted(model, layer_ids, sometimes_wrong, ref, len(prompt), NEW)
    assert out == ref[len(prompt) : len(prompt) + NEW]
    assert stats.accepted == brute and len(set(brute)) > 2, brute
    assert stats.tau == pytest.approx(sum(a + 1 for a in brute) / len(brute))
    shares = stats.per_position()
    assert shares == sorted(shares, reverse=True) and shares[-1] < 1.0


def test_the_stats_of_several_prompts_add_up():
    a, b = DecodeStats(4, [3, 0], 6, 1.0), DecodeStats(4, [1], 3, 0.5)
    a.add(b)
    assert a.accepted == [3, 0, 1] and a.tau == pytest.approx(7 / 3)
    assert a.per_position() == [pytest.approx(2 / 3), pytest.approx(1 / 3), pytest.approx(1 / 3)]
    assert a.summary()["tok_s"] == 6.0

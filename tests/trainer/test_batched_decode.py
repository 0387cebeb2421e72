"""The held-out prompts decoded as one batch (trainer/evaluation/batched.py) against
speculative.py's loop, one prompt at a time, which stays the reference: on the tiny Qwen3 in
fp32 on the CPU, prompts of different lengths, every row's tokens, drafts, accepted drafts per
step, per-position acceptance and τ equal, token for token. The hybrid target keeps the
reference loop itself (evaluation/decoding.py), and says so."""

from __future__ import annotations

import pytest
import torch
from tiny_drafter import arch_over
from transformers import AutoModelForCausalLM

from trainer.evaluation.batched import BatchedDecoder, DrafterBlocks
from trainer.evaluation.decoding import HeldOutDecode
from trainer.evaluation.speculative import drafter_proposer, speculative_decode, target_pass
from trainer.model.drafter import DFlashDrafter
from trainer.targets.load import default_target_layer_ids, read_target_info

BS = 6
NEW = 30
# Different lengths: the batch pads on the left, and rows finish at different steps.
PROMPTS = [[5, 17, 42, 7, 99, 3, 11], [9, 8, 7], [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12], [300, 2]]


def load(where):
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(where, dtype=torch.float32).eval()
    info = read_target_info(where)
    return model, default_target_layer_ids(info.num_layers, 2), info


@pytest.fixture(scope="module")
def qwen3(tiny_target_dir):
    return load(tiny_target_dir)


def make_drafter(model, layer_ids, info, seed=0):
    """A drafter whose weights are large enough that its proposals depend on the context and
    the positions (the 0.02 init proposes nearly the same token everywhere)."""
    arch = arch_over(info, layer_ids, BS, info.vocab_size - 1)
    embed = model.get_input_embeddings().weight
    drafter = DFlashDrafter(arch, embed, model.get_output_embeddings().weight).eval()
    reseed(drafter, seed)
    return drafter


@torch.no_grad()
def reseed(drafter, seed):
    g = torch.Generator().manual_seed(seed)
    for p in drafter.parameters():
        if p.requires_grad and p.dim() == 2:
            p.copy_(torch.randn(p.shape, generator=g) * 0.2)


def reference(model, layer_ids, propose_for, prompts, eos=None):
    """speculative_decode per prompt: (tokens, accepted per step) of each."""
    runs = [
        speculative_decode(model, layer_ids, propose_for(i), p, NEW, BS, eos=eos)
        for i, p in enumerate(prompts)
    ]
    return [out for out, _ in runs], [stats.accepted for _, stats in runs]


def greedy(model, layer_ids, prompt, n):
    seq = list(prompt)
    for _ in range(n):
        seq.append(target_pass(model, seq, layer_ids)[0][-1])
    return seq


def wrong_at(position):
    """The draft a copying proposer gets wrong at this anchor position (BS - 1 or more:
    none): with these prompts, every acceptance length happens."""
    return position % 7


class CopyingBlocks:
    """Proposes each row's greedy continuation with one draft changed where `wrong_at` says:
    every acceptance length from 0 to BS - 1 happens. Tensor operations only, like the drafter."""

    def __init__(self, seqs):
        longest = max(len(s) for s in seqs)
        self.table = torch.tensor([s + [0] * (longest - len(s)) for s in seqs])

    def context(self, feats):
        return feats[..., :1]

    def propose(self, ctx, ctx_positions, ctx_valid, anchors, at):
        drafts = self.table.gather(1, at[:, None] + 1 + torch.arange(BS - 1))
        wrong = torch.arange(BS - 1)[None] == wrong_at(at)[:, None]
        return torch.where(wrong, (drafts + 1) % 300, drafts)


def copying(seq):
    """CopyingBlocks's rule for one prompt, as speculative.py's Proposer."""

    def propose(_feats, _anchor, position):
        drafts = list(seq[position + 1 : position + BS])
        k = wrong_at(position)
        if k < len(drafts):
            drafts[k] = (drafts[k] + 1) % 300
        return drafts

    return propose


def test_a_real_drafter_batched_proposes_and_accepts_what_it_does_one_prompt_at_a_time(qwen3):
    model, layer_ids, info = qwen3
    drafter = make_drafter(model, layer_ids, info)
    alone: dict[int, list[list[int]]] = {i: [] for i in range(len(PROMPTS))}

    def recording(i):
        propose = drafter_proposer(drafter)

        def call(feats, anchor, position):
            alone[i].append(drafts := propose(feats, anchor, position))
            return drafts

        return call

    tokens, accepted = reference(model, layer_ids, recording, PROMPTS)
    blocks = DrafterBlocks(drafter)
    batched: list[list[list[int]]] = []  # per step, per row
    real = blocks.propose

    def record(*args):
        drafts = real(*args)
        batched.append(drafts.tolist())
        return drafts

    blocks.propose = record
    got = BatchedDecoder(model, layer_ids, blocks, PROMPTS, NEW, BS).run()

    assert got.tokens == tokens
    assert [r.accepted for r in got.rows] == accepted
    # Each row's drafts at the steps it was still decoding: the drafter's own, exactly.
    for i in range(len(PROMPTS)):
        assert [step[i] for step in batched[: len(alone[i])]] == alone[i], i
    assert len({tuple(d) for steps in alone.values() for d in steps}) > 20  # not one block
    assert all(len(t) == NEW for t in got.tokens)


def test_every_acceptance_length_and_the_totals_equal_the_reference(qwen3):
    model, layer_ids, _ = qwen3
    seqs = [greedy(model, layer_ids, p, NEW + 2 * BS) for p in PROMPTS]
    tokens, accepted = reference(model, layer_ids, lambda i: copying(seqs[i]), PROMPTS)
    got = BatchedDecoder(model, layer_ids, CopyingBlocks(seqs), PROMPTS, NEW, BS).run()

    assert (
        got.tokens
        == tokens
        == [s[len(p) : len(p) + NEW] for s, p in zip(seqs, PROMPTS, strict=True)]
    )
    assert [r.accepted for r in got.rows] == accepted
    assert {a for steps in accepted for a in steps} == set(range(BS))  # 0 .. BS-1 all happen
    # Rows finish at different steps; the rows' steps, in prompt order, are the eval's.
    assert len({len(steps) for steps in accepted}) > 1
    total = got.total()
    want = [a for steps in accepted for a in steps]
    assert total.accepted == want and total.tokens == len(PROMPTS) * NEW
    assert total.tau == pytest.approx(sum(a + 1 for a in want) / len(want))
    assert total.per_position() == [sum(a >= k for a in want) / len(want) for k in range(1, BS)]


def test_hfs_eager_attention_takes_the_masks_as_added_values(tiny_target_dir):
    """SDPA takes the boolean masks; HF's eager attention adds its mask to the scores."""
    model = AutoModelForCausalLM.from_pretrained(
        tiny_target_dir, dtype=torch.float32, attn_implementation="eager"
    ).eval()
    layer_ids = default_target_layer_ids(read_target_info(tiny_target_dir).num_layers, 2)
    seqs = [greedy(model, layer_ids, p, NEW + 2 * BS) for p in PROMPTS]
    tokens, accepted = reference(model, layer_ids, lambda i: copying(seqs[i]), PROMPTS)
    decoder = BatchedDecoder(model, layer_ids, CopyingBlocks(seqs), PROMPTS, NEW, BS)
    assert decoder.additive
    got = decoder.run()
    assert got.tokens == tokens and [r.accepted for r in got.rows] == accepted


def test_eos_ends_its_row_as_in_the_reference(qwen3):
    model, layer_ids, _ = qwen3
    seqs = [greedy(model, layer_ids, p, NEW + 2 * BS) for p in PROMPTS]
    eos = seqs[1][len(PROMPTS[1]) + 9]  # row 1 says it at its 10th token
    tokens, accepted = reference(model, layer_ids, lambda i: copying(seqs[i]), PROMPTS, eos)
    got = BatchedDecoder(model, layer_ids, CopyingBlocks(seqs), PROMPTS, NEW, BS, eos=eos).run()
    assert got.tokens == tokens and [r.accepted for r in got.rows] == accepted
    assert len(tokens[1]) <= 10 and tokens[1][-1] == eos


def test_one_decoder_run_again_reads_the_drafters_new_weights(qwen3):
    """The eval thread keeps one decoder for the run and copies each step's weights into its
    drafter in place: every run starts clean and decodes with the weights of now."""
    model, layer_ids, info = qwen3
    drafter = make_drafter(model, layer_ids, info, seed=1)
    decode = HeldOutDecode(model, drafter, PROMPTS, NEW)
    first = decode.run()
    reseed(drafter, 2)
    second = decode.run()
    propose = drafter_proposer(drafter)
    tokens, accepted = reference(model, layer_ids, lambda _: propose, PROMPTS)
    assert decode.batch and second.tokens == tokens == first.tokens  # lossless: the same
    assert [r.accepted for r in second.rows] == accepted


def test_on_a_cpu_the_step_is_not_captured_and_says_why(qwen3):
    model, layer_ids, info = qwen3
    decode = HeldOutDecode(model, make_drafter(model, layer_ids, info), PROMPTS, NEW)
    assert not decode.graphs.enabled and decode.graphs.captured == 0
    assert decode.graphs.off_reason == "the eval runs on cpu, not a CUDA device"
    off = HeldOutDecode(model, make_drafter(model, layer_ids, info), PROMPTS, NEW, "off")
    assert off.graphs.off_reason == "eval.cuda_graphs = off"


def test_a_cancel_stops_between_steps_with_what_each_row_has(qwen3):
    model, layer_ids, _ = qwen3
    seqs = [greedy(model, layer_ids, p, NEW + 2 * BS) for p in PROMPTS]
    calls = iter(range(100))
    got = BatchedDecoder(model, layer_ids, CopyingBlocks(seqs), PROMPTS, NEW, BS).run(
        cancel=lambda: next(calls) >= 3
    )
    assert all(len(r.accepted) == 3 for r in got.rows)
    assert all(0 < len(t) < NEW and s[len(p) :][: len(t)] == t
               for t, s, p in zip(got.tokens, seqs, PROMPTS, strict=True))  # fmt: skip


def test_the_hybrid_keeps_the_reference_loop_and_its_numbers(tiny_hybrid_text_dir):
    model, layer_ids, info = load(tiny_hybrid_text_dir)
    drafter = make_drafter(model, layer_ids, info)
    with pytest.raises(ValueError, match="Gated DeltaNet"):
        BatchedDecoder(model, layer_ids, DrafterBlocks(drafter), PROMPTS, NEW, BS)
    decode = HeldOutDecode(model, drafter, PROMPTS, NEW)
    assert not decode.batch and not decode.graphs.enabled
    assert decode.graphs.off_reason is not None and "one at a time" in decode.graphs.off_reason
    got = decode.run()
    propose = drafter_proposer(drafter)
    tokens, accepted = reference(model, layer_ids, lambda _: propose, PROMPTS)
    assert got.tokens == tokens and [r.accepted for r in got.rows] == accepted
    want = [a for steps in accepted for a in steps]
    assert got.total().tau == pytest.approx(sum(a + 1 for a in want) / len(want))


def test_grouped_query_attention_equals_hf_sdpa_with_a_mask():
    """The eval's masked GQA attention (query heads side by side, the mask tiled) gives HF's
    SDPA output (keys and values repeated per head) for every head, row and mask."""
    import torch
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    from trainer.targets.grouped_attention import grouped_or, grouped_query_applies

    g = torch.Generator().manual_seed(0)
    for B, Hq, Hkv, L, S in [(3, 8, 2, 5, 40), (2, 4, 4, 16, 33), (1, 6, 3, 1, 9)]:
        q = torch.randn(B, Hq, L, 16, generator=g)
        k, v = torch.randn(B, Hkv, S, 16, generator=g), torch.randn(B, Hkv, S, 16, generator=g)
        mask = torch.rand(B, 1, L, S, generator=g) < 0.6
        mask[..., 0] = True  # every query sees something
        module = torch.nn.Module()
        module.num_key_value_groups = Hq // Hkv
        want, _ = sdpa_attention_forward(module, q, k, v, mask, scaling=0.25)
        have, _ = grouped_or(sdpa_attention_forward, module, q, k, v, mask, scaling=0.25)
        assert grouped_query_applies(q, k, mask) == (Hq > Hkv)
        assert have.shape == want.shape == (B, L, Hq, 16)
        assert torch.allclose(have, want, atol=1e-5, rtol=1e-5)

"""The eval's logits from one GEMM (trainer/model/vocab_logits.py), against the product as written
and against HF's own lm_head, on the tiny Qwen3 and the tiny Qwen3.5 hybrid (fp32, CPU)."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM

from trainer.model.vocab_logits import no_logits, target_logits, vocab_logits


def test_a_strided_slice_of_rows_gives_the_product_as_written():
    torch.manual_seed(0)
    hidden = torch.randn(3, 7, 32)[:, 1:]  # the drafter's `hidden[:, 1:]`: not contiguous
    weight = torch.randn(50, 32)
    out = vocab_logits(hidden, weight)
    assert out.shape == (3, 6, 50)
    torch.testing.assert_close(out, hidden @ weight.t())
    bias = torch.randn(50)
    torch.testing.assert_close(vocab_logits(hidden, weight, bias), hidden @ weight.t() + bias)


@pytest.mark.parametrize("which", ["tiny_target_dir", "tiny_hybrid_text_dir"])
def test_the_target_computes_no_logits_and_ours_equal_its_own(which, request):
    where = request.getfixturevalue(which)
    model = AutoModelForCausalLM.from_pretrained(where, dtype=torch.float32).eval()
    ids = torch.tensor([[5, 9, 2, 7, 11, 3]])
    with torch.no_grad():
        theirs = model(input_ids=ids, output_hidden_states=True, use_cache=False)
        none = model(
            input_ids=ids, output_hidden_states=True, use_cache=False,
            logits_to_keep=no_logits(ids.device),
        )  # fmt: skip
    assert none.logits.shape[1] == 0  # HF's lm_head multiplied nothing
    ours = target_logits(model, none.hidden_states)
    torch.testing.assert_close(ours, theirs.logits, rtol=1e-5, atol=1e-5)
    assert torch.equal(ours.argmax(-1), theirs.logits.argmax(-1))

"""What a drafter is worth: speculative decoding, held-out τ offline and during training, export."""

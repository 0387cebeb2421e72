"""Training data: JSONL to tokenized samples, packed rows, the held-out split, the synthetic
sets."""

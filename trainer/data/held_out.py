"""The held-out split: samples a run never trains on, chosen by sample id.

A sample's id is a hash of its token ids, so the split depends neither on the data file's
order nor on the shuffle, a restart makes the same one, and `python -m trainer eval` finds
the same samples from the same data and tokenizer. Every copy of a held-out sample is held
out: a duplicate left in training would leak it.
"""

from __future__ import annotations

import hashlib
from array import array

from trainer.data.samples import Sample


def sample_id(sample: Sample) -> str:
    return hashlib.blake2b(array("q", sample.input_ids).tobytes(), digest_size=12).hexdigest()


def split_held_out(samples: list[Sample], n: int) -> tuple[list[Sample], list[Sample]]:
    """(the samples to train on, in their order; the held-out ones, by id). `n` distinct ids
    (fewer when there are fewer); at least one sample is always left to train on."""
    if n <= 0:
        return samples, []
    ids = [sample_id(s) for s in samples]
    distinct = sorted(set(ids))
    held_ids = set(distinct[: min(n, max(0, len(distinct) - 1))])
    train = [s for s, i in zip(samples, ids, strict=True) if i not in held_ids]
    held: dict[str, Sample] = {}
    for s, i in zip(samples, ids, strict=True):
        if i in held_ids:
            held.setdefault(i, s)
    return train, [held[i] for i in sorted(held)]

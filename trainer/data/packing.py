"""Sequence packing: several documents per row, none of them seeing another.

Chat data is mostly short (a few hundred tokens) with a long tail; padded to a 4096 bucket,
most of a batch would be padding. Packing fills each row with whole documents instead:

- `plan_packs`: best-fit-decreasing over the sample lengths into rows of the largest bucket
  (each row then takes the smallest bucket that holds it, so the last, part-filled rows of
  an epoch stay short). Samples were truncated to the largest bucket when they were loaded
  (and counted then), so every sample fits in a row: nothing is dropped.
- `epoch_pack_batches`: the epoch's order, deterministic for (seed, epoch): equal-length
  samples are shuffled before packing (which documents share a row changes per epoch, the
  number of rows does not: best fit depends on the lengths only), then the rows are
  shuffled and grouped into batches of one bucket. A bucket's last partial batch is topped
  up by wrapping around that bucket's rows, as unpacked batches are, so every batch has
  exactly `batch_size` rows.
- `collate_packs`: the tensors, with `doc_ids` (which document each token belongs to, -1
  on padding) and `position_ids` (restarting at 0 at each document, so RoPE sees each
  document as if it were alone; padding continues the last document's count, so it starts
  no document of its own).

The isolation itself lives where attention happens: the target's forward (given
`position_ids`), the drafter's mask (`trainer.model.attention`, given `doc_ids`), anchors and
labels (`trainer.model.blocks`, a block's targets end at its document's end).
"""

from __future__ import annotations

import bisect
import random

import torch

from trainer.data.samples import Batch, Sample, pick_bucket

Row = list[int]  # sample indices, in the order they sit in the row


def plan_packs(lengths: list[int], order: list[int], capacity: int) -> list[Row]:
    """Best-fit-decreasing: each sample (taken longest first, `order` breaking ties) goes to
    the fullest row it still fits in, else a new row. Every sample must fit (<= capacity)."""
    ranked = sorted(order, key=lambda i: -lengths[i])  # stable: ties keep `order`
    rows: list[Row] = []
    # (room left, row number) of every open row, sorted: the best fit is the first entry
    # with room >= length, found by bisection.
    rooms: list[tuple[int, int]] = []
    for i in ranked:
        n = lengths[i]
        if n > capacity:
            raise ValueError(f"packing: a sample of {n} tokens exceeds the row of {capacity}")
        at = bisect.bisect_left(rooms, (n, -1))
        if at < len(rooms):
            room, r = rooms.pop(at)
        else:
            room, r = capacity, len(rows)
            rows.append([])
        rows[r].append(i)
        if room - n > 0:
            bisect.insort(rooms, (room - n, r))
    return rows


def _bucket_rows(
    samples: list[Sample], buckets: list[int], order: list[int]
) -> dict[int, list[Row]]:
    lengths = [len(s.input_ids) for s in samples]
    rows = plan_packs(lengths, order, max(buckets))
    by_bucket: dict[int, list[Row]] = {b: [] for b in sorted(buckets)}
    for row in rows:
        by_bucket[pick_bucket(sum(lengths[i] for i in row), buckets)].append(row)
    return by_bucket


def packed_batches_per_epoch(samples: list[Sample], buckets: list[int], batch_size: int) -> int:
    by_bucket = _bucket_rows(samples, buckets, list(range(len(samples))))
    return sum(-(-len(rows) // batch_size) for rows in by_bucket.values())


def epoch_pack_batches(
    samples: list[Sample],
    buckets: list[int],
    batch_size: int,
    seed: int,
    epoch: int,
    *,
    shuffle: bool = True,
) -> list[list[Row]]:
    """The epoch's batches, each a list of `batch_size` rows of one bucket."""
    if batch_size < 1:
        raise ValueError(f"train.batch_size: must be at least 1, got {batch_size}")
    rng = random.Random(f"dflash-pack:{seed}:{epoch}")
    order = list(range(len(samples)))
    if shuffle:
        rng.shuffle(order)
    batches: list[list[Row]] = []
    for rows in _bucket_rows(samples, buckets, order).values():
        if not rows:
            continue
        if shuffle:
            rng.shuffle(rows)
        for start in range(0, len(rows), batch_size):
            batches.append([rows[(start + j) % len(rows)] for j in range(batch_size)])
    if shuffle:
        rng.shuffle(batches)
    return batches


def planned_padding(
    samples: list[Sample], buckets: list[int], batch_size: int, packing: bool
) -> float:
    """The padding share of epoch 0's batch positions, as the pipeline will collate them
    (each batch at the bucket of its longest row, top-ups included)."""
    lengths = [len(s.input_ids) for s in samples]
    if packing:
        batches = epoch_pack_batches(samples, buckets, batch_size, 0, 0)
    else:
        from trainer.data.samples import epoch_batches

        batches = [[[i] for i in b] for b in epoch_batches(samples, buckets, batch_size, 0, 0)]
    real = slots = 0
    for batch in batches:
        rows = [sum(lengths[i] for i in row) for row in batch]
        real += sum(rows)
        slots += pick_bucket(max(rows), buckets) * len(rows)
    return 1 - real / slots if slots else 0.0


def collate_packs(
    samples: list[Sample], rows: list[Row], bucket_len: int, pad_id: int, index: int
) -> Batch:
    B = len(rows)
    input_ids = torch.full((B, bucket_len), pad_id, dtype=torch.int64)
    loss_mask = torch.zeros((B, bucket_len), dtype=torch.float32)
    doc_ids = torch.full((B, bucket_len), -1, dtype=torch.int64)
    position_ids = torch.zeros((B, bucket_len), dtype=torch.int64)
    lengths = []
    for r, row in enumerate(rows):
        at = 0
        last_start = 0
        for d, i in enumerate(row):
            s = samples[i]
            n = len(s.input_ids)
            if at + n > bucket_len:
                raise ValueError(f"collate: a row of {at + n} tokens exceeds bucket {bucket_len}")
            input_ids[r, at : at + n] = torch.tensor(s.input_ids, dtype=torch.int64)
            loss_mask[r, at : at + n] = torch.tensor(s.loss_mask, dtype=torch.float32)
            doc_ids[r, at : at + n] = d
            last_start = at
            at += n
        position_ids[r] = torch.arange(bucket_len)
        for d_start, d_end in _spans(samples, row):
            position_ids[r, d_start:d_end] -= d_start
        position_ids[r, at:] -= last_start  # padding: the last document's count goes on
        lengths.append(at)
    return Batch(
        input_ids=input_ids,
        loss_mask=loss_mask,
        lengths=torch.tensor(lengths, dtype=torch.int64),
        index=index,
        doc_ids=doc_ids,
        position_ids=position_ids,
    )


def _spans(samples: list[Sample], row: Row) -> list[tuple[int, int]]:
    out, at = [], 0
    for i in row:
        n = len(samples[i].input_ids)
        out.append((at, at + n))
        at += n
    return out

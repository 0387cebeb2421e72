"""The training loop: batches in data order, target features, drafter step, logs, checkpoints."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from pathlib import Path

import torch

from trainer.checkpoint import TrainPosition, load_checkpoint, save_checkpoint
from trainer.data import collate, epoch_batches, pick_bucket
from trainer.loss import STAT_NAMES, LossOutput
from trainer.memory import device_memory
from trainer.optim import lr_at, noise_at, set_lr
from trainer.setup import RunSetup
from trainer.step import BlockBatch, batch_seed, drafter_loss, prepare_blocks
from trainer.steplog import RunLog, StepRecord


def iterate_blocks(run: RunSetup, position: TrainPosition) -> Iterator[BlockBatch]:
    """Batches from `position` on, epoch after epoch, in the seeded order."""
    cfg = run.cfg
    pad_id = run.tokenizer.pad_token_id or 0
    epoch, start = position.epoch, position.batch_in_epoch
    while True:
        order = epoch_batches(
            run.samples,
            cfg.data.seq_buckets,
            cfg.train.batch_size,
            cfg.train.seed,
            epoch,
            shuffle=cfg.data.shuffle,
        )
        for index in range(start, len(order)):
            indices = order[index]
            longest = max(len(run.samples[i].input_ids) for i in indices)
            bucket_len = pick_bucket(longest, cfg.data.seq_buckets)
            batch = collate(run.samples, indices, bucket_len, pad_id, index)
            yield prepare_blocks(batch, cfg.train.num_anchors, cfg.train.seed, epoch)
        epoch, start = epoch + 1, 0


def autocast_for(device: torch.device) -> contextlib.AbstractContextManager[object]:
    # bf16 compute with fp32 master weights on GPU; plain fp32 on CPU.
    if device.type == "cuda":
        return torch.autocast("cuda", dtype=torch.bfloat16)
    return contextlib.nullcontext()


class Trainer:
    def __init__(self, run: RunSetup, run_dir: Path, log: RunLog, started_at: float) -> None:
        self.run = run
        self.run_dir = run_dir
        self.log = log
        self.started_at = started_at
        self.position = TrainPosition(step=0, epoch=0, batch_in_epoch=0, tokens=0)

    # -- checkpoints -----------------------------------------------------------------
    def save(self) -> Path:
        r = self.run
        return save_checkpoint(
            self.run_dir,
            self.position,
            r.drafter.trainable_state_dict(),
            r.optimizer.state_dict(),
            r.arch.to_dict(),
            r.cfg.to_dict(),
        )

    def restore(self, checkpoint: Path) -> None:
        data = load_checkpoint(checkpoint)
        missing = self.run.drafter.load_state_dict(data["model"], strict=False)
        if missing.unexpected_keys:
            raise ValueError(f"checkpoint {checkpoint}: unexpected keys {missing.unexpected_keys}")
        trainable = set(self.run.drafter.trainable_state_dict())
        absent = trainable - set(data["model"])
        if absent:
            raise ValueError(f"checkpoint {checkpoint}: missing weights {sorted(absent)[:3]}")
        self.run.optimizer.load_state_dict(data["optimizer"])
        self.position = TrainPosition(**data["position"])

    # -- one step --------------------------------------------------------------------
    def step(self, blocks: BlockBatch, features: torch.Tensor) -> LossOutput:
        r, cfg = self.run, self.run.cfg
        step = self.position.step
        set_lr(r.optimizer, lr_at(step, r.total_steps, cfg.train))
        noise = noise_at(step, r.total_steps, cfg.train)
        gen = None
        if noise > 0:
            gen = torch.Generator(r.device).manual_seed(
                batch_seed(cfg.train.seed + 1, blocks.epoch, blocks.batch.index)
            )
        with autocast_for(r.device):
            out = drafter_loss(r.drafter, blocks, features, r.settings, noise, gen)
        out.loss.backward()
        if cfg.train.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(r.drafter.parameters(), cfg.train.grad_clip)
        r.optimizer.step()
        r.optimizer.zero_grad(set_to_none=True)
        return out

    def advance(self, blocks: BlockBatch) -> None:
        p = self.position
        p.step += 1
        p.tokens += blocks.num_tokens
        p.batch_in_epoch = blocks.batch.index + 1
        p.epoch = blocks.epoch
        if p.batch_in_epoch >= self.run.batches_per_epoch:
            p.epoch, p.batch_in_epoch = p.epoch + 1, 0

    # -- the loop --------------------------------------------------------------------
    def train(self) -> None:
        r, cfg = self.run, self.run.cfg
        r.drafter.train()
        blocks_iter = iterate_blocks(r, self.position)
        window = _Window(self.position, r.device)
        while self.position.step < r.total_steps:
            blocks = next(blocks_iter).to(r.device)
            features = r.target.features(blocks.batch.input_ids)
            out = self.step(blocks, features)
            self.advance(blocks)
            window.add(out, blocks.num_tokens)
            step = self.position.step
            if step % cfg.train.log_every == 0 or step == r.total_steps:
                self.log.record(window.record(self), time.time())
                window = _Window(self.position, r.device)
            if cfg.train.checkpoint_every and step % cfg.train.checkpoint_every == 0:
                self.save()
        self.save()

    def epoch_fraction(self) -> float:
        p = self.position
        return p.epoch + p.batch_in_epoch / max(1, self.run.batches_per_epoch)


class _Window:
    """Sums over the steps between two step lines, kept on device until the line is due."""

    def __init__(self, start: TrainPosition, device: torch.device) -> None:
        self.t0 = time.monotonic()
        self.step0 = start.step
        self.steps = 0
        self.tokens = 0
        self.loss = torch.zeros((), device=device)
        self.stats = torch.zeros(len(STAT_NAMES), device=device)

    def add(self, out: LossOutput, tokens: int) -> None:
        self.steps += 1
        self.tokens += tokens
        self.loss += out.loss.detach()
        self.stats += out.stats

    def record(self, trainer: Trainer) -> StepRecord:
        r, p = trainer.run, trainer.position
        dt = max(time.monotonic() - self.t0, 1e-9)
        mean = LossOutput(loss=self.loss / max(1, self.steps), stats=self.stats).metrics()
        rate = self.steps / dt
        eta = (r.total_steps - p.step) / rate if rate > 0 else None
        return StepRecord(
            elapsed_s=time.time() - trainer.started_at,
            step=p.step,
            loss=mean["loss"],
            acc=mean["acc"],
            streak=mean["streak"],
            lr=lr_at(p.step - 1, r.total_steps, r.cfg.train),
            noise=noise_at(p.step - 1, r.total_steps, r.cfg.train),
            tgt_bps=rate,
            dft_bps=rate,
            tok_s=self.tokens / dt,
            q_pre=[],
            q_hs=[],
            epoch=trainer.epoch_fraction(),
            eta_s=eta,
            extra={
                "topk": mean["topk"],
                "tokens": p.tokens,
                "memory": device_memory([r.device]),
            },
        )

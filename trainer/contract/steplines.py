"""The human step line: its formatter and its parser, side by side (round-trip tested).

The shape is the one operators already grep, kept exactly (older monitors parse it too):

[479m] step=876 loss=1.3377 acc=0.120 streak=1.5 lr=4.40e-04 noise=0.0366 | tgt=0.35b/s \
dft=0.35b/s (14.2Ktok/s) | q_pre=[50, 16, 2, 1, 10] q_hs=[60] | epoch~0.17 ETA=11.4d

New figures go to the heartbeat and metrics.jsonl, never into this line.
"""

from __future__ import annotations

import dataclasses
import math
import re

MAX_LINE = 4096  # a step line is ~200 characters; longer lines are not step lines

STEP_LINE = re.compile(
    r"^\[(?P<minutes>\d{1,9})m\] step=(?P<step>\d{1,15}) loss=(?P<loss>[-+\w.]{1,40}) "
    r"acc=(?P<acc>[\d.]{1,40}) streak=(?P<streak>[\d.]{1,40}) lr=(?P<lr>[-+\d.e]{1,40}) "
    r"noise=(?P<noise>[\d.]{1,40}) \| tgt=(?P<tgt_bps>[\d.]{1,40})b/s "
    r"dft=(?P<dft_bps>[\d.]{1,40})b/s \((?P<tok>[\d.]{1,40})(?P<tok_unit>[KM]?)tok/s\) \| "
    r"q_pre=\[(?P<q_pre>[\d, ]{0,2000})\] q_hs=\[(?P<q_hs>[\d, ]{0,2000})\] \| "
    r"epoch~(?P<epoch>[\d.]{1,40}) ETA=(?P<eta>\S{1,40})$"
)
_UNIT = {"": 1.0, "K": 1e3, "M": 1e6}


def format_eta(seconds: float | None) -> str:
    if seconds is None or not math.isfinite(seconds):
        return "?"
    if seconds < 60:
        return f"{seconds:.0f}s"
    if seconds < 3600:
        return f"{seconds / 60:.1f}m"
    if seconds < 86400:
        return f"{seconds / 3600:.1f}h"
    return f"{seconds / 86400:.1f}d"


def format_tokens_rate(tok_s: float) -> str:
    if tok_s >= 1e6:
        return f"{tok_s / 1e6:.1f}M"
    if tok_s >= 1e3:
        return f"{tok_s / 1e3:.1f}K"
    return f"{tok_s:.0f}"


@dataclasses.dataclass(frozen=True)
class StepLine:
    """Every field of one step line, as the line says it (rounded as printed)."""

    elapsed_min: int
    step: int
    loss: float
    acc: float
    streak: float
    lr: float
    noise: float
    tgt_bps: float
    dft_bps: float
    tok_s: float
    q_pre: list[int]
    q_hs: list[int]
    epoch: float
    eta: str

    def format(self) -> str:
        return (
            f"[{self.elapsed_min}m] step={self.step} loss={self.loss:.4f} "
            f"acc={self.acc:.3f} streak={self.streak:.1f} lr={self.lr:.2e} "
            f"noise={self.noise:.4f} | tgt={self.tgt_bps:.2f}b/s dft={self.dft_bps:.2f}b/s "
            f"({format_tokens_rate(self.tok_s)}tok/s) | q_pre={self.q_pre} q_hs={self.q_hs} "
            f"| epoch~{self.epoch:.2f} ETA={self.eta}"
        )


def step_line(
    elapsed_s: float,
    step: int,
    loss: float,
    acc: float,
    streak: float,
    lr: float,
    noise: float,
    tgt_bps: float,
    dft_bps: float,
    tok_s: float,
    q_pre: list[int],
    q_hs: list[int],
    epoch: float,
    eta_s: float | None,
) -> StepLine:
    """The line for a logged step, from the trainer's own units (seconds)."""
    return StepLine(
        int(elapsed_s // 60), step, loss, acc, streak, lr, noise, tgt_bps, dft_bps, tok_s,
        list(q_pre), list(q_hs), epoch, format_eta(eta_s),
    )  # fmt: skip


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def parse_step_line(line: str) -> StepLine | None:
    """The fields of a step line; None for any other line, malformed ones included."""
    if len(line) > MAX_LINE:
        return None
    m = STEP_LINE.match(line.rstrip("\n"))
    if m is None:
        return None
    g = m.groupdict()
    try:
        return StepLine(
            elapsed_min=int(g["minutes"]),
            step=int(g["step"]),
            loss=float(g["loss"]),
            acc=float(g["acc"]),
            streak=float(g["streak"]),
            lr=float(g["lr"]),
            noise=float(g["noise"]),
            tgt_bps=float(g["tgt_bps"]),
            dft_bps=float(g["dft_bps"]),
            tok_s=float(g["tok"]) * _UNIT[g["tok_unit"]],
            q_pre=_ints(g["q_pre"]),
            q_hs=_ints(g["q_hs"]),
            epoch=float(g["epoch"]),
            eta=g["eta"],
        )
    except ValueError:  # "loss=.." has the shape of a number and is none
        return None

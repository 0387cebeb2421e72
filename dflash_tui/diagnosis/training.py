"""Rules of training health, from metrics.jsonl rows past the warm-up: a non-finite or
diverging loss, no learning, gradient norm spikes."""

from __future__ import annotations

import statistics

from dflash_tui.diagnosis.common import (
    possible,
)
from dflash_tui.diagnosis.config import (
    DEFAULT_CONFIG,
    DiagnosisConfig,
)
from dflash_tui.diagnosis.registry import Code, Finding, rule
from dflash_tui.state import Store
from trainer.contract.records import MetricsRow
from trainer.contract.typed import finite


@rule(
    Code("loss_not_finite", ("critical",), "the logged loss is NaN or infinite"),
    reads="metrics.jsonl rows (else the step lines): step and loss",
    decides="The newest logged loss is not finite. Names the first non-finite step after the "
    "last finite one, and that last finite loss.",
    action="kill it (K) while it runs: every further step trains NaN weights; resume from a "
    "checkpoint at or before the last finite step with a lower lr or grad_clip, and look at "
    "the batches after it",
)
def loss_not_finite(s: Store, now: float, cfg: DiagnosisConfig = DEFAULT_CONFIG) -> list[Finding]:
    """The logged loss is NaN or infinite: the weights are poisoned from that step on and
    every further step is wasted. Names the first bad step and the last good one."""
    rows = [(m.step, m.loss) for m in s.metrics] or [(x.step, x.loss) for x in s.step_lines]
    if not rows or finite(rows[-1][1]) is not None:
        return []
    good = [(step, loss) for step, loss in rows if finite(loss) is not None]
    last_good = good[-1] if good else None
    since = next(step for step, loss in rows if finite(loss) is None and
                 (last_good is None or step > last_good[0]))  # fmt: skip
    bad = sum(1 for step, _ in rows if step >= since)
    evidence = f"loss {rows[-1][1]} at step {rows[-1][0]}, non-finite in {bad} logged steps"
    before = f"before step {since}"
    if last_good is not None:
        evidence += f"; last finite {last_good[1]:.4f} at step {last_good[0]}"
        before = f"at or before step {last_good[0]}"
    alive = possible(s, now, cfg).signal
    return [
        Finding(
            "critical",
            "loss_not_finite",
            f"loss is {rows[-1][1]} from step {since} on",
            evidence,
            ("kill it (K): every step from here trains on NaN weights; " if alive else "")
            + f"resume from a checkpoint {before} with a lower lr or grad_clip, and look at "
            "the batches after it",
        )
    ]


def _past_warmup(s: Store, cfg: DiagnosisConfig) -> list[MetricsRow]:
    """The store's metrics rows after the warm-up, oldest first."""
    return [m for m in s.metrics if m.step > cfg.health_warmup_steps]


def _loss(x: float) -> str:
    return f"{x:.4f}" if abs(x) < 100 else f"{x:.4g}"


@rule(
    Code("loss_diverging", ("warning",), "the loss climbed well above its own best and stays"),
    reads="metrics.jsonl rows past `health_warmup_steps`: step, loss, lr",
    decides="The median loss of the last `diverge_rows` rows is more than `diverge_factor` × "
    "the lowest loss of the rows before them (at least `diverge_rows` of those), all past "
    "warm-up; non-finite losses are loss_not_finite's. One bad batch moves one row, not the "
    "median.",
    thresholds=("health_warmup_steps", "diverge_rows", "diverge_factor"),
    action="restart from a checkpoint at or before the best step with a lower train.lr (or a "
    "smaller train.grad_clip)",
)
def loss_diverging(s: Store, now: float, cfg: DiagnosisConfig = DEFAULT_CONFIG) -> list[Finding]:
    """The loss climbed well above its own best and stays there: the median of the last
    `diverge_rows` rows is more than `diverge_factor` times the lowest loss of the rows
    before them, all past warm-up (an lr too high for this point, a bad data shard). A NaN
    loss is loss_not_finite's; a single bad batch moves one row, not the median."""
    rows = _past_warmup(s, cfg)
    if not rows or finite(rows[-1].loss) is None:
        return []
    rows = [m for m in rows if finite(m.loss) is not None]
    k = max(1, cfg.diverge_rows)
    recent, before = rows[-k:], rows[:-k]
    if len(recent) < k or len(before) < k:
        return []
    best = min(before, key=lambda m: m.loss)
    median = statistics.median(m.loss for m in recent)
    if best.loss <= 0 or median <= cfg.diverge_factor * best.loss:
        return []
    since = next(m for m in rows if m.step > best.step and m.loss > cfg.diverge_factor * best.loss)
    return [
        Finding(
            "warning",
            "loss_diverging",
            f"loss diverging: {median / best.loss:.1f}× its best since step {since.step}",
            f"median loss {_loss(median)} over steps {recent[0].step}–{recent[-1].step} "
            f"({len(recent)} logged), {median / best.loss:.2f}× the best {_loss(best.loss)} at "
            f"step {best.step}; first above {cfg.diverge_factor:g}× at step {since.step} "
            f"({_loss(since.loss)}, lr {since.lr:.3g})",
            f"restart from a checkpoint at or before step {best.step} with a lower train.lr "
            "(or a smaller train.grad_clip)",
        )
    ]


@rule(
    Code("not_learning", ("critical",), "accuracy flat at ~0 and the loss not falling"),
    reads="metrics.jsonl rows past `health_warmup_steps`: acc, loss, streak, lr",
    decides="The newest rows past warm-up all have acc below `not_learning_acc`, spanning "
    "`not_learning_steps` steps or more, and the loss fell by less than "
    "`not_learning_loss_frac` of its value over them. A loss still falling is learning.",
    thresholds=(
        "health_warmup_steps",
        "not_learning_acc",
        "not_learning_steps",
        "not_learning_loss_frac",
    ),
    action="kill it (K); check train.lr and the data's loss mask (answer tokens kept) before "
    "relaunching",
)
def not_learning(s: Store, now: float, cfg: DiagnosisConfig = DEFAULT_CONFIG) -> list[Finding]:
    """Accuracy flat at ~0 (every row below `not_learning_acc`, streak ~1: only the anchor)
    for `not_learning_steps` past warm-up while the loss does not fall either: no progress,
    so every further step is wasted (critical). A loss still falling is learning, however
    slowly: said nothing. A NaN loss is loss_not_finite's."""
    rows = _past_warmup(s, cfg)
    flat: list[MetricsRow] = []
    for m in reversed(rows):  # the newest rows all below the bar
        if finite(m.acc) is None or m.acc >= cfg.not_learning_acc or finite(m.loss) is None:
            break
        flat.append(m)
    flat.reverse()
    if len(flat) < 2 or flat[-1].step - flat[0].step < cfg.not_learning_steps:
        return []
    first, last = flat[0], flat[-1]
    if first.loss > 0 and last.loss < first.loss * (1 - cfg.not_learning_loss_frac):
        return []
    change = (last.loss - first.loss) / first.loss * 100 if first.loss > 0 else 0.0
    lrs = sorted({m.lr for m in flat})
    lr = f"lr {lrs[0]:.3g}" if len(lrs) == 1 else f"lr {lrs[0]:.3g}–{lrs[-1]:.3g}"
    return [
        Finding(
            "critical",
            "not_learning",
            f"not learning: acc ~0 for {last.step - first.step} steps",
            f"acc <= {max(m.acc for m in flat):.3f} and streak <= "
            f"{max(m.streak for m in flat):.2f} in every logged step from {first.step} to "
            f"{last.step} ({len(flat)} rows); loss {_loss(first.loss)} → {_loss(last.loss)} "
            f"({change:+.1f} %); {lr}",
            ("kill it (K): " if not s.ended() else "")
            + "check train.lr and the data's loss mask (answer tokens kept) before relaunching",
        )
    ]


def _grad_spikes(rows: list[MetricsRow], cfg: DiagnosisConfig) -> list[tuple[MetricsRow, float]]:
    """Each row whose grad norm is above `grad_spike_factor` × the median of the rows before
    it that were not spikes themselves (repeated spikes must not raise their own bar), with
    that median."""
    normal: list[float] = []
    spikes: list[tuple[MetricsRow, float]] = []
    for m in rows:
        norm = finite(m.grad_norm)
        if norm is None:
            continue
        if len(normal) >= cfg.grad_spike_baseline_rows:
            median = statistics.median(normal)
            if median > 0 and norm > cfg.grad_spike_factor * median:
                spikes.append((m, median))
                continue
        normal.append(norm)
    return spikes


@rule(
    Code("grad_norm_spike", ("warning",), "the gradient norm spikes far above its median"),
    reads="metrics.jsonl rows' grad_norm (the largest pre-clip norm since the row before), "
    "past `health_warmup_steps`",
    decides="A row is a spike when its grad norm is above `grad_spike_factor` × the median "
    "of the earlier non-spike rows (at least `grad_spike_baseline_rows` of them). Raised "
    "with `grad_spike_count` spikes among the last `grad_spike_rows` rows: one is a blip.",
    thresholds=(
        "health_warmup_steps",
        "grad_spike_factor",
        "grad_spike_baseline_rows",
        "grad_spike_count",
        "grad_spike_rows",
    ),
    action="look at the batches of those steps for a malformed or very long sample",
)
def grad_norm_spike(s: Store, now: float, cfg: DiagnosisConfig = DEFAULT_CONFIG) -> list[Finding]:
    """The gradient norm before clipping (metrics rows' grad_norm: a row's largest) many
    times its own running median, in `grad_spike_count` of the last `grad_spike_rows` rows
    past warm-up: batches the model cannot fit, or an lr on the edge. One spike is a blip."""
    rows = [m for m in _past_warmup(s, cfg) if m.grad_norm is not None]
    last = rows[-max(1, cfg.grad_spike_rows) :]
    spikes = [(m, med) for m, med in _grad_spikes(rows, cfg) if last and m.step >= last[0].step]
    if len(spikes) < max(1, cfg.grad_spike_count):
        return []
    newest, median = spikes[-1]
    assert newest.grad_norm is not None
    # A row's norm is the largest of the steps since the row before: say those steps.
    previous = {b.step: a.step for a, b in zip(s.metrics, list(s.metrics)[1:], strict=False)}

    def steps_of(m: MetricsRow) -> str:
        first = previous.get(m.step, m.step - 1) + 1
        return f"{first}–{m.step}" if first < m.step else str(m.step)

    steps = ", ".join(steps_of(m) for m, _ in spikes)
    return [
        Finding(
            "warning",
            "grad_norm_spike",
            f"gradient norm spikes in {len(spikes)} of the last {len(last)} logged rows",
            f"grad norm {newest.grad_norm:.4g} in steps {steps_of(newest)}, "
            f"{newest.grad_norm / median:.0f}× the running median {median:.4g}; above "
            f"{cfg.grad_spike_factor:g}× it in steps {steps}",
            "look at the batches of those steps for a malformed or very long sample",
        )
    ]

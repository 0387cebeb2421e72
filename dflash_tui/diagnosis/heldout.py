"""Rules of the held-out τ (the heartbeat's eval): a failed or skipped eval, overfitting,
a plateau."""

from __future__ import annotations

from dflash_tui import evaluation
from dflash_tui.diagnosis.common import (
    dur,
    live_heartbeat,
    possible,
)
from dflash_tui.diagnosis.config import (
    DEFAULT_CONFIG,
    DiagnosisConfig,
)
from dflash_tui.diagnosis.registry import Code, Finding, rule
from dflash_tui.state import Store
from trainer.contract.evaluation import EvalInfo, EvalPoint
from trainer.contract.phases import (
    CHECKPOINTING,
    TRAINING,
)


# -- rules: held-out τ ----------------------------------------------------------------------
def _since_best(info: EvalInfo) -> tuple[EvalPoint, list[EvalPoint]] | None:
    """(this run's best eval, the scored evals after it), None before any eval has a τ."""
    best = info.best()
    if best is None:
        return None
    return best, [p for p in evaluation.scored(info) if p.step > best.step]


def _fall(best: EvalPoint, latest: EvalPoint) -> float:
    """How far `latest`'s τ is below the best's, as a share of the best."""
    top = best.tau or 0.0
    return (top - (latest.tau or 0.0)) / top if top > 0 else 0.0


def _acc_rise(best: EvalPoint, latest: EvalPoint) -> float | None:
    if best.train_acc is None or latest.train_acc is None:
        return None
    return latest.train_acc - best.train_acc


def _overfit(best: EvalPoint, latest: EvalPoint, cfg: DiagnosisConfig) -> bool:
    rise = _acc_rise(best, latest)
    return _fall(best, latest) >= cfg.tau_noise_frac and (rise or 0.0) >= cfg.overfit_acc_rise


def _export_best(best: EvalPoint) -> str:
    """Checkpoints are not written at each eval: the one nearest the best step."""
    return f"export the checkpoint nearest step {best.step}, the best (dflash-tui export --step S)"


@rule(
    Code("eval_failed", ("warning",), "the held-out eval failed: the drafter goes unmeasured"),
    reads="the heartbeat's eval (EvalInfo: error, history)",
    decides="The eval thread's last eval failed: EvalInfo.error is set (the host's words).",
    action="read train.log's `eval:` lines; a failed eval is tried again at the next, one "
    "turned off is not (out of memory: fewer eval.prompts or eval.new_tokens)",
)
def eval_failed(s: Store, now: float, cfg: DiagnosisConfig = DEFAULT_CONFIG) -> list[Finding]:
    """The eval thread says its last eval failed (`EvalInfo.error`, the host's words): the
    run trains on, but nothing measures the drafter any more."""
    info = s.eval_info()
    if info is None or info.error is None:
        return []
    latest = next(reversed(evaluation.scored(info)), None)
    before = f"; the last τ {latest.tau:.2f} at step {latest.step}" if latest else ""
    return [
        Finding(
            "warning",
            "eval_failed",
            "held-out eval failed",
            f"{info.error}{before}",
            "training goes on unmeasured: read train.log's `eval:` lines; a failed eval is "
            "tried again at the next, one turned off is not (out of memory: fewer "
            "eval.prompts or eval.new_tokens)",
        )
    ]


@rule(
    Code("overfitting", ("warning", "critical"), "held-out τ fell while training acc rose"),
    reads="the heartbeat's eval history: τ and the training acc at each eval",
    decides="The latest eval after the best: τ `tau_noise_frac` or more below the best while "
    "the training acc rose by `overfit_acc_rise` or more since it. Critical when τ fell by "
    "`overfit_critical_frac` or more. Said after the run ended too (which step to export).",
    thresholds=("tau_noise_frac", "overfit_acc_rise", "overfit_critical_frac"),
    action="stop it (K) and export the checkpoint nearest the best step, not the newest; "
    "next time more data or fewer epochs",
)
def overfitting(s: Store, now: float, cfg: DiagnosisConfig = DEFAULT_CONFIG) -> list[Finding]:
    """Held-out τ fell below its best by more than noise while the training accuracy rose
    over the same steps: the drafter learns the training samples, not the target. Said also
    once the run ended: which step to export is the question then."""
    info = s.eval_info()
    got = _since_best(info) if info is not None else None
    if got is None or not got[1]:
        return []
    best, after = got
    latest = after[-1]
    if not _overfit(best, latest, cfg):
        return []
    fall = _fall(best, latest)
    acc = f"{best.train_acc or 0.0:.1%} → {latest.train_acc or 0.0:.1%}"
    if not possible(s, now, cfg).signal:
        action = f"{_export_best(best)}, not the newest; next time more data or fewer epochs"
    else:
        action = (
            f"stop it (K) and {_export_best(best)}: more steps fit the training data; "
            "more data or fewer epochs"
        )
    return [
        Finding(
            "critical" if fall >= cfg.overfit_critical_frac else "warning",
            "overfitting",
            f"held-out τ fell {fall:.0%} from its best while training acc rose",
            f"τ {latest.tau:.2f} at step {latest.step}, best {best.tau:.2f} at step {best.step}"
            f" ({len(after)} evals since); training acc {acc} over the same "
            f"{latest.step - best.step} steps",
            action,
        )
    ]


@rule(
    Code("eval_plateau", ("warning",), "held-out τ has not beaten its best for several evals"),
    reads="the heartbeat's eval history",
    decides="Training or checkpointing with a fresh heartbeat, and `plateau_evals` or more "
    "evals since the best, none better. Quiet when overfitting's test holds (τ "
    "`tau_noise_frac` below the best with the training acc up `overfit_acc_rise`).",
    thresholds=("stale_factor", "plateau_evals", "tau_noise_frac", "overfit_acc_rise"),
    action="export the checkpoint nearest the best step and stop, or change what it learns: "
    "the target's own answers (python -m trainer regenerate), more data, a lower lr",
)
def eval_plateau(s: Store, now: float, cfg: DiagnosisConfig = DEFAULT_CONFIG) -> list[Finding]:
    """Held-out τ has not beaten its best for `plateau_evals` evals while the run trains on:
    the steps buy nothing the target accepts. Quiet when `overfitting` says more."""
    hb = live_heartbeat(s, now, cfg, TRAINING, CHECKPOINTING)
    got = _since_best(hb.eval) if hb is not None and hb.eval is not None else None
    if got is None or len(got[1]) < cfg.plateau_evals:
        return []
    best, after = got
    latest = after[-1]
    if _overfit(best, latest, cfg):
        return []
    taus = [p.tau or 0.0 for p in after]
    rise = _acc_rise(best, latest)
    acc = f"; training acc {rise:+.1%} over them" if rise is not None else ""
    return [
        Finding(
            "warning",
            "eval_plateau",
            f"held-out τ no better than {best.tau:.2f} for {len(after)} evals",
            f"best τ {best.tau:.2f} at step {best.step}; the {len(after)} evals since (steps "
            f"{after[0].step}–{latest.step}) {min(taus):.2f}–{max(taus):.2f}, latest "
            f"{latest.tau:.2f}{acc}",
            f"{_export_best(best)} and stop, or change what it learns: the target's own "
            "answers (python -m trainer regenerate), more data, a lower lr",
        )
    ]


@rule(
    Code("eval_skipped", ("info",), "evals fell due while one still ran and were skipped"),
    reads="the heartbeat's eval (skipped, history, seconds, settings)",
    decides="EvalInfo.skipped is above 0: evals due while one was under way were not run "
    "(the pipeline never waits for the eval thread).",
    action="raise eval.every, or lower eval.prompts or eval.new_tokens",
)
def eval_skipped(s: Store, now: float, cfg: DiagnosisConfig = DEFAULT_CONFIG) -> list[Finding]:
    """Evals fell due while one was still under way and were not run (the pipeline never
    waits for the eval thread): τ is measured less often than `eval.every` says."""
    info = s.eval_info()
    if info is None or info.skipped == 0:
        return []
    # The mean, not the last: a run's final eval may be far shorter (it decodes on an idle
    # GPU) and say "0s" of evals that each outlasted eval.every.
    done = len(info.history)
    if done:
        took = f"; {done} ran, {dur(info.seconds / done)} each on average"
    elif info.running_step is not None:
        took = f"; none has finished yet (step {info.running_step}'s is still running)"
    else:
        took = ""
    return [
        Finding(
            "info",
            "eval_skipped",
            f"{info.skipped} held-out evals skipped",
            f"an eval every {info.every} steps, each still running when the next was due{took}"
            f" ({info.prompts} prompts × {info.new_tokens} new tokens on {info.device or '?'})",
            "raise eval.every, or lower eval.prompts or eval.new_tokens",
        )
    ]

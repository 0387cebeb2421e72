"""The training-health rules (loss_diverging, not_learning, grad_norm_spike) at their edges,
on recorded runs (tests/fixtures/scenarios/recorded/, scripts/record-scenarios) with the
edits each test names: only metrics.jsonl rows' loss, acc or grad_norm, or rows dropped.
That each fires on its own recording at the default thresholds is in
test_recorded_scenarios.py."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from test_diagnosis import NOW, Events, events, store

from dflash_tui.diagnosis import DEFAULT_CONFIG, DiagnosisConfig, Finding, diagnose

HEALTH = ("loss_diverging", "not_learning", "grad_norm_spike")
Row = dict[str, Any]


def rec(name: str) -> str:
    return f"recorded/{name}.jsonl"


def health(evs: Events, cfg: DiagnosisConfig = DEFAULT_CONFIG) -> list[Finding]:
    return [f for f in diagnose(store(evs), NOW, cfg) if f.code in HEALTH]


def _metrics(evs: Events) -> list[dict[str, Any]]:
    return [e for e in evs if e.get("type") == "line" and e.get("file") == "metrics.jsonl"]


def rows(evs: Events) -> list[Row]:
    return [json.loads(e["text"]) for e in _metrics(evs)]


def edit_rows(evs: Events, change: Callable[[Row], None]) -> Events:
    """`change` applied to each metrics row (in place), as the file would have it."""
    for e in _metrics(evs):
        row = json.loads(e["text"])
        change(row)
        e["text"] = json.dumps(row)
    return evs


def drop_rows_after(evs: Events, step: int) -> Events:
    """The events as a monitor connected at `step` would have had them (metrics rows)."""
    return [e for e in evs if e not in _metrics(evs) or json.loads(e["text"])["step"] <= step]


def at(steps: dict[int, dict[str, float]]) -> Callable[[Row], None]:
    def change(row: Row) -> None:
        row.update(steps.get(row["step"], {}))

    return change


# -- warm-up: nothing said before it is over ------------------------------------------------
def test_healthy_runs_are_quiet_even_with_a_short_warmup():
    """The healthy recordings, warm-up cut to 20 steps: the falling loss, rising acc and
    shrinking grad norm of early training are none of the three. `healthy` is from a trainer
    before grad_norm (None in every row)."""
    short = replace(DEFAULT_CONFIG, health_warmup_steps=20)
    for name in ("healthy", "healthy_training", "stage_times", "held_out_eval"):
        assert health(events(rec(name)), short) == [], name
    assert all(r.get("grad_norm") is None for r in rows(events(rec("healthy"))))


def test_a_loss_high_from_warmup_on_is_not_diverging():
    """loss_diverging's run with the warm-up ending after the jump (step 135): its best is
    then the settled ~6, and the loss is not above it. The best is this run's own, past
    warm-up, never the early steps'."""
    late = replace(DEFAULT_CONFIG, health_warmup_steps=135)
    assert health(events(rec("loss_diverging")), late) == []
    assert [f.code for f in health(events(rec("loss_diverging")))] == ["loss_diverging"]


def test_diverging_needs_rows_before_and_after():
    """As a monitor at step 150 saw it (edit: later rows dropped): the window 130–150 is
    high, but only two rows past warm-up come before it (110, 120): too few to have a best.
    At step 160 there are three."""
    evs = events(rec("loss_diverging"))
    assert health(drop_rows_after(evs, 150)) == []
    (f,) = health(drop_rows_after(evs, 160))
    assert f.evidence.startswith("median loss 7.6287 over steps 140–160 (3 logged), 2.45× ")


def test_not_learning_waits_for_its_steps_past_warmup():
    """not_learning's run as a monitor saw it at step 150 (edit: later rows dropped): 40
    steps past warm-up, under the 50 the rule wants; at step 160, 50."""
    evs = events(rec("not_learning"))
    assert health(drop_rows_after(evs, 150)) == []
    (f,) = health(drop_rows_after(evs, 160))
    assert (
        f.title == "not learning: acc ~0 for 50 steps" and "from 110 to 160 (6 rows)" in f.evidence
    )


def test_a_falling_loss_is_learning():
    """not_learning's rows with the loss edited to fall 10 % from step 110 to 170 (acc left at
    0): slow learning is still learning. At 2 % (under the 5 % bar) it is said."""
    for fall, said in ((0.10, []), (0.02, ["not_learning"])):
        evs = events(rec("not_learning"))
        edit_rows(
            evs, lambda r, f=fall: r.update(loss=r["loss"] * (1 - f * max(0, r["step"] - 110) / 60))
        )
        assert [x.code for x in health(evs)] == said, fall


# -- one blip is not a trend -----------------------------------------------------------------
def test_one_bad_row_is_not_divergence():
    """healthy_training with one row's loss tripled (edit: step 240): the median of the last
    three rows holds. A second one (250) moves the median: then it is said."""
    evs = events(rec("healthy_training"))
    loss = {r["step"]: r["loss"] for r in rows(evs)}
    assert health(edit_rows(evs, at({240: {"loss": 3 * loss[240]}}))) == []
    (f,) = health(edit_rows(evs, at({250: {"loss": 3 * loss[250]}})))
    assert (f.code, f.severity) == ("loss_diverging", "warning")
    # The median of 230–250: the smaller of the two tripled (loss[250] < loss[240]).
    assert f.evidence.startswith(f"median loss {3 * loss[250]:.4f} over steps 230–250 ")
    assert f"the best {loss[220]:.4f} at step 220" in f.evidence


def test_a_nan_loss_is_loss_not_finites_alone():
    """nan_loss's rows are NaN with acc 0 from step 50: with the warm-up cut to 20 steps,
    neither loss_diverging nor not_learning speaks over loss_not_finite."""
    short = replace(DEFAULT_CONFIG, health_warmup_steps=20)
    found = diagnose(store(events(rec("nan_loss"))), NOW, short)
    assert [f.code for f in found] == ["loss_not_finite"]


def test_one_grad_spike_is_a_blip():
    """grad_norm_spike's run with the spikes of rows 170 and 200 edited to the norm of the
    row before each: one spike (140) is left, a blip. With 200's kept, two: said."""
    evs = events(rec("grad_norm_spike"))
    norm = {r["step"]: r["grad_norm"] for r in rows(evs)}
    assert (
        health(edit_rows(evs, at({170: {"grad_norm": norm[160]}, 200: {"grad_norm": norm[190]}})))
        == []
    )
    evs = events(rec("grad_norm_spike"))
    (f,) = health(edit_rows(evs, at({170: {"grad_norm": norm[160]}})))
    assert f.evidence.endswith("above 10× it in steps 131–140, 191–200")


def test_grad_spikes_in_warmup_say_nothing():
    """With the warm-up ending at step 175, the spikes of rows 140 and 170 are in it: only
    200's is left, one, and too few rows come before it for a median (3)."""
    late = replace(DEFAULT_CONFIG, health_warmup_steps=175)
    assert health(events(rec("grad_norm_spike")), late) == []


def test_repeated_spikes_do_not_raise_their_own_bar():
    """The median a row is compared with leaves out the spikes before it: with every other
    row a spike (edit: rows 150, 180, 210 given 140's norm too), the later ones are still
    spikes against the ~1.4 of the normal rows, not against a median the spikes pulled up."""
    evs = events(rec("grad_norm_spike"))
    norm = {r["step"]: r["grad_norm"] for r in rows(evs)}
    edit_rows(evs, at({s: {"grad_norm": norm[140]} for s in (150, 180, 210)}))
    (f,) = health(evs)
    assert f.title == "gradient norm spikes in 6 of the last 10 logged rows"
    assert "the running median 1.4" in f.evidence

"""Held-out τ during training, monitor side: what dflash_tui/evaluation.py computes from the
heartbeat's `eval`, the best of comparable earlier runs (facts.earlier_best_tau), the
headless line and `--json`, the heartbeat pane, the runs lists, and the rules
eval_failed, overfitting, eval_plateau and eval_skipped.

Fixture: recorded/fingerprinted.jsonl (two real CPU runs of the demo config, comparable,
the second followed while training). Its trainer had no eval thread: each test puts an
eval history into the last heartbeat and the runs list, built from the contract's records
(trainer/contract/evaluation.py), and says which. A run that plateaus or overfits cannot be
produced cheaply; the real eval thread's output is read end to end in test_eval_live.py.
"""

from __future__ import annotations

import asyncio
import copy
import json
from typing import Any

import pytest
from monitor_helpers import typed_event
from test_diagnosis import NOW, Events, codes, events, hb, of_type, only, store

from dflash_tui import evaluation
from dflash_tui.commands.runs import format_runs
from dflash_tui.diagnosis import diagnose
from dflash_tui.facts import earlier_best_tau
from dflash_tui.headless import status_line
from dflash_tui.link.events import LinkStatus
from trainer.contract.evaluation import EvalInfo, EvalPoint, EvalResult
from trainer.contract.protocol import RunEval
from trainer.contract.typed import decode, encode

SCENARIO = "recorded/fingerprinted.jsonl"
EARLIER, FOLLOWED = "20261201-065728-tiny-cpu-9911", "20261201-065846-tiny-cpu-f0dd"
DATA = "builtin:synthetic-chat"
SETTINGS = {"every": 500, "held_out": 64, "prompts": 16, "new_tokens": 128, "device": "cpu"}


def points(*evals: tuple[int, float | None, float | None]) -> list[EvalPoint]:
    return [EvalPoint(step, tau, acc) for step, tau, acc in evals]


# τ climbs to 2.50 at step 1500 and then rises no further; training acc keeps rising.
CLIMB = points((500, 1.40, 0.30), (1000, 2.10, 0.38), (1500, 2.50, 0.42), (2000, 2.38, 0.44))


def info(history: list[EvalPoint], **fields: Any) -> EvalInfo:
    last = history[-1] if history else None
    result = (
        EvalResult(step=last.step, tau=last.tau, prompts=16, seconds=41.0, train_acc=last.train_acc)
        if last
        else None
    )
    return EvalInfo(**{**SETTINGS, "history": history, "last": result, **fields})


def with_eval(
    ev: EvalInfo | None, earlier: EvalInfo | None = None, data: str = DATA, prompt_len: int = 512
) -> Any:
    """The followed run's last heartbeat says `ev`; the runs list carries it as the agent
    builds it (RunEval.of), and `earlier` for the earlier run (evaluated on `data`)."""

    def edit(evs: Events) -> None:
        hb(evs)["eval"] = encode(ev)
        (runs,) = of_type(evs, "runs")
        for r in runs["runs"]:
            if r["run_id"] == FOLLOWED and ev is not None:
                r["eval"] = encode(RunEval.of(ev, DATA, 512))
            if r["run_id"] == EARLIER and earlier is not None:
                r["eval"] = encode(RunEval.of(earlier, data, prompt_len))

    return edit


def live_store(*edits: Any) -> Any:
    evs = events(SCENARIO)
    for edit in edits:
        edit(evs)
    s = store(evs)
    s.apply(LinkStatus(t=NOW, state="connected", detail="", target="local"))
    return s


def diag(*edits: Any) -> list[Any]:
    return diagnose(live_store(*edits), NOW)


# -- what evaluation.py computes ------------------------------------------------------------
def test_latest_trend_best_and_the_earlier_runs_best():
    earlier = info(points((500, 1.9, 0.3), (1000, 2.8, 0.4), (1500, 2.7, 0.45)))
    s = live_store(with_eval(info(CLIMB), earlier))
    tau = evaluation.of_store(s)
    assert tau is not None
    assert (tau.latest, tau.previous, tau.best) == (CLIMB[3], CLIMB[2], CLIMB[2])
    assert tau.delta == pytest.approx(-0.12) and tau.trend == "down"
    assert tau.earlier is not None
    assert (tau.earlier.run_id, tau.earlier.point) == (EARLIER, EvalPoint(1000, 2.8, 0.4))
    assert tau.forms()[0] == (
        "τ 2.38 ↓0.12 at step 2000 (best 2.50 at step 1500; comparable runs' best 2.80)"
    )
    assert tau.forms()[-1] == "τ 2.38↓"
    assert tau.fitted(45) == "τ 2.38 ↓0.12 (best 2.50; earlier 2.80)"
    assert tau.fitted(5) == "τ 2.38↓"  # nothing fits: the shortest


def test_up_flat_and_a_latest_that_is_the_best():
    up = evaluation.summary(info(CLIMB[:3]))
    assert up is not None and up.trend == "up" and up.delta == pytest.approx(0.40)
    assert up.forms()[0] == "τ 2.50 ↑0.40 at step 1500 (best so far)"
    flat = evaluation.summary(info([*CLIMB[:3], EvalPoint(2000, 2.51, 0.44)]))
    assert flat is not None and flat.trend == "flat" and flat.short() == "τ 2.51→"
    assert flat.short(unicode=False) == "tau 2.51="


def test_before_the_first_eval_and_evals_without_a_tau():
    none_yet = evaluation.summary(info([], running_step=500))
    assert none_yet is not None and none_yet.latest is None and none_yet.trend is None
    assert none_yet.forms()[0] == "τ — no eval yet (every 500 steps)"
    assert none_yet.short() == "τ —" and none_yet.state() == "evaluating step 500"
    # An eval whose prompts all ended at once has no τ: the trend skips it.
    gap = evaluation.summary(info([*CLIMB[:2], EvalPoint(1500, None, 0.4)]))
    assert gap is not None and gap.latest == CLIMB[1] and gap.previous == CLIMB[0]
    assert evaluation.summary(None) is None


def test_the_earlier_best_needs_the_same_eval_settings_and_signature():
    earlier = info(points((1000, 2.8, 0.4)))
    assert earlier_best_tau(live_store(with_eval(info(CLIMB), earlier))) is not None
    # Another data file, other prompts, another decode length: τ of something else.
    assert earlier_best_tau(live_store(with_eval(info(CLIMB), earlier, data="x.jsonl"))) is None
    assert earlier_best_tau(live_store(with_eval(info(CLIMB), earlier, prompt_len=256))) is None
    for change in ({"prompts": 8}, {"new_tokens": 64}, {"held_out": 32}):
        other = info(points((1000, 2.8, 0.4)), **change)
        assert earlier_best_tau(live_store(with_eval(info(CLIMB), other))) is None, change

    def other_shape(evs: Events) -> None:
        (runs,) = of_type(evs, "runs")
        runs["runs"][0]["signature"]["shape"] += " drafter.num_layers=4"

    assert earlier_best_tau(live_store(with_eval(info(CLIMB), earlier), other_shape)) is None


# -- headless and --json ----------------------------------------------------------------------
def test_the_status_line_carries_tau_after_the_loss():
    line = status_line(live_store(with_eval(info(CLIMB))), [], now=NOW)
    assert " | loss 4.971 | τ 2.38↓ | " in line, line
    assert "τ" not in status_line(live_store(), [], now=NOW)  # a run that evaluates nothing
    ascii_line = status_line(live_store(with_eval(info(CLIMB))), [], now=NOW, unicode=False)
    assert " | tau 2.38- | " in ascii_line


def test_json_carries_the_heartbeats_eval_exactly(tmp_path):
    from dflash_tui.headless import Headless
    from dflash_tui.targets import Target

    ev = info(CLIMB, skipped=2, error="CUDA error: out of memory\x1b[2J")
    h = Headless(Target(name="local", kind="local"), as_json=True)  # its link never started
    for e in events(SCENARIO):
        edited = copy.deepcopy(e)
        if e["type"] == "heartbeat":
            edited["data"]["eval"] = encode(ev)
        h.store.apply(typed_event(edited))
    snap = json.loads(h.snapshot_text([]))
    assert snap["state"]["eval"] == encode(ev)
    assert decode(EvalInfo, snap["state"]["eval"]) == ev
    assert snap["tau"] == {
        "latest": {"step": 2000, "tau": 2.38, "train_acc": 0.44, "tree_tau": None},
        "delta": pytest.approx(-0.12),
        "trend": "down",
        "best": {"step": 1500, "tau": 2.5, "train_acc": 0.42, "tree_tau": None},
        "earlier": None,
        "evals": 4,
        "running_step": None,
        "skipped": 2,
        "error": "CUDA error: out of memory\x1b[2J",  # exact: JSON escapes it
    }


# -- the runs lists ---------------------------------------------------------------------------
def test_the_agent_lists_each_runs_eval_from_its_heartbeat(tmp_path):
    """A run dir the H200 trainer wrote (tests/fixtures/rundirs/h200-schema2), its heartbeat
    given an eval: the agent's runs list carries it, the settings with config.json's data."""
    import shutil
    from pathlib import Path

    from dflash_tui.agent.runs import RunRoot
    from trainer.contract.protocol import RunsEvent, decode_event

    src = Path(__file__).resolve().parents[1] / "fixtures" / "rundirs" / "h200-schema2"
    shutil.copytree(src, tmp_path / "runs")
    root = RunRoot(str(tmp_path / "runs"))
    (run_id,) = root.run_ids()
    assert root.info(run_id, None).eval is None  # a trainer without the eval thread
    path = tmp_path / "runs" / run_id / "heartbeat.json"
    data = json.loads(path.read_text())
    data["eval"] = encode(info(CLIMB, error="x"))
    path.write_text(json.dumps(data))
    got = root.info(run_id, None).eval
    assert got == RunEval(
        held_out=64,
        prompts=16,
        new_tokens=128,
        data=DATA,
        evals=4,
        best=CLIMB[2],
        last=CLIMB[3],
        error="x",
    )
    # Through the protocol as the agent sends it.
    event = decode_event(RunsEvent(runs=[root.info(run_id, None)]).to_json())
    assert isinstance(event, RunsEvent) and event.runs[0].eval == got


def test_the_runs_list_shows_each_runs_best_tau():
    s = live_store(with_eval(info(CLIMB), info(points((1000, 2.8, 0.4)))))
    text = format_runs(s.runs)
    assert "BEST τ" in text.splitlines()[0]
    earlier, followed = text.splitlines()[1:]
    assert "2.80@1000" in earlier and "2.50@1500" in followed
    assert "—" in format_runs(live_store().runs).splitlines()[1]


# -- the rules ---------------------------------------------------------------------------------
def test_eval_plateau_after_three_evals_without_a_better_tau():
    flat = [*CLIMB[:3], *points((2000, 2.46, 0.42), (2500, 2.49, 0.425), (3000, 2.47, 0.425))]
    f = only(diag(with_eval(info(flat))), "eval_plateau")
    assert f.severity == "warning"
    assert f.title == "held-out τ no better than 2.50 for 3 evals"
    assert f.evidence == (
        "best τ 2.50 at step 1500; the 3 evals since (steps 2000–3000) 2.46–2.49, latest 2.47; "
        "training acc +0.5% over them"
    )
    assert f.action.startswith("export the checkpoint nearest step 1500, the best (dflash-tui")
    assert "eval_plateau" not in codes(diag(with_eval(info(flat[:-1]))))  # two since: not yet
    better = [*flat[:-1], EvalPoint(3000, 2.52, 0.43)]
    assert "eval_plateau" not in codes(diag(with_eval(info(better))))


def test_no_plateau_once_the_run_has_ended():
    flat = [*CLIMB[:3], *points((2000, 2.46, 0.42), (2500, 2.49, 0.425), (3000, 2.47, 0.425))]

    def ended(evs: Events) -> None:
        hb(evs)["phase"] = "finished"

    assert "eval_plateau" not in codes(diag(with_eval(info(flat)), ended))


def test_overfitting_when_tau_falls_as_training_acc_rises():
    # 2.50 -> 2.37 is 5.2 % down while acc rose 0.42 -> 0.47.
    fell = [*CLIMB[:3], EvalPoint(2000, 2.37, 0.47)]
    f = only(diag(with_eval(info(fell))), "overfitting")
    assert (f.severity, f.title) == (
        "warning",
        "held-out τ fell 5% from its best while training acc rose",
    )
    assert f.evidence == (
        "τ 2.37 at step 2000, best 2.50 at step 1500 (1 evals since); training acc "
        "42.0% → 47.0% over the same 500 steps"
    )
    assert f.action.startswith("stop it (K) and export the checkpoint nearest step 1500")
    # 4.4 % down is noise; a fall with a flat training acc is no overfitting.
    assert "overfitting" not in codes(
        diag(with_eval(info([*CLIMB[:3], EvalPoint(2000, 2.39, 0.47)])))
    )
    assert "overfitting" not in codes(
        diag(with_eval(info([*CLIMB[:3], EvalPoint(2000, 2.30, 0.425)])))
    )
    # 16 % down: critical.
    worse = only(diag(with_eval(info([*CLIMB[:3], EvalPoint(2000, 2.10, 0.5)]))), "overfitting")
    assert worse.severity == "critical"


def test_overfitting_after_the_run_ended_names_the_step_to_export():
    fell = [*CLIMB[:3], *points((2000, 2.30, 0.45), (2500, 2.20, 0.47), (3000, 2.10, 0.5))]

    def ended(evs: Events) -> None:
        hb(evs)["phase"] = "finished"

    found = diag(with_eval(info(fell)), ended)
    f = only(found, "overfitting")
    assert f.action.startswith("export the checkpoint nearest step 1500, the best")
    assert "not the newest" in f.action
    assert "eval_plateau" not in codes(found)  # overfitting says more


def test_eval_failed_quotes_the_error():
    error = "RuntimeError: shape mismatch in verify"
    f = only(diag(with_eval(info(CLIMB, error=error))), "eval_failed")
    assert (f.severity, f.title) == ("warning", "held-out eval failed")
    assert f.evidence == f"{error}; the last τ 2.38 at step 2000"
    assert "eval_failed" not in codes(diag(with_eval(info(CLIMB))))


def test_skipped_evals_are_said_with_what_evals_take():
    evals = info(CLIMB, skipped=3, seconds=41.0 * len(CLIMB))
    f = only(diag(with_eval(evals)), "eval_skipped")
    assert f.severity == "info" and f.title == "3 held-out evals skipped"
    assert f.evidence == (
        f"an eval every 500 steps, each still running when the next was due; {len(CLIMB)} ran, "
        "41s each on average (16 prompts × 128 new tokens on cpu)"
    )
    assert "eval_skipped" not in codes(diag(with_eval(info(CLIMB))))


def test_skipped_evals_before_any_finished_say_which_one_is_still_running():
    # As on the H200 (8B config, the uncached eval): step 100's eval outlasted 4 more due.
    f = only(diag(with_eval(info([], skipped=4, running_step=100))), "eval_skipped")
    assert "; none has finished yet (step 100's is still running) (" in f.evidence


def test_no_eval_no_finding():
    found = diag()
    assert not {"eval_failed", "overfitting", "eval_plateau", "eval_skipped"} & set(codes(found))


# -- the heartbeat pane ------------------------------------------------------------------------
def pane_text(size: tuple[int, int], *edits: Any) -> str:
    from test_stage_bars import TARGET

    from dflash_tui.app import DFlashApp
    from dflash_tui.widgets.heartbeat import HeartbeatPane

    async def go() -> str:
        app = DFlashApp(TARGET, theme_name="dark", connect=False, clock=lambda: NOW)
        async with app.run_test(size=size) as pilot:
            evs = events(SCENARIO)
            for edit in edits:
                edit(evs)
            for e in evs:
                app.feed(typed_event(e))
            app.redraw(force=True)
            await pilot.pause(0.3)
            app.redraw(force=True)  # the pane's width is known after the first layout
            await pilot.pause(0.3)
            pane = app.query_one(HeartbeatPane)
            strips = pane.render_lines(pane.region.reset_offset)
            return "\n".join("".join(seg.text for seg in strip).rstrip() for strip in strips)

    return asyncio.run(go())


@pytest.fixture
def own_config(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))


def test_the_pane_fits_tau_to_its_width(own_config):
    earlier = info(points((1000, 2.8, 0.4)))
    wide = pane_text((260, 50), with_eval(info(CLIMB), earlier))
    assert (
        "held-out     τ 2.38 ↓0.12 at step 2000 (best 2.50 at step 1500; comparable runs' "
        "best 2.80)" in wide
    ), wide
    for columns, shown in (
        (180, "τ 2.38 ↓0.12 (best 2.50 at step 1500; earlier 2.80)"),
        (140, "τ 2.38 ↓0.12 (best 2.50; earlier 2.80)"),
        (100, "τ 2.38 ↓0.12"),
    ):
        lines = pane_text((columns, 50), with_eval(info(CLIMB), earlier)).splitlines()
        (i,) = [i for i, ln in enumerate(lines) if "held-out" in ln]
        assert lines[i].strip() == f"held-out     {shown}", lines
        assert lines[i + 1].strip().startswith("pid "), lines  # one line: it did not wrap


def test_the_pane_says_a_running_eval_skips_and_the_error_made_visible(own_config):
    ev = info(CLIMB, running_step=2500, skipped=2, error="boom\x1b[31m red\u202e")
    text = pane_text((260, 50), with_eval(ev))
    assert "eval         evaluating step 2500 · 2 skipped (an eval was still running when" in text
    assert "eval error   boom\\x1b[31m red\\u202e" in text, text
    assert "\x1b" not in text

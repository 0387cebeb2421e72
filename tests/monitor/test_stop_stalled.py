"""stop_stalled: a run asked to stop that does not, judged against how long earlier comparable
runs took to stop. On the recorded `healthy` scenario (the demo config; its earlier run
finished and stopped in well under a second). Documented edits only: the followed run's last
heartbeat is put in `stopping`, begun `s` seconds before it, the visit appended to its
phase_history; for the case with nothing to compare with, the earlier run is taken out of the
runs list."""

from __future__ import annotations

from typing import Any

from test_diagnosis import NOW, Events, codes, hb, of_type, only, run

HEALTHY = "recorded/healthy.jsonl"


def stopping_for(s: float) -> Any:
    def edit(evs: Events) -> None:
        data = hb(evs)
        data["phase"] = "stopping"
        data["phase_started_at"] = data["now"] - s
        visits = [v for v in data["phase_history"] if v["phase"] == "stopping"]
        data["phase_history"].append(
            {"phase": "stopping", "started_at": data["now"] - s, "visit": len(visits) + 1}
        )

    return edit


def no_earlier_runs(evs: Events) -> None:
    followed = hb(evs)["run_id"]
    for r in of_type(evs, "runs"):
        r["runs"] = [x for x in r["runs"] if x["run_id"] == followed]


def test_a_stop_much_longer_than_earlier_runs_took_is_a_warning_with_both_numbers():
    f = only(run(HEALTHY, stopping_for(65)), "stop_stalled")
    assert f.severity == "warning" and f.title.startswith("stopping for 1m05s at step ")
    assert "earlier runs stopped in 0s (median of 1; last: run " in f.evidence
    assert "kill (K)" in f.action
    assert "stop_stalled" not in codes(run(HEALTHY, stopping_for(55)))  # 0 s + the 60 s margin


def test_with_no_run_to_compare_with_the_fixed_bar_holds():
    f = only(run(HEALTHY, no_earlier_runs, stopping_for(185)), "stop_stalled")
    assert "no earlier comparable run to compare with; bar 3m00s" in f.evidence
    assert "stop_stalled" not in codes(run(HEALTHY, no_earlier_runs, stopping_for(170)))


def test_a_stopping_run_whose_heartbeat_went_stale_is_not_said_to_be_stopping():
    def stale(evs: Events) -> None:
        hb(evs)["now"] = NOW - 60  # the process is gone: stale_heartbeat speaks

    assert "stop_stalled" not in codes(run(HEALTHY, stopping_for(300), stale))

"""Compile progress: dynamo's own compile hooks, on a real torch.compile (aot_eager runs on
CPU), feed the run state; the compile cache's history says what the same graphs took."""

from __future__ import annotations

import json

import torch

from trainer.reporting.runstate import RunState
from trainer.runtime.compile.progress import CompileHistory, compile_signature, watch_compiles


def test_each_forward_and_backward_compile_is_counted_and_named_while_it_runs():
    state = RunState("r")
    state.set_phase("compiling")
    state.compile_expected(None, None, None)
    seen: list[str | None] = []

    def peeking_backend(gm, example_inputs):
        seen.append(state.compile.current)  # what a heartbeat written now would say
        from torch._dynamo.backends.common import aot_autograd

        return aot_autograd(fw_compiler=lambda g, _i: g, bw_compiler=lambda g, _i: g)(
            gm, example_inputs
        )

    def f(x, w):
        return (torch.sin(x) @ w).relu().sum()

    torch._dynamo.reset()
    compiled = torch.compile(f, backend=peeking_backend)
    x, w = torch.randn(8, 8), torch.randn(8, 8, requires_grad=True)
    with watch_compiles(state, lambda: "bucket 8 on cpu"):
        compiled(x, w).backward()
    assert seen and seen[0] is not None
    assert seen[0].startswith("graph 1: forward of ") and seen[0].endswith("bucket 8 on cpu")
    assert state.compile.done == 2  # the forward, then the backward at the first backward()
    assert state.compile.current is None
    assert state.phase_progress is not None
    assert (state.phase_progress.done, state.phase_progress.unit) == (2, "graphs")
    # Outside the block nothing is counted: the hooks are gone.
    torch.compile(lambda x: x.cos().sum(), backend="eager")(x)
    assert state.compile.done == 2


def test_the_history_says_what_the_same_signature_took_last_time(tmp_path):
    history = CompileHistory(tmp_path)
    a = compile_signature({"code": "abc", "buckets": [4096], "gpus": ["NVIDIA H200"]})
    b = compile_signature({"code": "abd", "buckets": [4096], "gpus": ["NVIDIA H200"]})
    assert a != b and a == compile_signature({"gpus": ["NVIDIA H200"], "buckets": [4096],
                                              "code": "abc"})  # fmt: skip
    assert history.last(a) is None
    history.record(a, 6, 30.61, "cold")
    history.record(b, 6, 5.52, "warm")
    last = history.last(a)
    assert last is not None and (last["graphs"], last["seconds"], last["cache"]) == (
        6,
        30.61,
        "cold",
    )
    state = RunState("r")
    state.set_phase("compiling")
    state.compile_expected(last["graphs"], last["seconds"], last["cache"])
    assert state.phase_progress is not None and state.phase_progress.total == 6
    assert (state.compile.expected, state.compile.last_s, state.compile.last_cache) == (
        6,
        30.61,
        "cold",
    )


def test_a_torn_or_foreign_history_is_no_history(tmp_path):
    (tmp_path / "history.json").write_text('{"x": {"graphs": "six"}, "y": 3')
    assert CompileHistory(tmp_path).last("x") is None
    (tmp_path / "history.json").write_text(json.dumps({"x": {"graphs": "six"}, "y": 3}))
    assert CompileHistory(tmp_path).last("x") is None and CompileHistory(tmp_path).last("y") is None
    CompileHistory(tmp_path).record("z", 2, 1.0, "warm")  # rewritten whole, readable again
    assert CompileHistory(tmp_path).last("z")["graphs"] == 2
    assert CompileHistory(None).last("z") is None  # no cache dir: nothing to read or write


def test_the_compiling_phase_counts_graphs_from_its_first_heartbeat_and_keeps_them():
    """The phase change itself carries the count (its heartbeat is written at once), and the
    target loader finishing meanwhile does not write its 'target copies' into it."""
    state = RunState("r")
    state.set_phase("loading_target", total=1, unit="target copies")
    written = []
    state.on_phase = lambda: written.append(state.phase_progress)
    state.compile_expected(None, None, None)
    assert state.phase == "compiling"
    assert written and written[-1] is not None and written[-1].unit == "graphs"
    state.progress(1, "target copies")  # the loader, done during compiling
    assert state.phase_progress is not None
    assert (state.phase_progress.done, state.phase_progress.total) == (0, None)
    state.compile_ended()
    assert state.phase_progress.done == 1

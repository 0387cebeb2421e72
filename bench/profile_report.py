"""Where each millisecond of a profiled window goes: a trainer trace, split per stream.

    python3 bench/profile_report.py RUN_DIR/profile/steps-151-154.json.gz [--steps 4] [--json]

Reads the Chrome trace `DFLASH_PROFILE` wrote (trainer/reporting/profile_window.py). Every
GPU kernel and copy is put down to
  - its stream (the target's side stream, the drafter's, the copy stream);
  - the pipeline stage whose thread launched it: the `stage:THREAD:STAGE` range that holds
    the launch on the CPU (joined by the launch's correlation id, runtime or driver API: the
    cuBLAS GEMMs launch through the driver); a launch outside every range is put down to its
    thread, `THREAD:(outside a stage)` (`pt_autograd_0`: autograd's device thread, which runs
    every backward; a pipeline thread's stage that began before the window opened);
  - a class from its name: GEMM (and "lm_head gemm" when the ATen op that launched it had
    a dimension of at least 100,000: the vocabulary), attention, optimizer (multi-tensor /
    fused Adam), copy (memcpy/memset), other (elementwise, norms, reductions: Triton, ATen).
The table gives ms per step of kernel time per (stream, stage, class), each stream's busy
time, the time two streams ran at once, and the GPU's idle time (no kernel on any stream).
"""

from __future__ import annotations

import argparse
import bisect
import gzip
import json
import re
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

GEMM = re.compile(r"gemm|nvjet|cutlass|xmma|sm90_|sm80_|cublas|matmul|_mm_", re.I)
ATTENTION = re.compile(r"flash|fmha|attention|flex|attn", re.I)
OPTIMIZER = re.compile(r"multi_tensor|fused_adam|adam|foreach", re.I)
VOCAB_MIN = 100_000  # a dimension this large is the vocabulary (the lm_head's GEMMs)


def kernel_class(name: str, cat: str) -> str:
    if cat in ("gpu_memcpy", "gpu_memset") or name.startswith(("Memcpy", "Memset")):
        return "copy"
    if ATTENTION.search(name):
        return "attention"
    if OPTIMIZER.search(name):
        return "optimizer"
    if GEMM.search(name):
        return "gemm"
    return "other"


def _thread_label(e: dict[str, Any]) -> str:
    """'pt_autograd_0' from 'thread 2064 (pt_autograd_0)'; the thread id otherwise."""
    name = str(e.get("thread", ""))
    if "(" in name and name.endswith(")"):
        name = name[name.index("(") + 1 : -1]
    return name if name and name != "python3" else f"thread {e.get('tid')}"


def _union(spans: list[tuple[float, float]]) -> float:
    total, cur_s, cur_e = 0.0, None, None
    for s, e in sorted(spans):
        if cur_e is None or s > cur_e:
            if cur_e is not None and cur_s is not None:
                total += cur_e - cur_s
            cur_s, cur_e = s, e
        else:
            cur_e = max(cur_e, e)
    if cur_e is not None and cur_s is not None:
        total += cur_e - cur_s
    return total


def load(path: Path) -> list[dict[str, Any]]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as f:
        data = json.load(f)
    events = data["traceEvents"] if isinstance(data, dict) else data
    names = {
        e.get("tid"): str((e.get("args") or {}).get("name", ""))
        for e in events
        if isinstance(e, dict) and e.get("ph") == "M" and e.get("name") == "thread_name"
    }
    out = [e for e in events if isinstance(e, dict) and e.get("ph") == "X"]
    for e in out:  # the thread's name where the trace gives it ("thread 2064 (pt_autograd_0)")
        if e.get("tid") in names:
            e["thread"] = names[e["tid"]]
    return out


def report(events: list[dict[str, Any]], steps: int) -> dict[str, Any]:
    """The split of the window, ms per step."""
    gpu = [e for e in events if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")]
    if not gpu:
        return {"steps": steps, "kernels": 0}
    # The stage ranges per CPU thread, and each launch's thread and time by correlation id.
    ranges: dict[Any, list[tuple[float, float, str]]] = defaultdict(list)
    for e in events:
        name = str(e.get("name", ""))
        if e.get("cat") == "user_annotation" and name.startswith("stage:"):
            ranges[e.get("tid")].append((float(e["ts"]), float(e["ts"]) + float(e["dur"]), name))
    for spans in ranges.values():
        spans.sort()
    starts = {tid: [s[0] for s in spans] for tid, spans in ranges.items()}
    # A pipeline thread's name from its stages: a launch of it outside any range (a stage
    # that began before the window opened) is still its thread's.
    owner = {
        tid: max(
            {n.split(":")[1] for _, _, n in spans},
            key=lambda t: sum(n.split(":")[1] == t for _, _, n in spans),
        )
        for tid, spans in ranges.items()
    }
    # CPU ops with their input shapes, per thread: what launched a GEMM (the lm_head's).
    ops: dict[Any, list[tuple[float, float, bool]]] = defaultdict(list)
    for e in events:
        if e.get("cat") == "cpu_op":
            dims = (e.get("args") or {}).get("Input Dims") or []
            vocab = any(
                isinstance(d, int) and d >= VOCAB_MIN
                for shape in dims
                if isinstance(shape, list)
                for d in shape
            )
            ops[e.get("tid")].append((float(e["ts"]), float(e["ts"]) + float(e["dur"]), vocab))
    for spans_ in ops.values():
        spans_.sort()
    op_starts = {tid: [s[0] for s in spans_] for tid, spans_ in ops.items()}
    launch: dict[Any, tuple[Any, float]] = {}
    thread_of: dict[Any, str] = {}
    for e in events:
        if e.get("cat") in ("cuda_runtime", "cuda_driver"):
            corr = (e.get("args") or {}).get("correlation")
            if corr is not None:
                launch[corr] = (e.get("tid"), float(e["ts"]))
                thread_of[corr] = owner.get(e.get("tid")) or _thread_label(e)

    def stage_of(corr: Any) -> str:
        if corr not in launch:
            return "?"
        tid, ts = launch[corr]
        spans = ranges.get(tid) or []
        i = bisect.bisect_right(starts.get(tid, []), ts) - 1
        while i >= 0:  # the innermost range holding the launch (ranges do not cross)
            s, end, name = spans[i]
            if s <= ts <= end:
                return name.removeprefix("stage:")
            i -= 1
        return f"{thread_of.get(corr, '?')}:(outside a stage)"

    def vocab_sized(corr: Any) -> bool:
        """Whether an op holding the launch had a vocabulary-sized dimension."""
        if corr not in launch:
            return False
        tid, ts = launch[corr]
        spans_ = ops.get(tid) or []
        i = bisect.bisect_right(op_starts.get(tid, []), ts) - 1
        depth = 0
        while i >= 0 and depth < 64:  # the ops holding the launch, innermost first
            s, end, vocab = spans_[i]
            if s <= ts <= end and vocab:
                return True
            i -= 1
            depth += 1
        return False

    per: dict[tuple[str, str, str], float] = defaultdict(float)
    spans_by_stream: dict[str, list[tuple[float, float]]] = defaultdict(list)
    stage_by_stream: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    for e in gpu:
        args = e.get("args") or {}
        stream = str(args.get("stream", e.get("tid")))
        stage = stage_of(args.get("correlation"))
        ts, dur = float(e["ts"]), float(e["dur"])
        cls = kernel_class(str(e.get("name", "")), str(e.get("cat")))
        if cls == "gemm" and vocab_sized(args.get("correlation")):
            cls = "lm_head gemm"
        per[(stream, stage, cls)] += dur
        spans_by_stream[stream].append((ts, ts + dur))
        stage_by_stream[stream][stage.split(":")[0]] += 1
    all_spans = [s for spans in spans_by_stream.values() for s in spans]
    t0 = min(s for s, _ in all_spans)
    t1 = max(e for _, e in all_spans)
    busy = _union(all_spans)
    per_stream_busy = {k: _union(v) for k, v in spans_by_stream.items()}
    ms = 1e-3 / steps  # trace times are microseconds
    # A stream is named after the thread that launched most of its kernels.
    names = {
        s: max(c.items(), key=lambda kv: kv[1])[0] if c else "?" for s, c in stage_by_stream.items()
    }
    return {
        "steps": steps,
        "kernels": len(gpu),
        "wall_ms": (t1 - t0) * ms,
        "busy_ms": busy * ms,
        "idle_ms": (t1 - t0 - busy) * ms,
        "overlap_ms": (sum(per_stream_busy.values()) - busy) * ms,
        "streams": {
            f"{s} ({names[s]})": {"busy_ms": round(b * ms, 2)} for s, b in per_stream_busy.items()
        },
        "split_ms": [
            {"stream": f"{s} ({names[s]})", "stage": st, "class": c, "ms": round(v * ms, 2)}
            for (s, st, c), v in sorted(per.items(), key=lambda kv: -kv[1])
        ],
    }


def table(r: dict[str, Any]) -> str:
    if not r.get("kernels"):
        return "no GPU kernels in the trace"
    lines = [
        f"window: {r['steps']} steps, {r['wall_ms']:.1f} ms/step wall, "
        f"{r['busy_ms']:.1f} busy (any stream), {r['idle_ms']:.1f} idle, "
        f"{r['overlap_ms']:.1f} two streams at once",
        "",
        "| stream | stage | class | ms/step |",
        "|---|---|---|---|",
    ]
    for row in r["split_ms"]:
        if row["ms"] >= 0.05:
            lines.append(f"| {row['stream']} | {row['stage']} | {row['class']} | {row['ms']:.2f} |")
    for s, v in r["streams"].items():
        lines.append(f"| {s} | (busy) | all | {v['busy_ms']:.2f} |")
    return "\n".join(lines)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("trace", type=Path)
    p.add_argument("--steps", type=int, default=0, help="steps in the window (default: from name)")
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    steps = args.steps
    if not steps:
        m = re.search(r"steps-(\d+)-(\d+)", args.trace.name)
        steps = int(m.group(2)) - int(m.group(1)) + 1 if m else 1
    r = report(load(args.trace), steps)
    print(json.dumps(r, indent=1) if args.json else table(r))
    return 0


if __name__ == "__main__":
    sys.exit(main())

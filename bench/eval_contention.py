"""Why the held-out eval is slow beside training on a GPU: the target's verify step timed
alone and beside a training-like load, at two CUDA stream priorities.

    python3 bench/eval_contention.py /tmp/qwen3-8b-random     (on the GPU machine)

The drafter is left out (a fixed proposal: every draft rejected, τ = 1, as in the measured
8B eval): what is timed is `speculative_decode`'s target side, the same `CachedTarget` the
eval thread uses. The load is a thread launching bf16 matmuls of training's size on its own
stream, in Python, as the pipeline's threads do (it competes for the SMs and the GIL).
Prints a table last.
"""

from __future__ import annotations

import sys
import threading
import time
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from trainer.evaluation.speculative import speculative_decode

LAYERS = [1, 9, 17, 25, 33]


def load_thread(stop: threading.Event, threads_gil: bool) -> None:
    s = torch.cuda.Stream()
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    with torch.cuda.stream(s):
        while not stop.is_set():
            for _ in range(8):
                a = (a @ a).clamp_(-1, 1)
            if threads_gil:
                s.synchronize()


def timed(model, priority: int | None, prompts: int, tokens: int) -> float:
    """ms per verify step over `prompts` decodes of `tokens` new tokens."""
    stream = torch.cuda.Stream(priority=priority) if priority is not None else None
    steps, t0 = 0, time.monotonic()
    with (
        torch.cuda.stream(stream)
        if stream is not None
        else torch.cuda.stream(torch.cuda.current_stream())
    ):
        for p in range(prompts):
            prompt = [(p * 7919 + i * 31) % 150000 for i in range(550)]
            _, stats = speculative_decode(
                model, LAYERS, lambda f, a, n: [0] * 15, prompt, tokens, 16
            )
            steps += len(stats.accepted)
    return (time.monotonic() - t0) * 1e3 / max(1, steps)


def main(path: str) -> None:
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16).cuda().eval()  # type: ignore[call-arg]
    lo, hi = torch.cuda.Stream.priority_range()  # type: ignore[call-arg]
    print(f"stream priority range (lowest, highest): ({lo}, {hi})", flush=True)
    timed(model, None, 1, 8)  # warm
    rows = [("alone, default stream", timed(model, None, 2, 32))]
    for name, prio in (
        ("beside load, priority -1", -1),
        (f"beside load, priority {hi} (highest)", hi),
        ("beside load, priority 0", 0),
    ):
        stop = threading.Event()
        th = threading.Thread(target=load_thread, args=(stop, True), daemon=True)
        th.start()
        time.sleep(1.0)
        rows.append((name, timed(model, prio, 2, 32)))
        stop.set()
        th.join()
        torch.cuda.synchronize()
    print("TABLE | case | ms per verify step |")
    for name, ms in rows:
        print(f"TABLE | {name} | {ms:.1f} |")


if __name__ == "__main__":
    main(sys.argv[1])

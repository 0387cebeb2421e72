"""The agent's samplers in a process of their own (agent/sampler_process.py, issue 32's line
latency): the real local agent, fake NVML. Its GPU and host samples come from its one child;
when that child dies, the agent says so and samples in its own process from then on.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any


def children(pid: int) -> list[int]:
    return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]


def count(r: Any, kind: str) -> int:
    return sum(1 for e in list(r.events) if e.get("type") == kind)


def test_the_samplers_run_in_a_child_and_in_the_agent_once_it_dies(
    local_target, fake_gpu, monkeypatch, remote_factory
):
    _, gpu = fake_gpu(devices=2)
    for k, v in gpu.env.items():
        monkeypatch.setenv(k, v)
    r = remote_factory(local_target)
    r.wait(lambda s: s.hello is not None, 30, "hello")
    agent = r.store.hello.pid
    r.wait(lambda s: s.gpu and len(s.gpu.devices) == 2 and s.host, 30, "GPU and host samples")
    (child,) = children(agent)  # no run launched: the samplers' process is its only child
    assert (
        Path(f"/proc/{child}/cmdline").read_bytes() == Path(f"/proc/{agent}/cmdline").read_bytes()
    )

    os.kill(child, signal.SIGKILL)
    r.wait(
        lambda s: any(
            e.get("type") == "log" and "the samplers' process ended" in e.get("message", "")
            for e in list(r.events)
        ),
        10,
        "the agent saying its samplers' process ended",
    )
    gpus, hosts = count(r, "gpu"), count(r, "host")
    r.wait(lambda s: count(r, "gpu") >= gpus + 2, 10, "GPU samples from the agent itself")
    r.wait(lambda s: count(r, "host") > hosts, 15, "a host sample from the agent itself")
    assert children(agent) == []  # reaped, and no other started: threads from now on

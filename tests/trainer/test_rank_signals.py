"""The launcher passes stack-dump signals only to its own children that run the trainer
(trainer/distributed/signals.py): never to another child, never to a pid named in a file."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

from trainer.distributed.signals import forward_to_ranks, rank_children


def test_only_children_running_the_trainer_are_ranks_and_get_the_signal(tmp_path):
    marker = tmp_path / "got"
    # A child running `... trainer` that records a SIGUSR1, and a bystander child (sleep)
    # whose SIGUSR1 would end it.
    rank_like = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import signal, sys, time\n"
            "signal.signal(signal.SIGUSR1, lambda *a: open(sys.argv[1], 'w').write('usr1'))\n"
            "time.sleep(30)",
            str(marker),
            "trainer",
        ]
    )
    bystander = subprocess.Popen(["sleep", "30"])
    try:
        deadline = time.monotonic() + 10
        while rank_like.pid not in rank_children() and time.monotonic() < deadline:
            time.sleep(0.05)
        kids = rank_children()  # (this pytest worker may have other children of its own)
        assert rank_like.pid in kids and bystander.pid not in kids  # a child, not a rank
        time.sleep(0.5)  # the child's handler is installed
        forward_to_ranks(signal.SIGUSR1, None)
        deadline = time.monotonic() + 10
        while not marker.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert marker.read_text() == "usr1"
        assert bystander.poll() is None  # untouched
    finally:
        rank_like.kill()
        bystander.kill()
        rank_like.wait()
        bystander.wait()

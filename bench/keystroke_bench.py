"""Keys by mode at scale (issue 32's number): N random keystroke strings (default 10,000),
each sent to a viewer or to a dialog that kills or signals, of the real app attached through
a real local agent to a real tiny run. Counts the requests that left the app from a viewer
(want 0) and the dialogs confirmed without their word typed (want 0).

The same property as tests/monitor/test_keys_by_mode.py (the same harness,
tests/monitor/keystrokes.py), run for as long as asked. The JSON result is rewritten after
every example, so a run stopped early still reports what it did.

    .venv/bin/python bench/keystroke_bench.py --examples 300 --out /tmp/keys.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests"), str(ROOT / "tests" / "monitor")]

from hypothesis import HealthCheck, Phase, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from keystrokes import DIALOGS, KEYS, VIEWERS, LiveApp, start_run, stop_run  # noqa: E402


def write(path: Path, result: dict[str, Any]) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(result, indent=1) + "\n")
    tmp.replace(path)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--examples", type=int, default=10_000)
    ap.add_argument("--out", type=Path, default=Path("keystroke-bench.json"))
    ap.add_argument(
        "--typist-keys",
        action="store_true",
        help="wait as Pilot's press does (until the process looks idle) after every key, "
        "not only until the app has handled it: ~5x slower",
    )
    ap.add_argument(
        "--only",
        choices=["viewers", "dialogs"],
        help="draw the screen from viewers or dialogs alone (both by default): to bring one "
        "kind's count up to the issue's 10,000 without the other's",
    )
    args = ap.parse_args()
    if args.examples < 1:
        print(f"--examples {args.examples}: must be 1 or more", file=sys.stderr)
        return 2
    work = Path(tempfile.mkdtemp(prefix="keystroke-bench-"))
    os.environ["XDG_CONFIG_HOME"] = str(work / "config")
    result: dict[str, Any] = {
        "examples_asked": args.examples,
        "screens": args.only or "viewers and dialogs",
        "machine": f"{platform.node()} ({os.cpu_count()} CPUs)",
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "examples": 0,
        "viewer_examples": 0,
        "dialog_examples": 0,
        "keys_sent_at_most": 0,
        "requests_from_viewers": 0,
        "confirmed_without_the_word": 0,
        "word_typed_then_cut": 0,
        "key_wait": "typist (Pilot's press)" if args.typist_keys else "settled (keystrokes.py)",
        "late_requests": 0,
        "failures": [],
        "seconds": 0.0,
        "examples_per_s": 0.0,
        "done": False,
    }
    # A SIGTERM (`timeout`, a kill) ends the bench through its `finally`, which stops the
    # run: left to the default action, the tiny run trained on, unseen, until killed by hand.
    # KeyboardInterrupt: hypothesis passes it straight on (any other exception it would
    # try to reproduce, example by example).
    # SIGINT too: a shell without job control starts a background job (`cmd &`) with SIGINT
    # ignored, and Python keeps an ignored SIGINT ignored, so a bench run that way shrugged
    # off its first ^C / `kill -INT`.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    target, _ = start_run(work / "remote")
    live: LiveApp | None = None
    t0 = time.monotonic()
    try:
        live = LiveApp(target, settled_keys=not args.typist_keys)
        # The run only has to be alive (its dialogs need it): at the lowest CPU priority it
        # trains on without taking the app's share of a small machine's cores.
        procs = live.app.store.procs
        if procs is not None and procs.pgid:
            os.setpriority(os.PRIO_PGRP, procs.pgid, 19)
        t0 = time.monotonic()

        screens = {"viewers": VIEWERS, "dialogs": DIALOGS}.get(args.only or "", VIEWERS + DIALOGS)

        @settings(
            max_examples=args.examples,
            deadline=None,
            database=None,
            phases=[Phase.generate],
            suppress_health_check=list(HealthCheck),
        )
        @given(where=st.sampled_from(screens), keys=KEYS)
        def example(where: str, keys: list[str]) -> None:
            assert live is not None
            if where in VIEWERS:
                sent = live.call(live.viewer_example(where, keys))
                result["viewer_examples"] += 1
                result["requests_from_viewers"] += len(sent)
            else:
                sent, typed = live.call(live.dialog_example(where, keys))
                result["dialog_examples"] += 1
                result["confirmed_without_the_word"] += len(sent)
                result["word_typed_then_cut"] += int(typed)
            if sent and len(result["failures"]) < 20:
                result["failures"].append({"where": where, "keys": keys, "sent": sent})
            result["examples"] += 1
            result["keys_sent_at_most"] += len(keys)
            # A key's request written after its example's window closed (keystrokes.py).
            result["late_requests"] = len(live.late_requests)
            result["seconds"] = round(time.monotonic() - t0, 1)
            result["examples_per_s"] = round(result["examples"] / result["seconds"], 2)
            write(args.out, result)

        try:
            example()
            result["done"] = True
        except KeyboardInterrupt:
            result["stopped_early"] = True  # the counts stand for the examples run
        write(args.out, result)
    finally:
        try:
            if live is not None:
                live.close()
        finally:
            stop_run(target)
    print(json.dumps(result, indent=1))
    bad = (
        result["requests_from_viewers"]
        + result["confirmed_without_the_word"]
        + result["late_requests"]
    )
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())

"""`dflash-tui replay RUN --headless [--json] [--at TIME]`: the status at one moment of a
run's telemetry, printed as `status` prints it, then exit with status's code (0 healthy,
1 warning, 2 critical: a crash at the end is critical, as it was then).

Text: the status line at that moment (its clock is the moment's), a `replay:` line saying
which entry and how long before the end, then the findings the rules gave at that moment.
`--json`: status's snapshot object (dflash_tui/headless.py), `time` the moment's, with
`replay: {entry, entries, at, before_end_s, skipped, cut, gpu_samples: false}` added.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Awaitable, Callable
from dataclasses import asdict
from typing import TextIO

from dflash_tui import evaluation, replay_source, sanitize
from dflash_tui.control import Requester
from dflash_tui.diagnosis import config_for, diagnose
from dflash_tui.headless import exit_code_for, status_line
from dflash_tui.replay import parse_at
from dflash_tui.state import Store
from dflash_tui.targets import Target


def work(
    target: Target, run_id: str, at: str | None, as_json: bool, out: TextIO | None = None
) -> Callable[[Requester, Store], Awaitable[int]]:
    """What the command does over a connected link (`commands/oneshot.with_link`)."""

    async def run(link: Requester, store: Store) -> int:
        stream = out or sys.stdout
        rec = await replay_source.fetch(link, store, run_id)
        index = rec.index_at(parse_at(at or "end", rec.end))
        s = rec.store_at(index)
        now = s.clock()
        findings = diagnose(s, now, config_for(target.extra))
        where = {
            "entry": index + 1,
            "entries": len(rec.entries),
            "at": now,
            "before_end_s": rec.end - now,
            "skipped": rec.skipped,
            "cut": rec.cut,
            "gpu_samples": False,  # the agent's NVML samples are not kept in the run dir
        }
        if as_json:
            tau = evaluation.of_store(s)
            snapshot = {
                "kind": "snapshot",
                "time": now,
                "state": s.to_json(now),
                "tau": tau.to_json() if tau else None,
                "findings": [asdict(f) for f in findings],
                "replay": where,
            }
            stream.write(json.dumps(snapshot, default=str) + "\n")
        else:
            encoding = (getattr(stream, "encoding", "") or "").lower().replace("-", "")
            lines = [status_line(s, findings, now=now, unicode=encoding.startswith("utf"))]
            skipped = f", {rec.skipped} unreadable lines skipped" if rec.skipped else ""
            lines.append(
                f"replay: entry {index + 1}/{len(rec.entries)} at {rec.when(index)}; "
                f"GPU util/power not recorded in the run dir{skipped}"
            )
            lines += [f"  {f.severity}: {f.title} — {f.evidence} → {f.action}" for f in findings]
            stream.write("".join(sanitize.field(line) + "\n" for line in lines))
        stream.flush()
        return exit_code_for(s, findings)

    return run

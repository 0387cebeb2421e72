"""Record the run dir the replay tests scrub through: `python -m tests.infra.record_replay_run`.

A real tiny CPU run, through the operator's path (`deploy` and `launch` through a local
agent): its drafter steps are slowed (DFLASH_FAULT=slow:drafter:S) so the run trains for a
minute or two, long enough for telemetry.jsonl to hold a heartbeat every 5 s across more
than a minute, then a drafter thread raises at its item N (DFLASH_FAULT=drafter:N): the run
crashes with the traceback in its final heartbeat and exit code 1.

The run dir is copied into tests/fixtures/rundirs/replay-crash/ byte for byte, checkpoints
left out (the replay reads none); the README there says when and how it was recorded.
"""

from __future__ import annotations

import argparse
import asyncio
import platform
import shutil
import sys
import tempfile
import time
from pathlib import Path

from dflash_tui import control
from dflash_tui.targets import resolve_target
from tests.infra.record_scenarios import BASE, TINY, Run, connect, drive

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "tests" / "fixtures" / "rundirs" / "replay-crash"
FAULT = "slow:drafter:0.4,drafter:{crash_at}"
OVERRIDES = ["train.checkpoint_every=100000"]  # no checkpoint: the replay reads none


async def record(workdir: Path, crash_at: int) -> Path:
    target = resolve_target("local", remote_dir=str(workdir), python=sys.executable)
    first = await connect(target)
    await control.deploy(first.link)
    await first.link.close()
    run = Run(fault=FAULT.format(crash_at=crash_at), overrides=OVERRIDES, wait_s=900.0)
    if not await drive(target, run, "replay-crash", TINY):
        raise SystemExit("the run died at start")
    runs = sorted((workdir / "runs").iterdir())
    return [r for r in runs if r.is_dir()][-1]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="record_replay_run", description=__doc__)
    p.add_argument("--crash-at", type=int, default=150, help="the drafter item that raises")
    args = p.parse_args(argv)
    workdir = Path(tempfile.mkdtemp(prefix="dflash-replay-"))
    started = time.time()
    run_dir = asyncio.run(record(workdir, args.crash_at))
    if OUT.exists():
        shutil.rmtree(OUT)
    OUT.mkdir(parents=True)
    shutil.copytree(run_dir, OUT / run_dir.name, ignore=shutil.ignore_patterns("checkpoints"))
    (OUT / "README.md").write_text(
        "# A crashed tiny CPU run, for the replay tests\n\n"
        f"Recorded on {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime(started))} by "
        "`python -m tests.infra.record_replay_run` "
        f"(Python {platform.python_version()}, {platform.machine()}): `dflash-tui deploy` and "
        "`launch` of trainer/configs/tiny-cpu.toml through a local agent, with "
        f"`{' '.join('--set ' + o for o in [*BASE, *OVERRIDES])}` and "
        f"`DFLASH_FAULT={FAULT.format(crash_at=args.crash_at)}` (drafter steps slowed, then a "
        "drafter thread raises): the run crashed, exit code 1.\n\n"
        "Edits, all of them: the `checkpoints/` folder was not kept. Everything else is byte "
        "for byte what the trainer, the agent and its wrapper wrote.\n"
    )
    shutil.rmtree(workdir, ignore_errors=True)
    print(f"recorded {run_dir.name} into {OUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

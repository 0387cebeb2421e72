"""Fetching a replay: the run's telemetry.jsonl, metrics.jsonl and train.log through the
agent (its `read_file`: a regular file directly in a real run dir under the run root, never
what a symlink names), and its row in the runs list, into a `replay.Recording`.

The run dir is untrusted: everything read here is decoded through the contract by
`replay.recording`, which skips and counts what does not decode.
"""

from __future__ import annotations

import posixpath

from dflash_tui import control
from dflash_tui.control import Requester
from dflash_tui.link.link import LinkError
from dflash_tui.replay import TAIL_BYTES, Recording, ReplayError, recording
from dflash_tui.state import Store


async def fetch(link: Requester, store: Store, run_id: str) -> Recording:
    """Raises ReplayError (one line) when there is no such run or no telemetry to replay."""
    runs = await control.list_runs(link, store)
    run = next((r for r in runs if r.run_id == run_id), None)
    root = store.hello.run_root if store.hello else ""
    if run is None:
        raise ReplayError(f"no run {run_id!r} under {root or 'the run root'}")
    texts: dict[str, str] = {}
    cut: list[str] = []
    for name, limit in TAIL_BYTES.items():
        try:
            got = await control.read_file(link, name, run_id, tail_bytes=limit)
        except LinkError as e:
            if name == "telemetry.jsonl":
                raise ReplayError(f"run {run_id}: {e}") from None
            texts[name] = ""  # an older trainer without metrics.jsonl: the step lines do
            continue
        texts[name] = got.text
        if len(got.text.encode("utf-8", "replace")) >= limit:
            cut.append(name)  # only its end came: the first line is partial
    return recording(
        run_id,
        texts["telemetry.jsonl"],
        texts["metrics.jsonl"],
        texts["train.log"],
        cut=tuple(cut),
        run=run,
        others=[r for r in runs if r.run_id != run_id],
        hello=store.hello,
        run_dir=posixpath.join(root, run_id) if root else None,
        target=store.target,
    )

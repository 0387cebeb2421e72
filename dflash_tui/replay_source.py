"""Fetching a replay: the run's telemetry.jsonl, metrics.jsonl and train.log through the
agent (its `read_file`: a regular file directly in a real run dir under the run root, never
what a symlink names), and its row in the runs list, into a `replay.Recording`.

One answer holds at most a page (PAGE_BYTES: the contract's longest string), so a long file
is read back from its end a page of whole lines at a time, up to its budget in TAIL_BYTES;
a file rewritten between pages (the trainer thins telemetry.jsonl every 20 minutes) is read
again from its end. The run dir is untrusted: everything read here is decoded through the
contract by `replay.recording`, which skips and counts what does not decode.
"""

from __future__ import annotations

import posixpath

from dflash_tui import control
from dflash_tui.control import Requester
from dflash_tui.link.link import LinkError
from dflash_tui.replay import TAIL_BYTES, Recording, ReplayError, recording
from dflash_tui.state import Store
from trainer.contract.typed import MAX_STR

PAGE_BYTES = MAX_STR  # bytes decode to at most as many characters: one answer's text


async def fetch(link: Requester, store: Store, run_id: str) -> Recording:
    """Raises ReplayError (one line) when there is no such run or no telemetry to replay."""
    runs = await control.list_runs(link, store)
    run = next((r for r in runs if r.run_id == run_id), None)
    root = store.hello.run_root if store.hello else ""
    if run is None:
        raise ReplayError(f"no run {run_id!r} under {root or 'the run root'}")
    texts: dict[str, str] = {}
    cut: list[str] = []
    for name, budget in TAIL_BYTES.items():
        try:
            texts[name], was_cut = await read_back(link, name, run_id, budget)
        except LinkError as e:
            if name == "telemetry.jsonl":
                raise ReplayError(f"run {run_id}: {e}") from None
            texts[name] = ""  # an older trainer without metrics.jsonl: the step lines do
            continue
        if was_cut:
            cut.append(name)  # its oldest lines were left: past the budget
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


async def read_back(
    link: Requester, name: str, run_id: str, budget: int, page: int = PAGE_BYTES
) -> tuple[str, bool]:
    """The whole lines that start in the file's last `budget` bytes, and whether older ones
    were left."""
    for _attempt in range(3):
        pages: list[str] = []
        before: int | None = None
        size: int | None = None
        got = 0
        while True:
            p = await control.read_file(
                link, name, run_id, tail_bytes=min(page, budget - got), before=before, lines=True
            )
            if size is not None and p.size < size:
                break  # rewritten (thinned) since the last page: the offsets moved
            size = size if size is not None else p.size
            pages.append(p.text)
            got += (p.size if before is None else before) - p.start
            if p.start == 0 or got >= budget:
                return "".join(reversed(pages)), p.start > 0
            before = p.start
    raise ReplayError(f"run {run_id}: {name} was rewritten while it was read, three times")

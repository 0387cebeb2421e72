"""What every one-shot command shares, one host's and a group's hosts' (commands/groups.py):
its lines out and its one fresh link.

What the commands print quotes the host (run ids, paths, the agent's errors and notes): one
line goes out through `out` or `err`, its control characters made visible; a text the host
wrote (a stack dump) through `sanitize.lines`. Nothing here imports torch or textual: the
link and the store load only once a command runs.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from dflash_tui import sanitize
from dflash_tui.targets import Target
from trainer.contract.protocol import Progress

if TYPE_CHECKING:
    from dflash_tui.link.link import Link
    from dflash_tui.state import Store

CONNECT_S = 1.5  # a one-shot answer about a silent host, start-up included: < 3 s

Work = Callable[["Link", "Store"], Awaitable[int]]


def out(text: str) -> None:
    print(sanitize.field(text), flush=True)


def err(text: str) -> None:
    """`text` on stderr, a line each of its lines (every bad --set has its own)."""
    for line in text.split("\n"):
        print(f"dflash-tui: {sanitize.field(line)}", file=sys.stderr, flush=True)


def progress(event: Progress) -> None:
    print(f"  … {sanitize.field(event.message)}", file=sys.stderr, flush=True)


def connect_timeout(args: argparse.Namespace) -> float:
    """The seconds the host has to answer: --connect-timeout, else CONNECT_S."""
    return float(args.connect_timeout or CONNECT_S)


async def with_link(
    target: Target,
    work: Work,
    follow: str | None = None,
    connect_timeout: float | None = None,
    err: Callable[[str], None] = err,
) -> int:
    """One command over a fresh link: a host it cannot reach is the answer (exit 3), at
    once, not retried (link.py `one_shot`). `err` says what went wrong (a group's host
    prefixes its name)."""
    from dflash_tui.link.link import BadInput, Link, LinkError
    from dflash_tui.state import Store

    store = Store(target.name)
    link = Link(target, store.apply, follow=follow, one_shot=True, connect_timeout=connect_timeout)
    link.start()
    try:
        await link.wait_connected(30)
        return await work(link, store)
    except BadInput as e:  # what the command named is not there: bad input, as elsewhere
        err(str(e))
        return 2
    except LinkError as e:
        if link.state != "connected":
            err(f"cannot reach {target.name}: {e}")
            return 3
        err(str(e))
        return 1
    finally:
        await link.close()

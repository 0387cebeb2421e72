"""Fixtures for monitor tests (see monitor_helpers.Remote)."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from monitor_helpers import Remote

from dflash_tui.targets import Target
from trainer.contract.protocol import Kill


@pytest.fixture
def remote_factory(tmp_path: Path) -> Iterator[Callable[..., Remote]]:
    made: list[Remote] = []

    def make(target: Target, **kw: Any) -> Remote:
        r = Remote(target, **kw)
        made.append(r)
        return r

    yield make
    for r in made:
        # Never leave a trainer behind: kill whatever is alive under the test's run roots.
        try:
            if r.link.state == "connected":
                r.request(Kill(timeout_s=10, drain_timeout_s=5), timeout=40)
        except Exception:
            pass
        r.close()


@pytest.fixture
def local_target(tmp_path: Path) -> Target:
    return Target(
        name="local", kind="local", remote_dir=str(tmp_path / "remote"), python=sys.executable
    )

"""The TUI costs next to nothing while nothing changes: it redraws on events, and once a
second only the ages that moved (issue 16: it used 15 % of a core, repainting 4x/s)."""

from __future__ import annotations

import shutil

import pytest
from infra.tui_cpu import measure

pytestmark = pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux not installed")

IDLE_BOUND_PCT = 5.0  # loose: the bench measures ~1 % (bench/README.md); this is CI's bar


@pytest.mark.serial  # a CPU figure: not beside other tests
def test_idle_tui_uses_under_5_percent_of_a_core(tmp_path):
    cpu = measure(tmp_path, idle_s=10.0, busy_s=0)
    assert cpu.idle_pct < IDLE_BOUND_PCT, cpu

"""`dflash-tui explain [CODE]`: a finding code's entry from the rules' registry, every code's
line without one, and an unknown code refused in one line with the nearest (exit 2). The CLI
as a subprocess, as an operator runs it."""

from __future__ import annotations

from test_cli_slips import run_cli

from dflash_tui.diagnosis import docs


def test_explain_a_code_prints_its_entry_with_the_thresholds_defaults() -> None:
    r = run_cli("explain", "gil_pressure")
    assert r.returncode == 0, r.stderr
    assert r.stdout == docs.explain("gil_pressure") + "\n"
    lines = r.stdout.splitlines()
    assert lines[0] == "gil_pressure (warning): threads wake late: Python holds the GIL"
    assert any(ln.split() == ["gil_p99_ms", "=", "20.0"] for ln in lines)
    assert any(ln.startswith("decides") for ln in lines)
    assert any(ln.startswith("to do") for ln in lines)


def test_explain_alone_lists_every_code_with_its_summary() -> None:
    r = run_cli("explain")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert [ln.split()[0] for ln in lines] == list(docs.codes())
    assert len(lines) == 53
    slow_link = next(ln for ln in lines if ln.startswith("slow_link "))
    assert slow_link.split(None, 2)[1:] == [
        "warning",
        "processes mode: the ranks wait on the link between them",
    ]


def test_an_unknown_code_is_one_line_with_the_nearest_codes() -> None:
    r = run_cli("explain", "gil_presure")
    assert (r.returncode, r.stdout) == (2, "")
    assert r.stderr == (
        "dflash-tui: unknown finding code 'gil_presure': did you mean gil_pressure?\n"
    )
    r = run_cli("explain", "zzz\x1b[2J")
    assert r.returncode == 2
    assert r.stderr == (
        "dflash-tui: unknown finding code 'zzz\\x1b[2J': `dflash-tui explain` lists them\n"
    )

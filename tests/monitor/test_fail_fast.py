"""One-shot answers come at once (issue 16): `status` of a host it cannot reach says so in
one line within 3 s (exit 3), and of a run root with no run says which root (exit 1); the
other one-shot commands fail as fast. The CLI as a subprocess, timed from its start."""

from __future__ import annotations

import socket
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from test_cli_slips import closed_port, home, run_cli  # noqa: F401  (home: a fixture)


def timed(*args: str, env: dict[str, str]) -> tuple[float, object]:
    t0 = time.monotonic()
    r = run_cli(*args, env=env, timeout=30)
    return time.monotonic() - t0, r


@pytest.fixture
def silent_port() -> Iterator[int]:
    """A port whose host never answers: the kernel completes the TCP handshake (the
    backlog), nobody ever speaks SSH — as a host behind a dropping firewall, a wedged sshd
    or a half-dead link: only a timeout ends the wait."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen(8)
    yield int(s.getsockname()[1])
    s.close()


@pytest.mark.serial  # a time bound: not beside another test's trainer
def test_status_of_a_refused_port_is_one_line_within_3s(home):  # noqa: F811
    port = closed_port()
    took, r = timed("status", f"ssh://127.0.0.1:{port}", env=home)
    assert r.returncode == 3, r.stdout + r.stderr
    assert r.stdout.count("\n") == 1, r.stdout
    assert r.stdout.startswith(f"cannot reach ssh://127.0.0.1:{port}: 127.0.0.1:{port} ")
    assert "Connect call failed" in r.stdout or "refused" in r.stdout.lower()
    assert took < 3.0, took


@pytest.mark.serial
def test_status_of_a_host_that_never_answers_is_one_line_within_3s(home, silent_port):  # noqa: F811
    took, r = timed("status", f"ssh://127.0.0.1:{silent_port}", env=home)
    assert r.returncode == 3, r.stdout + r.stderr
    assert r.stdout == (
        f"cannot reach ssh://127.0.0.1:{silent_port}: 127.0.0.1:{silent_port} unreachable: "
        "no answer within 1.5s\n"
    )
    assert took < 3.0, took


@pytest.mark.serial
def test_status_of_an_unresolvable_host_is_one_line_within_3s(home):  # noqa: F811
    took, r = timed("status", "ssh://no-such-host.invalid", env=home)
    assert r.returncode == 3, r.stdout + r.stderr
    assert r.stdout.startswith("cannot reach ssh://no-such-host.invalid: no-such-host.invalid")
    assert r.stdout.count("\n") == 1 and took < 3.0, (took, r.stdout)


@pytest.mark.serial
def test_the_other_one_shot_commands_fail_as_fast(home):  # noqa: F811
    port = closed_port()
    for args in (["runs"], ["kill"], ["dump-stacks"]):
        took, r = timed(*args, f"ssh://127.0.0.1:{port}", env=home)
        assert r.returncode == 3, (args, r.stdout, r.stderr)
        assert r.stderr.startswith(f"dflash-tui: cannot reach ssh://127.0.0.1:{port}: ")
        assert r.stderr.count("\n") == 1 and took < 3.0, (args, took, r.stderr)


@pytest.mark.serial
def test_status_of_an_empty_run_root_names_it_and_is_exit_1_within_3s(tmp_path, home):  # noqa: F811
    """The real local agent, a run root with no run: not healthy (exit 1), and the root it
    searched named."""
    root = tmp_path / "runs"
    root.mkdir()
    where = ["local", "--run-root", str(root), "--python", sys.executable]
    took, r = timed("status", *where, env=home)
    assert r.returncode == 1, r.stdout + r.stderr
    lines = r.stdout.splitlines()
    assert " no run" in lines[0]
    assert lines[1] == f"no run under {root}"
    assert took < 3.0, took


def test_status_of_a_run_root_that_is_not_there_names_it(tmp_path, home):  # noqa: F811
    root: Path = tmp_path / "nowhere" / "runs"
    r = run_cli("status", "local", "--run-root", str(root), env=home, timeout=30)
    assert r.returncode == 1, r.stdout + r.stderr
    assert f"no run under {root}" in r.stdout

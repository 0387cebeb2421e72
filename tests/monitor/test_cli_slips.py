"""The command line without slips (issue 16): a typo'd command is named, a TUI without a
terminal is refused, each command's --help lists its own options, `runs --json` is JSON.
The CLI as a subprocess, as an operator (or a script in tmux) runs it."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dflash_tui import cli
from dflash_tui.commands.slips import slip_for, ssh_aliases

ROOT = Path(__file__).resolve().parents[2]


def run_cli(
    *args: str, env: dict[str, str] | None = None, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    """The CLI with no terminal anywhere (stdin from /dev/null, output captured)."""
    return subprocess.run(
        [sys.executable, "-m", "dflash_tui.cli", *args],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=ROOT,
        env={**os.environ, **(env or {})},
    )


@pytest.fixture
def home(tmp_path: Path) -> dict[str, str]:
    """A HOME and config dir of the test's own: no ssh config, no named targets."""
    (tmp_path / "home" / ".ssh").mkdir(parents=True)
    return {"HOME": str(tmp_path / "home"), "XDG_CONFIG_HOME": str(tmp_path / "config")}


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.parametrize(
    ("typed", "meant"), [("stauts", "status"), ("lanch", "launch"), ("rusn", "runs")]
)
def test_a_typo_close_to_a_command_is_named_not_taken_for_a_host(typed, meant, home):
    r = run_cli(typed, env=home)
    assert r.returncode == 2
    assert r.stderr == f"dflash-tui: unknown command '{typed}': did you mean {meant}?\n"
    assert r.stdout == ""


def test_a_typo_after_the_options_is_named_too(home):
    r = run_cli("--headless", "--once", "stauts", env=home)
    assert (r.returncode, r.stderr) == (
        2,
        "dflash-tui: unknown command 'stauts': did you mean status?\n",
    )


def test_a_word_that_names_a_host_is_a_host_even_close_to_a_command(tmp_path, home):
    """`statu` as a configured target, `stats` as an ssh alias, `status.lan` with a dot:
    each is connected to (the one-shot answer shows which host it tried), not refused."""
    root = tmp_path / "empty-runs"
    root.mkdir()
    config = Path(home["XDG_CONFIG_HOME"]) / "dflash-tui" / "config.toml"
    config.parent.mkdir(parents=True)
    config.write_text(f'[targets.statu]\ntarget = "local"\nrun_root = "{root}"\n')
    port = closed_port()
    ssh_config = Path(home["HOME"]) / ".ssh" / "config"
    ssh_config.write_text(f"Host stats\n  HostName 127.0.0.1\n  Port {port}\n")

    named = run_cli("statu", "--once", "--python", sys.executable, env=home)
    assert named.returncode == 1, named.stdout + named.stderr  # the empty run root
    assert f"no run under {root}" in named.stdout

    alias = run_cli("stats", "--once", env=home)
    assert alias.returncode == 3, alias.stdout + alias.stderr
    assert alias.stdout.startswith("cannot reach stats: stats unreachable: ")
    assert f"127.0.0.1', {port})" in alias.stdout  # where the alias points

    dotted = run_cli("status.invalid", "--once", env=home)
    assert dotted.returncode == 3 and "cannot reach status.invalid" in dotted.stdout


def test_the_slip_rule() -> None:
    commands = list(cli.SUBCOMMANDS)
    assert slip_for("stauts", commands, aliases=()) == "status"
    assert slip_for("dmeo", commands, aliases=()) == "demo"
    for host in ("gpu-box", "local", "root@status", "status:22", "h100.lan"):
        assert slip_for(host, commands, aliases=()) is None, host
    assert slip_for("stauts", commands, configured=["stauts"], aliases=()) is None
    assert slip_for("stauts", commands, aliases=["stauts"]) is None
    assert slip_for("status", commands, aliases=()) is None  # a command is no slip


def test_ssh_aliases_are_the_literal_host_names(tmp_path) -> None:
    config = tmp_path / "config"
    config.write_text("Host box1 box2\n  Port 22\nHost *.lan !x\nhost=box3\nMatch all\n")
    assert ssh_aliases(config) == {"box1", "box2", "box3"}
    assert ssh_aliases(tmp_path / "none") == set()


def test_the_tui_without_a_terminal_is_refused_at_once_not_a_busy_loop(tmp_path, home):
    """Textual's input thread at EOF on a stdin that is no terminal spun (select says
    readable, the read returns nothing: 62 % of a core for as long as it ran)."""
    root = tmp_path / "runs"
    root.mkdir()
    t0 = time.monotonic()
    r = run_cli("local", "--run-root", str(root), env=home, timeout=30)
    took = time.monotonic() - t0
    assert r.returncode == 2, r.stdout + r.stderr
    assert r.stderr.startswith("dflash-tui: not a terminal: use --headless")
    assert r.stderr.count("\n") == 1 and r.stdout == ""
    assert took < 20  # it returns; a spinning TUI never would


def help_of(name: str | None) -> str:
    parser = cli.build_parser() if name is None else cli.build_command_parser(name)
    return parser.format_help()


def options(text: str) -> set[str]:
    """The options --help lists: the first word of each of its option lines."""
    lines = (ln.split()[0].rstrip(",") for ln in text.splitlines() if ln.strip())
    return {w for w in lines if w.startswith("--")}


def test_each_commands_help_lists_only_its_own_options() -> None:
    plain = options(help_of(None))
    assert {"--theme", "--headless", "--once", "--json", "--notify", "--pct"} <= plain
    status = options(help_of("status"))
    assert {"--json", "--run-dir", "--notify", "--connect-timeout", "--run-root"} <= status
    assert not status & {"--theme", "--headless", "--once", "--interval", "--set", "--env"}
    runs = options(help_of("runs"))
    assert {"--json", "--env"} <= runs and not runs & {"--theme", "--notify", "--once"}
    kill = options(help_of("kill"))
    assert {"--timeout", "--drain-timeout", "--run"} <= kill
    assert not kill & {"--theme", "--json", "--headless", "--notify", "--interval"}
    demo = options(help_of("demo"))
    assert {"--headless", "--theme", "--set", "--remote-dir"} <= demo
    assert not demo & {"--pct", "--identity", "--connect-timeout", "--once"}
    replay = options(help_of("replay"))
    assert {"--at", "--headless", "--json", "--theme"} <= replay and "--set" not in replay
    compare = options(help_of("compare"))
    assert {"--json", "--run-root"} <= compare and not compare & {"--theme", "--headless"}
    for name in cli.SUBCOMMANDS:
        if name not in ("demo", "fleet", "replay"):  # the ones that open a screen
            assert "--theme" not in options(help_of(name)), name


def test_help_as_the_operator_types_it(home):
    r = run_cli("kill", "--help", env=home)
    assert r.returncode == 0 and r.stdout.startswith("usage: dflash-tui kill")
    assert not options(r.stdout) & {"--theme", "--headless", "--json", "--notify"}


def test_runs_json_of_an_empty_run_root_is_an_empty_list(tmp_path, home):
    root = tmp_path / "runs"
    root.mkdir()
    r = run_cli("runs", "local", "--run-root", str(root), "--json", env=home)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout) == []

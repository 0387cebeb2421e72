"""Hostile files in the slots a user names (issue 33): the trainer's `--config`, `dflash-tui
launch --config`, the monitor's own config.toml, `--known-hosts`, ~/.ssh/config,
`--identity`, and the TUI's settings.json and user theme files. Whatever stands there
(bytes, TOML of any types, a folder, a FIFO, a device, a file past the cap, a symlink to any
of these) is read or refused in one line naming the file or key; never a traceback, never a
hang, never an unbounded read.

Each slot is a class: generated in-process against the real readers (fast, every example
under an alarm so a blocking read fails instead of hanging), and a handful through the real
CLI processes. CI runs the `ci` profile (tests/conftest.py: 40 examples, fixed seed).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from file_states import FILE_STATES, absent, make, regular_text
from hypothesis import HealthCheck, assume, example, given, settings
from hypothesis import strategies as st

from dflash_tui import themes
from dflash_tui.control import ControlError, read_config
from dflash_tui.diagnosis.config import config_for
from dflash_tui.link.hostkeys import host_key_policy, known_hosts
from dflash_tui.link.transport import identity_path
from dflash_tui.targets import Target, TargetError, load_groups, resolve_target
from trainer.config import ConfigError, load_config
from trainer.contract.textfile import TextFileError

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = [HealthCheck.function_scoped_fixture, HealthCheck.too_slow]


@contextlib.contextmanager
def within(seconds: int) -> Iterator[None]:
    """Fail, rather than hang, when a read blocks (a FIFO opened for reading waits for a
    writer) or never ends (/dev/zero)."""

    def timeout(*_: object) -> None:
        raise AssertionError(f"still reading after {seconds}s")

    old = signal.signal(signal.SIGALRM, timeout)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def fresh(tmp_path: Path, name: str) -> Path:
    """An empty folder per example (examples share the test's tmp_path); made in one call,
    not by counting the ones before (10,000 examples in the bench)."""
    return Path(tempfile.mkdtemp(prefix="ex", dir=tmp_path)) / name


def one_line(message: str) -> str:
    assert message and "\n" not in message, message
    return message


@settings(suppress_health_check=FIXTURES, deadline=None)
@given(state=FILE_STATES)
def test_launch_config_slot_reads_or_refuses_in_one_line(tmp_path: Path, state: tuple) -> None:
    path = fresh(tmp_path, "launch.toml")
    make(state, path)
    try:
        with within(10):
            text, _ = read_config(path)
    except ControlError as e:
        assert one_line(str(e)).startswith(f"--config {path}: "), e
    else:
        assert regular_text(state), state
        assert len(text.encode()) <= 1 << 20


@settings(suppress_health_check=FIXTURES, deadline=None)
@given(state=FILE_STATES)
def test_trainer_config_slot_reads_or_refuses_in_one_line(tmp_path: Path, state: tuple) -> None:
    path = fresh(tmp_path, "train.toml")
    make(state, path)
    try:
        with within(10):
            load_config(path)
    except ConfigError as e:
        assert one_line(str(e)).startswith("config: "), e
        if not regular_text(state):
            assert path.name in str(e), e
    else:
        assert regular_text(state), state


@settings(suppress_health_check=FIXTURES, deadline=None)
@given(state=FILE_STATES)
def test_monitor_config_slot_reads_or_refuses_in_one_line(tmp_path: Path, state: tuple) -> None:
    """config.toml as every command reads it: a named target (its type-checked keys, the
    diagnosis baseline it sets) and the groups."""
    path = fresh(tmp_path, "config.toml")
    make(state, path)
    for name in ("a", "local", "gpu-box"):
        try:
            with within(10):
                target = resolve_target(name, config_path=path)
                config_for(target.extra)
                load_groups(path)
        except TargetError as e:
            line = one_line(str(e))
            if not regular_text(state) and state != ("missing",):
                assert line.startswith(f"{path}: "), line
        else:
            assert regular_text(state) or state == ("missing",), state


# -- through the real processes: a handful per slot ---------------------------------------------
def run(argv: list[str], env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, *argv],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
        env={**os.environ, **(env or {})},
    )


def the_one_line(r: subprocess.CompletedProcess[str], names: Path) -> str:
    assert r.returncode == 2, (r.returncode, r.stderr[-2000:])
    assert "Traceback" not in r.stderr + r.stdout, r.stderr
    lines = r.stderr.splitlines()
    assert len(lines) == 1, r.stderr
    assert str(names) in lines[0], lines[0]
    return lines[0]


REAL = settings(max_examples=8, suppress_health_check=FIXTURES, deadline=None)


@REAL
@given(state=FILE_STATES)
def test_refused_configs_are_one_line_exit_2_through_the_clis(tmp_path: Path, state: tuple) -> None:
    assume(not regular_text(state) and state != ("missing",))  # accepted ones would act
    path = fresh(tmp_path, "c.toml")
    make(state, path)
    home = path.parent / "home"
    home.mkdir()
    the_one_line(run(["-m", "trainer", "--config", str(path)]), path)
    the_one_line(
        run(["-m", "dflash_tui", "launch", "--config", str(path)], {"HOME": str(home)}), path
    )
    xdg = path.parent / "xdg"
    (xdg / "dflash-tui").mkdir(parents=True)
    make(state, xdg / "dflash-tui" / "config.toml")
    for argv in (["status"], ["runs", "a"]):
        r = run(["-m", "dflash_tui", *argv], {"HOME": str(home), "XDG_CONFIG_HOME": str(xdg)})
        the_one_line(r, xdg / "dflash-tui" / "config.toml")


@pytest.mark.parametrize(
    ("toml", "needle"),
    [
        ('[targets.a]\nbaseline_tok_s = "fast"\n', "targets.a.baseline_tok_s = 'fast': must be"),
        ("[targets]\na = 3\n", "targets.a: must be a table"),
        ('[targets.a]\ntarget = "user@[host"\n', "targets.a: target 'user@[host'"),
        ('[targets.a]\ntarget = "ssh://[h"\n', "targets.a: target 'ssh://[h'"),
        ("[targets.a]\npct = true\n", "targets.a.pct = True: must be a container id"),
        ("[targets.a]\ntheme = 3\n", "targets.a.theme = 3: must be a string"),
    ],
)
def test_a_wrong_type_in_config_toml_is_named_by_its_key(tmp_path: Path, toml: str, needle: str):
    cfg = tmp_path / "xdg" / "dflash-tui" / "config.toml"
    cfg.parent.mkdir(parents=True)
    cfg.write_text(toml)
    env = {"HOME": str(tmp_path), "XDG_CONFIG_HOME": str(tmp_path / "xdg")}
    line = the_one_line(run(["-m", "dflash_tui", "status", "a"], env), cfg)
    assert needle in line, line


@pytest.mark.parametrize("text", ["user@[host", "ssh://user@[host", "ssh://[::1", "ssh://a]b"])
def test_a_target_with_an_unbalanced_bracket_is_one_line(tmp_path: Path, text: str):
    r = run(["-m", "dflash_tui", "status", text], {"HOME": str(tmp_path)})
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert len(r.stderr.splitlines()) == 1 and f"target {text!r}" in r.stderr, r.stderr


@settings(suppress_health_check=FIXTURES, deadline=None)
@given(state=FILE_STATES | st.tuples(st.just("toml"), st.text(max_size=300)))
def test_known_hosts_slot_reads_or_refuses_in_one_line(tmp_path: Path, state: tuple) -> None:
    """`--known-hosts FILE` as the CLI reads it before connecting (options.target_from):
    the policy, then the files."""
    path = fresh(tmp_path, "known_hosts")
    make(state, path)
    target = Target(name="h", kind="ssh", host="127.0.0.1", port=2222, known_hosts=str(path))
    try:
        with within(10):
            known_hosts(host_key_policy(target, paths=[]))
    except (TargetError, TextFileError) as e:
        assert one_line(str(e)) and str(path) in str(e), e
    else:
        assert regular_text(state) or absent(state), state


@contextlib.contextmanager
def env(name: str, value: Path) -> Iterator[None]:
    """`name` set for one example (hypothesis runs many inside one test's monkeypatch)."""
    old = os.environ.get(name)
    os.environ[name] = str(value)
    try:
        yield
    finally:
        if old is None:
            del os.environ[name]
        else:
            os.environ[name] = old


SSH_LINES = st.sampled_from([
    "Host *", "Host 127.0.0.1", "Match all", "  Port 2222", "StrictHostKeyChecking accept-new",
    "StrictHostKeyChecking no", "StrictHostKeyChecking", "UserKnownHostsFile none",
    "UserKnownHostsFile /dev/null", "UserKnownHostsFile ~/kh ~/kh2", "GlobalKnownHostsFile none",
    "IdentityFile ~/.ssh/id", "Port notaport", "ProxyJump a,b", "Hostname %h.x", "\t", "=",
])  # fmt: skip
SSH_CONFIGS = st.lists(SSH_LINES | st.text(max_size=40), max_size=6).map("\n".join)


@settings(suppress_health_check=FIXTURES, deadline=None)
@example(state=("fifo",))  # blocked asyncssh's open: every ssh command hung
@example(state=("device", "/dev/zero"))  # read by lines without end
@given(state=FILE_STATES | st.tuples(st.just("toml"), SSH_CONFIGS))
def test_ssh_config_slot_reads_or_refuses_in_one_line(tmp_path: Path, state: tuple) -> None:
    """~/.ssh/config as every ssh command reads it before connecting (options.target_from):
    the file checked, then the host-key options asyncssh's parser finds for the host."""
    ssh = fresh(tmp_path, ".ssh")
    ssh.mkdir()
    path = ssh / "config"
    make(state, path)
    if host_keys_read(ssh, path, state):
        assert regular_text(state) or absent(state), state


def host_keys_read(ssh: Path, path: Path, state: tuple) -> bool:
    """The host-key policy read for 127.0.0.1:2222 with HOME above `ssh`, `state` at `path`:
    True when it was read; a refusal is one line, naming `path` unless it was text."""
    target = Target(name="h", kind="ssh", host="127.0.0.1", port=2222)
    with env("HOME", ssh.parent):
        try:
            with within(10):
                host_key_policy(target)
        except TargetError as e:
            line = one_line(str(e))
            assert str(path) in line or (regular_text(state) and "ssh config" in line), line
            return False
    return True


@settings(suppress_health_check=FIXTURES, deadline=None)
@example(state=("toml", "Include ~/.ssh/config"))  # asyncssh recursed without end
@given(state=FILE_STATES | st.tuples(st.just("toml"), SSH_CONFIGS))
def test_a_file_the_ssh_config_includes_reads_or_refuses_in_one_line(
    tmp_path: Path, state: tuple
) -> None:
    """A file ~/.ssh/config pulls in with `Include`: asyncssh reads each regular file it
    matches whole (a sparse 4 GB file read for minutes into 2 GB of memory) and skips the
    rest, so the check skips what asyncssh skips and refuses, naming the file, what it
    would read."""
    ssh = fresh(tmp_path, ".ssh")
    ssh.mkdir()
    (ssh / "config").write_text("Include inc/*\nHost 127.0.0.1\n  Port 2222\n")
    (ssh / "inc").mkdir()
    path = ssh / "inc" / "more"
    make(state, path)
    if host_keys_read(ssh, path, state):
        assert regular_text(state) or not path.is_file(), state


def test_an_included_sparse_4gb_file_is_one_line_exit_2(tmp_path: Path) -> None:
    """Through the CLI: the check reads at most its cap of an included file."""
    (tmp_path / ".ssh").mkdir()
    big = tmp_path / "big.conf"
    with open(big, "wb") as f:
        f.truncate(4 << 30)
    (tmp_path / ".ssh" / "config").write_text(f"Include {big}\n")
    r = run(["-m", "dflash_tui", "runs", "ssh://127.0.0.1:9"], {"HOME": str(tmp_path)})
    assert "larger than" in the_one_line(r, big)


@settings(suppress_health_check=FIXTURES, deadline=None)
@example(state=("fifo",))  # asyncssh read it whole: the connection hung
@given(state=FILE_STATES)
def test_identity_slot_reads_or_refuses_in_one_line(tmp_path: Path, state: tuple) -> None:
    """`--identity FILE` (or a target's `identity`), checked before asyncssh reads the key."""
    path = fresh(tmp_path, "id_key")
    make(state, path)
    target = Target(name="h", kind="ssh", host="127.0.0.1", identity=str(path))
    try:
        with within(10):
            assert identity_path(target) == str(path)
    except TargetError as e:
        assert str(path) in one_line(str(e)), e
    else:
        assert regular_text(state), state


THEME_LINES = st.sampled_from([
    "$primary: #5fafff;", "$primary: notacolour;", "$primary: ;", "$background: #000;",
    "$dark: false;", "$dark: maybe;", "$bogus: #fff;", "/* a comment", "*/", "$primary: rgb(1,2);",
])  # fmt: skip
THEME_TEXTS = st.lists(THEME_LINES | st.text(max_size=30), max_size=6).map("\n".join)


@settings(suppress_health_check=FIXTURES, deadline=None)
# Each a traceback or a hang before: a colour Textual cannot parse, a folder named
# mine.tcss, a FIFO at settings.json (the start blocked) or at the theme file.
@example(remembered=("missing",), theme=("toml", "$primary: notacolour;"))
@example(remembered=("missing",), theme=("folder",))
@example(remembered=("fifo",), theme=("fifo",))
@example(remembered=("folder",), theme=("missing",))
@given(
    remembered=FILE_STATES,
    theme=FILE_STATES | st.tuples(st.just("toml"), THEME_TEXTS),
)
def test_theme_slots_read_or_refuse_in_one_line(
    tmp_path: Path, remembered: tuple, theme: tuple
) -> None:
    """The TUI's own files as it starts (the real app built, not run) and as `t` switches
    theme: settings.json, a preference, read as none when it is not a JSON object; a user
    theme file, read or refused in one line naming it (exit 2 at the CLI)."""
    from dflash_tui.app import DFlashApp

    xdg = fresh(tmp_path, "xdg")
    folder = xdg / "dflash-tui"
    (folder / "themes").mkdir(parents=True)
    make(remembered, folder / "settings.json")
    mine = folder / "themes" / "mine.tcss"
    make(theme, mine)
    with env("XDG_CONFIG_HOME", xdg), within(10):
        saved = themes.remembered_theme()
        assert saved is None or isinstance(saved, str)
        try:
            app = DFlashApp(Target(name="local", kind="local"), connect=False)
        except themes.ThemeError as e:
            assert str(mine) in one_line(str(e)), e
            assert theme != ("missing",), e
        else:
            if "mine" in app.theme_specs:
                assert regular_text(theme), theme
        not_kept = themes.remember_theme("dark")
        if not_kept is None:
            assert themes.remembered_theme() == "dark"
        else:
            assert str(folder / "settings.json") in one_line(not_kept)


@pytest.mark.parametrize("insecure", [False, True])
@pytest.mark.parametrize("kind", ["fifo", "folder", "/dev/zero"])
def test_an_ssh_config_that_is_no_file_is_one_line_exit_2(tmp_path: Path, kind: str, insecure):
    """Through the CLI, checked or not: a FIFO at ~/.ssh/config blocked every ssh command
    (asyncssh opened it), /dev/zero never ended."""
    state = ("device", kind) if kind.startswith("/dev/") else (kind,)
    (tmp_path / ".ssh").mkdir()
    make(state, tmp_path / ".ssh" / "config")
    flags = ["--insecure-no-host-key-check"] if insecure else []
    r = run(["-m", "dflash_tui", "runs", "ssh://127.0.0.1:9", *flags], {"HOME": str(tmp_path)})
    line = the_one_line(r, tmp_path / ".ssh" / "config")
    assert "not a regular file" in line, line


def test_an_identity_that_is_a_fifo_is_one_line_exit_2(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "key")
    r = run(["-m", "dflash_tui", "runs", "ssh://127.0.0.1:9", "--identity", str(tmp_path / "key")],
            {"HOME": str(tmp_path)})  # fmt: skip
    assert "a FIFO, not a regular file" in the_one_line(r, tmp_path / "key")

"""A plain `restart` reuses the run's own overrides (issue 32): a run that died before its
first step of one is not relaunched as it was. Over a real sshd on 127.0.0.1 through the
`pct` stand-in, the command line as an operator runs it, a real CPU trainer on the host.

The bad key passes the config's own rules and fails only once the trainer has read the
target (`drafter.target_layer_ids = [99]`: the tiny target has 8 layers), so nothing but
the run's recorded error can tell: the refusal names the override and the `--drop KEY`
that relaunches without it, exit 2, nothing stopped or launched; that `--drop` then trains.
The restart dialog (the real app under Pilot, a local agent) refuses to relaunch it kept as
it was in the same way.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import pytest
from monitor_helpers import NO_WANDB, TINY, cli, wait_for
from test_control_local import deploy
from test_restart_edits import SHORT, restarted_as, run_ids, trains_three_steps
from test_resume import launch, record, until
from textual.widgets import Input

from dflash_tui.app import DFlashApp
from dflash_tui.widgets.restart_dialog import RestartDialog

BAD_KEY = "drafter.target_layer_ids"
BAD = f"{BAD_KEY}=[99]"


@pytest.fixture
def over_ssh(sshd_factory, pct_bin, tmp_path) -> tuple[list[str], dict[str, str], Path]:
    """(the target's arguments, the environment naming it in ~/.ssh/config, its runs dir)."""
    server = sshd_factory(env={"PATH": f"{pct_bin}:/usr/local/bin:/usr/bin:/bin"})
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    (home / ".ssh" / "config").write_text(server.ssh_config.read_text())
    remote = tmp_path / "remote"
    where = ["gpu-box", "--remote-dir", str(remote), "--pct", "200", "--python", sys.executable]
    return where, {"HOME": str(home)}, remote / "runs"


# Not serial: two short trainer runs through the command line, no time bound (generous
# timeouts, as in test_continue.py's and test_monitor_cli.py's, which run with the rest).
def test_a_plain_restart_of_a_run_that_died_of_its_override_is_refused(over_ssh):
    where, env, runs_dir = over_ssh
    assert cli("deploy", *where, env=env).returncode == 0
    sets = [f"--set={o}" for o in (NO_WANDB, *SHORT, BAD)]
    launched = cli("launch", *where, "--config", str(TINY), *sets, env=env, timeout=300)
    assert launched.returncode == 0, launched.stderr  # it starts, then reads the target
    (died,) = run_ids(runs_dir)
    until(f"{died}'s exit", (runs_dir / died / "exit.json").exists, timeout=180)
    assert record(runs_dir / died, "exit.json")["exit_code"] == 2
    assert record(runs_dir / died)["overrides"][-1] == BAD

    said = (
        f"dflash-tui: restart: {died} died before its first step of --set {BAD} (config: "
        f"{BAD_KEY} = [99]: the target has layers 0..7); as it was it dies again: restart "
        f"--drop {BAD_KEY} (or --set {BAD_KEY}=VALUE)"
    )
    for args in ([], ["--fresh"], ["--run", died]):  # the latest run, as it is by default
        got = cli("restart", *where, *args, env=env)
        assert got.returncode == 2, (args, got.stdout, got.stderr)
        # (asyncssh's CryptographyDeprecationWarning may come first: this venv's, not ours)
        assert [ln for ln in got.stderr.splitlines() if ln.startswith("dflash-tui")] == [said]
        assert got.stdout == "" and "Traceback" not in got.stderr
        assert run_ids(runs_dir) == [died], args  # nothing launched

    dropped = cli("restart", *where, "--run", died, "--drop", BAD_KEY, env=env, timeout=300)
    assert dropped.returncode == 0, dropped.stderr
    new = restarted_as(dropped.stdout)
    assert record(runs_dir / new)["overrides"] == [NO_WANDB, *SHORT]
    trains_three_steps(runs_dir, new)


@pytest.mark.serial  # two trainer runs
def test_the_dialog_will_not_relaunch_the_override_a_run_died_of(
    remote_factory, local_target, tmp_path
):
    """`r` on that run: its overrides, the one the error names marked; `fresh` with it kept
    as it was is refused in the dialog (the config's rules pass it: only the run's error
    tells), nothing launched; dropped, the run is relaunched without it."""
    runs_dir = Path(local_target.remote_dir) / "runs"
    r = remote_factory(local_target)
    deploy(r)
    launch(r, *SHORT, BAD)  # it starts (a heartbeat), then reads the target and dies
    (died,) = run_ids(runs_dir)
    until(f"{died}'s exit", (runs_dir / died / "exit.json").exists, timeout=180)
    kept = record(runs_dir / died)["overrides"][:-1]

    async def go() -> str:
        app = DFlashApp(local_target, theme_name="dark")
        async with app.run_test(size=(120, 40)) as pilot:
            await wait_for(pilot, lambda: app.store.run_id == died and app.store.outcome(), "run")
            await pilot.press("r")
            dialog = await wait_for(
                pilot, lambda: isinstance(app.screen, RestartDialog) and app.screen, "the dialog"
            )
            bad = dialog.query_one(f"#override-{len(kept)}", Input)
            assert bad.value == BAD and bad.has_class("offending")
            word = dialog.query_one("#fresh-word", Input)
            word.focus()
            await pilot.press(*"fresh", "enter")
            await pilot.pause(0.2)
            assert str(dialog.query_one("#edit-error").render()).split("\n") == [
                f"config: {BAD}: the run died of it before its first step: drop it or edit it"
            ]
            assert app.screen is dialog and run_ids(runs_dir) == [died]

            bad.focus()
            await pilot.press("tab", "space")  # its drop box
            await wait_for(pilot, lambda: bad.disabled, "the line dropped")
            word.focus()
            await pilot.press(*"fresh", "enter")
            await wait_for(pilot, lambda: app.controls.busy is None, "the relaunch")
            said = [n.message for n in app._notifications if n.message.startswith("restarted")]
            assert said, [n.message for n in app._notifications]
            await pilot.press("q")
            return str(said[-1].split()[2].rstrip(","))

    new = asyncio.run(go())
    assert record(runs_dir / new)["overrides"] == kept

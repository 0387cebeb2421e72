"""`[groups.NAME]` in config.toml (dflash_tui/targets.py): each bad group is one line naming
its key, exit 2, through the real CLI, before anything connects; the node place the agent
takes (trainer/contract/nodes.py) refuses what it cannot launch."""

from __future__ import annotations

import dataclasses
import re
import subprocess
import sys
from pathlib import Path

import pytest

from dflash_tui.targets import Group, TargetError, load_groups
from trainer.contract.nodes import NodePlace, new_run_id

ROOT = Path(__file__).resolve().parents[2]
TARGETS = """
[targets.gpu-a]
target = "ssh://root@10.0.0.5"
[targets.gpu-b]
target = "ssh://root@10.0.0.6"
"""


def write(tmp_path: Path, groups: str, top: str = "") -> Path:
    home = tmp_path / "config"
    (home / "dflash-tui").mkdir(parents=True, exist_ok=True)
    (home / "dflash-tui" / "config.toml").write_text(top + TARGETS + groups)
    return home


def group_cli(home: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "dflash_tui", *args],
        capture_output=True, text=True, timeout=60, cwd=ROOT,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin", "HOME": str(home.parent),
             "XDG_CONFIG_HOME": str(home)},
    )  # fmt: skip


def test_a_good_group_is_read_node_0_first(tmp_path):
    home = write(tmp_path, '[groups.pair]\nhosts = ["gpu-b", "gpu-a"]\nmaster = "10.0.0.6:29500"\n')
    groups = load_groups(home / "dflash-tui" / "config.toml")
    assert groups == {"pair": Group("pair", ("gpu-b", "gpu-a"), "10.0.0.6:29500")}


BAD = [
    ('hosts = ["gpu-a", "gpu-x"]\nmaster = "h:1"', "groups.pair.hosts: 'gpu-x' is no [targets"),
    ('hosts = ["gpu-a"]\nmaster = "h:1"', "groups.pair.hosts: 1 host(s): a group has 2 or more"),
    ('hosts = ["gpu-a", "gpu-a"]\nmaster = "h:1"', "groups.pair.hosts: 'gpu-a' is named twice"),
    ('hosts = "gpu-a"\nmaster = "h:1"', "groups.pair.hosts: a list of target names"),
    ('hosts = ["gpu-a", "gpu-b"]', 'groups.pair.master: "host:port" of node 0 (gpu-a)'),
    ('hosts = ["gpu-a", "gpu-b"]\nmaster = "10.0.0.5"', "groups.pair.master: '10.0.0.5': expected"),
    ('hosts = ["gpu-a", "gpu-b"]\nmaster = "h:99999"', "groups.pair.master: 'h:99999': the port"),
    ('hosts = ["gpu-a", "gpu-b"]\nmaster = "h:1"\nport = 3', "groups.pair: unknown keys ['port']"),
]


@pytest.mark.parametrize(("body", "needle"), BAD)
def test_a_bad_group_is_one_line_naming_its_key_and_exit_2(tmp_path, body, needle):
    home = write(tmp_path, f"[groups.pair]\n{body}\n")
    r = group_cli(home, "status", "pair")
    assert r.returncode == 2, r.stdout + r.stderr
    assert r.stdout == "" and len(r.stderr.splitlines()) == 1, r.stderr
    assert needle in r.stderr and "Traceback" not in r.stderr, r.stderr


def test_a_group_named_like_a_target_is_refused(tmp_path):
    home = write(tmp_path, '[groups.gpu-a]\nhosts = ["gpu-a", "gpu-b"]\nmaster = "h:1"\n')
    r = group_cli(home, "launch", "gpu-a", "--config", str(ROOT / "trainer/configs/tiny-cpu.toml"))
    assert r.returncode == 2 and len(r.stderr.splitlines()) == 1, r.stderr
    assert "groups.gpu-a: 'gpu-a' names a target too: rename one" in r.stderr


def test_per_host_options_and_deploying_to_a_group_are_refused(tmp_path):
    home = write(tmp_path, '[groups.pair]\nhosts = ["gpu-a", "gpu-b"]\nmaster = "h:1"\n')
    r = group_cli(home, "kill", "pair", "--remote-dir", "/tmp/x")
    assert r.returncode == 2 and len(r.stderr.splitlines()) == 1, r.stderr
    assert "--remote-dir with group pair: each host's comes from its [targets.*]" in r.stderr
    r = group_cli(home, "deploy", "pair")
    assert r.returncode == 2 and "pair is a group of hosts" in r.stderr, r.stderr


def test_a_missing_config_file_is_one_line_before_anything_connects(tmp_path):
    home = write(tmp_path, '[groups.pair]\nhosts = ["gpu-a", "gpu-b"]\nmaster = "h:1"\n')
    r = group_cli(home, "launch", "pair", "--config", str(tmp_path / "nope.toml"))
    assert r.returncode == 2 and len(r.stderr.splitlines()) == 1, r.stderr
    assert "nope.toml: not found" in r.stderr


def test_the_help_of_each_job_command_names_groups():
    for name in ("launch", "kill", "restart", "status", "dump-stacks"):
        r = subprocess.run(
            [sys.executable, "-m", "dflash_tui", name, "--help"],
            capture_output=True, text=True, cwd=ROOT, timeout=60,
        )  # fmt: skip
        assert "[groups.NAME]" in r.stdout, (name, r.stdout)
    r = subprocess.run(
        [sys.executable, "-m", "dflash_tui", "runs", "--help"],
        capture_output=True, text=True, cwd=ROOT, timeout=60,
    )  # fmt: skip
    assert "groups" not in r.stdout


def test_the_node_place_refuses_what_it_cannot_launch():
    ok = NodePlace(run_id="20260101-000000-tiny-cpu-ab12", nodes=2, node_rank=1, master="h:29500")
    assert ok.invalid() is None
    assert ok.environment() == {
        "DFLASH_NODES": "2",
        "DFLASH_NODE_RANK": "1",
        "DFLASH_MASTER": "h:29500",
    }
    bad = {
        "run_id": "../etc",
        "nodes": 1,
        "node_rank": 2,
        "master": "nohostport",
    }
    for key, value in bad.items():
        place = dataclasses.replace(ok, **{key: value})
        why = place.invalid()
        assert why is not None and why.startswith(f"node {key}"), (key, why)


def test_the_run_id_rule_is_the_agents(tmp_path):
    from dflash_tui.agent.runs import RunRoot

    shape = re.compile(r"^\d{8}-\d{6}-tiny-cpu-\.\.-x-[0-9a-f]{4}$")
    run_id, _ = RunRoot(str(tmp_path)).new_run_dir("tiny cpu/../x")
    assert shape.match(run_id) and shape.match(new_run_id("tiny cpu/../x")), run_id


def test_load_groups_says_a_groups_table_that_is_no_table(tmp_path):
    home = write(tmp_path, "", top='groups = "pair"\n')
    with pytest.raises(TargetError, match=r"\[groups\] must be a table"):
        load_groups(home / "dflash-tui" / "config.toml")


def test_watching_a_group_is_its_hosts_fleet_node_0_first(tmp_path):
    """`dflash-tui GROUP`: a row per host in node order (each its own agent and run root),
    as `fleet` shows them; Enter on one in the TUI opens that host's dashboard."""
    home = tmp_path / "config"
    (home / "dflash-tui").mkdir(parents=True)
    (home / "dflash-tui" / "config.toml").write_text(
        f'[targets.host-a]\ntarget = "local"\nremote_dir = "{tmp_path / "a"}"\n'
        f'[targets.host-b]\ntarget = "local"\nremote_dir = "{tmp_path / "b"}"\n'
        f'[targets.other]\ntarget = "local"\nremote_dir = "{tmp_path / "c"}"\n'
        '[groups.pair]\nhosts = ["host-b", "host-a"]\nmaster = "127.0.0.1:29500"\n'
    )
    r = group_cli(home, "pair", "--headless", "--once")
    rows = [line.split()[0] for line in r.stdout.splitlines()]
    assert rows == ["host-b", "host-a"], r.stdout + r.stderr
    assert all("connected" in line for line in r.stdout.splitlines()), r.stdout

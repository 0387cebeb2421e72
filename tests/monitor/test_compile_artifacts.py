"""Compile-cache artifacts, host -> monitor -> a fresh host, through dflash-tui and the real
agent: pull-cache copies what a GPU run saved, deploy ships it, a launched run is told where.
The blob's content is opaque here (torch makes it on a GPU: tests/trainer/test_gpu.py loads a
real one); what is tested is that it arrives whole, hash-checked, and nowhere else."""

from __future__ import annotations

import base64
import hashlib
import os
import secrets
import time
from pathlib import Path

import pytest
from monitor_helpers import NO_WANDB, TINY
from test_monitor_cli import cli

from dflash_tui.link.link import LinkError
from trainer.contract.protocol import ARTIFACT_CHUNK, PullArtifacts, PushArtifacts

NAME = "torch-2.11.0-cu130-NVIDIA-H200.bin"


def test_pull_then_deploy_carries_the_artifacts_to_a_fresh_host(tmp_path):
    host_cache, fresh_cache = tmp_path / "host-cache", tmp_path / "fresh-cache"
    saved = host_cache / "compile" / "artifacts"
    saved.mkdir(parents=True)
    blob = secrets.token_bytes(20 * ARTIFACT_CHUNK + 12345)  # 21 chunks each way
    (saved / NAME).write_bytes(blob)
    env = {"DFLASH_CACHE_DIR": str(host_cache)}
    where = ["local", "--remote-dir", str(tmp_path / "host")]
    assert cli("deploy", *where, env=env).returncode == 0
    r = cli("pull-cache", *where, env=env)
    assert r.returncode == 0, r.stderr
    assert f"pulled {NAME} ({len(blob) / 1e6:.1f} MB)" in r.stdout
    pulled = host_cache / "pulled-artifacts" / NAME
    assert pulled.read_bytes() == blob

    # A fresh host: its own cache, nothing compiled there. The monitor's store ships along.
    fresh = tmp_path / "fresh"
    env2 = {"DFLASH_CACHE_DIR": str(fresh_cache)}
    (fresh_cache / "pulled-artifacts").mkdir(parents=True)
    (fresh_cache / "pulled-artifacts" / NAME).write_bytes(pulled.read_bytes())
    where2 = ["local", "--remote-dir", str(fresh)]
    r = cli("deploy", *where2, env=env2)
    assert r.returncode == 0, r.stderr
    assert f"shipped compile-cache artifacts {NAME} ({len(blob) / 1e6:.1f} MB)" in r.stdout
    shipped = fresh / "compile-artifacts"
    assert (shipped / NAME).read_bytes() == blob
    assert sorted(p.name for p in shipped.iterdir()) == [NAME]  # no part file left

    # The run launched there is told where they are.
    r = cli("launch", *where2, "--config", str(TINY), "--set", NO_WANDB,
            "--set", "train.max_steps=100000", env=env2)  # fmt: skip
    assert r.returncode == 0, r.stderr
    try:
        launch_json = next((fresh / "runs").glob("*/launch.json"))
        deadline = time.monotonic() + 30
        pid = None
        while pid is None and time.monotonic() < deadline:
            import json

            pid = json.loads(launch_json.read_text()).get("pid")
            time.sleep(0.1)
        assert pid is not None
        environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        assert f"DFLASH_COMPILE_ARTIFACTS={shipped}".encode() in environ
    finally:
        cli("kill", *where2, "--timeout", "30", env=env2)

    # --no-compile-cache ships none.
    r = cli("deploy", "local", "--remote-dir", str(tmp_path / "bare"), "--no-compile-cache",
            env=env2)  # fmt: skip
    assert r.returncode == 0 and "shipped" not in r.stdout
    assert not (tmp_path / "bare" / "compile-artifacts").exists()


def _push(r, name, data, sha=None, offset=0, size=None):
    return r.request(
        PushArtifacts(
            name=name,
            offset=offset,
            size=len(data) if size is None else size,
            sha256=sha or hashlib.sha256(data).hexdigest(),
            chunk_b64=base64.b64encode(data).decode(),
        ),
        timeout=30,
    )


def test_the_agent_takes_only_whole_hash_checked_plainly_named_artifacts(
    remote_factory, local_target, tmp_path, monkeypatch
):
    r = remote_factory(local_target)
    r.wait(lambda s: s.hello is not None, 30, "hello")
    shipped = Path(local_target.remote_dir) / "compile-artifacts"
    data = b"x" * 1000
    # arrived wrong: refused, and neither it nor its part file stays
    with pytest.raises(LinkError, match="hashing to"):
        _push(r, NAME, data, sha="0" * 64)
    assert not list(shipped.iterdir())
    # a name that is a path, or not a .bin
    for bad in ("../evil.bin", "sub/x.bin", ".hidden.bin", "x.txt"):
        with pytest.raises(LinkError, match="bad artifact name"):
            _push(r, bad, data)
    # a chunk past the declared size, a bad hash string
    with pytest.raises(LinkError, match="outside"):
        _push(r, NAME, data, offset=10, size=len(data))
    with pytest.raises(LinkError, match="sha256"):
        _push(r, NAME, data, sha="nothex")
    assert not list(shipped.iterdir())
    # right: it lands
    assert _push(r, NAME, data)["done"] is True
    assert (shipped / NAME).read_bytes() == data
    # a compile-artifacts folder that is a symlink is refused, nothing written through it
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    for p in shipped.iterdir():
        p.unlink()
    shipped.rmdir()
    shipped.symlink_to(elsewhere)
    with pytest.raises(LinkError, match="symlink"):
        _push(r, NAME, data)
    assert not list(elsewhere.iterdir())


def test_pull_lists_only_plain_files_and_reads_in_chunks(remote_factory, local_target, tmp_path):
    cache = Path(os.environ["DFLASH_CACHE_DIR"]) / "compile" / "artifacts"
    cache.mkdir(parents=True, exist_ok=True)
    for p in cache.iterdir():
        p.unlink()
    blob = secrets.token_bytes(ARTIFACT_CHUNK + 7)
    (cache / NAME).write_bytes(blob)
    secret = tmp_path / "secret.bin"
    secret.write_bytes(b"not for the monitor")
    (cache / "link.bin").symlink_to(secret)
    (cache / "notes.txt").write_text("not an artifact")
    r = remote_factory(local_target)
    r.wait(lambda s: s.hello is not None, 30, "hello")
    listed = r.request(PullArtifacts(), timeout=30)["artifacts"]
    assert listed == [{"name": NAME, "size": len(blob), "sha256": hashlib.sha256(blob).hexdigest()}]
    first = r.request(PullArtifacts(name=NAME), timeout=30)
    second = r.request(PullArtifacts(name=NAME, offset=ARTIFACT_CHUNK), timeout=30)
    got = base64.b64decode(first["chunk_b64"]) + base64.b64decode(second["chunk_b64"])
    assert got == blob
    with pytest.raises(LinkError, match="symlink"):
        r.request(PullArtifacts(name="link.bin"), timeout=30)

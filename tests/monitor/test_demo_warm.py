"""A warm `dflash-tui demo` skips the deploy only when this very code is current in its
remote dir (issue 32): deployed by the real local agent, then changed under it."""

from __future__ import annotations

import json
from pathlib import Path

from test_control_local import deploy

from dflash_tui.commands.demo import deployed_here
from dflash_tui.control import TRAINER_DIR
from trainer.contract.codehash import code_hash


def test_the_deploy_is_skipped_only_for_the_same_code_intact(remote_factory, local_target):
    remote = Path(local_target.remote_dir)
    assert deployed_here(remote) is None  # nothing there yet
    deploy(remote_factory(local_target))
    assert deployed_here(remote) == code_hash(TRAINER_DIR)

    shipped = remote / "current" / "trainer" / "__main__.py"
    good = shipped.read_bytes()
    shipped.write_bytes(good + b"# changed on the host\n")
    assert deployed_here(remote) is None  # the release no longer hashes to its name
    shipped.write_bytes(good)

    record = json.loads((remote / "deployed.json").read_text())
    (remote / "deployed.json").write_text(json.dumps({**record, "sha256": "0" * 64}))
    assert deployed_here(remote) is None  # other code deployed: deploy this one

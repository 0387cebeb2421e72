"""Deploy archives whose names clash (issue 33), sent to the real agent through a local link:
a file then a folder of one name, a folder then a file, a file under a file, one file twice.
Each is refused in one line before anything is unpacked (no traceback, no half release, the
current release untouched); an archive that can be unpacked reaches the hash check.

Whether an archive clashes is decided here without the agent's code: by unpacking it with
plain file operations into a scratch folder, where a clash is an OSError or a file made
twice. CI runs the `ci` profile (tests/conftest.py: 40 archives, fixed seed).
"""

from __future__ import annotations

import base64
import io
import os
import tarfile
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dflash_tui.link.link import BadInput, LinkError
from trainer.contract.protocol import Deploy

NAMES = ["trainer", "trainer/a.py", "trainer/a.py/b.py", "trainer/x", "trainer/x/y.py", "z"]
MEMBERS = st.lists(
    st.tuples(st.sampled_from(NAMES), st.sampled_from(["file", "folder"])), max_size=6
)


def archive(members: list[tuple[str, str]]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for name, kind in members:
            info = tarfile.TarInfo(name)
            if kind == "folder":
                info.type, info.mode = tarfile.DIRTYPE, 0o755
                tar.addfile(info)
            else:
                info.size, info.mode = 3, 0o644
                tar.addfile(info, io.BytesIO(b"x=1"))
    return buf.getvalue()


def clashes(members: list[tuple[str, str]]) -> bool:
    """Unpack by hand: a clash is a name that cannot be made, or a file made twice."""
    with tempfile.TemporaryDirectory() as root:
        for name, kind in members:
            path = os.path.join(root, name)
            try:
                if kind == "folder":
                    os.makedirs(path, exist_ok=True)
                else:
                    os.makedirs(os.path.dirname(path), exist_ok=True)
                    with open(path, "xb"):
                        pass
            except OSError:
                return True
    return False


@pytest.fixture
def agent(remote_factory, local_target):
    r = remote_factory(local_target)
    r.wait(lambda s: s.hello is not None, 30, "hello")
    return r, Path(local_target.remote_dir)


@settings(suppress_health_check=[HealthCheck.function_scoped_fixture], deadline=None)
@given(members=MEMBERS)
def test_an_archive_whose_names_clash_is_refused_in_one_line(agent, members) -> None:
    r, remote = agent
    with pytest.raises(LinkError) as refused:
        r.request(Deploy(tar_b64=base64.b64encode(archive(members)).decode(), sha256="0" * 64))
    line = str(refused.value)
    assert "\n" not in line and line.startswith("deploy"), line  # not "FileExistsError: ..."
    if clashes(members):
        assert isinstance(refused.value, BadInput), line
        assert "names clash in the archive" in line, line
    else:  # unpacked, then refused for its hash (or its missing trainer/)
        assert "names clash" not in line, line
    releases = remote / "releases"
    assert not releases.exists() or not any(releases.iterdir())  # nothing half unpacked
    assert not (remote / "current").exists()


@pytest.mark.parametrize(
    ("members", "named"),
    [
        ([("trainer/a", "file"), ("trainer/a", "folder")], "'trainer/a' is a file and a folder"),
        ([("trainer/a", "folder"), ("trainer/a", "file")], "'trainer/a' is a file and a folder"),
        ([("trainer/a", "file"), ("trainer/a/b", "file")], "'trainer/a' is a file and a folder"),
        ([("trainer/a", "file"), ("trainer/./a", "file")], "'trainer/a' is a file twice"),
        ([(".", "file")], "'.' is a file where the release folder is"),
    ],
)
def test_the_refusal_names_the_clash(agent, members, named) -> None:
    r, _ = agent
    with pytest.raises(BadInput, match="names clash") as refused:
        r.request(Deploy(tar_b64=base64.b64encode(archive(members)).decode(), sha256="0" * 64))
    assert named in str(refused.value)

"""deploy: a release unpacked, checked against the hash the monitor sent, then made current
(or, for `restart --deploy`, left beside the current one until its import check passed).

Nothing from the archive runs before it is trusted: the shipped files are hashed as bytes
with the agent's own (bundled) `code_hash`, never with code from the archive, and `current`
switches only when the hash matches.

REMOTE_DIR/releases/<sha256[:16]>/  trainer/, dflash_agent.py, _vendor/pynvml.py
REMOTE_DIR/current -> releases/<…> (one atomic rename), REMOTE_DIR/deployed.json
"""

from __future__ import annotations

import base64
import binascii
import io
import os
import re
import secrets
import shutil
import tarfile
import time

from dflash_tui.agent.errors import CommandError
from trainer.contract.codehash import code_hash
from trainer.contract.protocol import Deploy, Deployed
from trainer.contract.records import write_json_atomic
from trainer.contract.typed import encode

SHA256 = re.compile(r"^[0-9a-f]{64}$")


def name_clash(members: list[tarfile.TarInfo]) -> str | None:
    """Why the archive's names cannot all be made, None when they can: a file and a folder of
    one name (in either order, or a file where another member needs a folder), or one file
    twice (which of the two would be the code that was hashed?)."""
    kinds: dict[str, str] = {}  # normalised name -> "file" | "folder"
    for member in members:
        name = os.path.normpath(member.name)
        is_dir = member.isdir()
        if name in (".", "") and not is_dir:
            return f"{member.name!r} is a file where the release folder is"
        parts = name.split(os.sep)
        for i in range(1, len(parts)):
            parent = os.sep.join(parts[:i])
            if kinds.get(parent) == "file":
                return f"{parent!r} is a file and a folder (for {member.name!r})"
            kinds[parent] = "folder"
        seen = kinds.get(name)
        if seen == "file" and not is_dir:
            return f"{name!r} is a file twice"
        if seen is not None and seen != ("folder" if is_dir else "file"):
            return f"{name!r} is a file and a folder"
        kinds[name] = "folder" if is_dir else "file"
    return None


def safe_extract(tar: tarfile.TarFile, dest: str) -> None:
    """Extract regular files and folders only, never outside `dest`, and only when every
    name can be made (`name_clash`), so a release is never half unpacked."""
    root = os.path.realpath(dest)
    members = tar.getmembers()
    clash = name_clash(members)
    if clash is not None:
        raise CommandError(f"deploy: names clash in the archive: {clash}", bad_input=True)
    for member in members:
        target = os.path.realpath(os.path.join(dest, member.name))
        if not (target == root or target.startswith(root + os.sep)):
            raise CommandError(f"deploy: unsafe path in archive: {member.name!r}")
        if member.isdir():
            os.makedirs(target, exist_ok=True)
        elif member.isfile():
            os.makedirs(os.path.dirname(target), exist_ok=True)
            src = tar.extractfile(member)
            assert src is not None  # a regular file always has content
            with open(target, "wb") as f:
                shutil.copyfileobj(src, f)
            os.chmod(target, 0o644 | (member.mode & 0o111))
        else:
            raise CommandError(f"deploy: only files and folders allowed, got {member.name!r}")


def deploy(remote_dir: str, cmd: Deploy) -> Deployed:
    want = cmd.sha256
    if not SHA256.match(want):
        raise CommandError("deploy needs the sha256 of what it ships")
    try:
        blob = base64.b64decode(cmd.tar_b64, validate=True)
    except binascii.Error as e:
        raise CommandError(f"deploy: the archive is not base64 ({e})") from None
    releases = os.path.join(remote_dir, "releases")
    os.makedirs(releases, exist_ok=True)
    tmp = os.path.join(releases, f".incoming-{secrets.token_hex(4)}")
    os.mkdir(tmp)
    final = os.path.join(releases, want[:16])
    try:
        try:
            with tarfile.open(fileobj=io.BytesIO(blob), mode="r:*") as tar:
                safe_extract(tar, tmp)
        except tarfile.TarError as e:
            raise CommandError(f"deploy: not a readable tar archive ({e})") from None
        except OSError as e:  # a name too long for this filesystem, the disk full
            raise CommandError(f"deploy: cannot unpack the archive ({e})") from None
        shipped = os.path.join(tmp, "trainer")
        if not os.path.isdir(shipped):
            raise CommandError("deploy: no trainer/ in the archive")
        try:
            got = code_hash(shipped)
        except OSError as e:  # a folder where a .py file belongs, an unreadable file
            raise CommandError(
                f"deploy: cannot hash the shipped code ({e})", bad_input=True
            ) from None
        if got != want:
            raise CommandError(f"deploy: shipped code hashes to {got}, expected {want}")
        if os.path.isdir(final):
            shutil.rmtree(tmp)  # this very code is there already
        else:
            os.rename(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    record = Deployed(sha256=want, release=final, at=time.time(), bytes=len(blob))
    if cmd.make_current:
        make_current(remote_dir, record)
    return record


def make_current(remote_dir: str, record: Deployed) -> None:
    """Launches and restarts use this release from now on; a run already started keeps its
    own (launch.json's `release`: the folder, never the link)."""
    link_tmp = os.path.join(remote_dir, f".current-{secrets.token_hex(4)}")
    os.symlink(os.path.join("releases", record.sha256[:16]), link_tmp)
    os.replace(link_tmp, os.path.join(remote_dir, "current"))  # atomic switch
    write_json_atomic(os.path.join(remote_dir, "deployed.json"), encode(record))


def shipped_release(remote_dir: str, sha256: str) -> str:
    """The folder of a release deployed earlier whose trainer/ still hashes to `sha256`
    (`restart --deploy` names it by its hash), or CommandError."""
    if not SHA256.match(sha256):
        raise CommandError("a release is named by its code sha256", bad_input=True)
    final = os.path.join(remote_dir, "releases", sha256[:16])
    shipped = os.path.join(final, "trainer")
    if not os.path.isdir(shipped) or os.path.islink(final):
        raise CommandError(f"no release {sha256[:16]} under {remote_dir}: deploy it first")
    got = code_hash(shipped)
    if got != sha256:
        raise CommandError(f"release {sha256[:16]} hashes to {got[:16]} now: deploy it again")
    return final

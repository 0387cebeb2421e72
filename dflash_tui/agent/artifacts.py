"""Portable compile-cache artifacts in and out of a host, in chunks
(trainer/runtime/compile/artifacts.py says what they are).

pull: `<compile cache>/artifacts/NAME`, saved by a GPU run's warm-up, read in chunks.
push: `<remote dir>/compile-artifacts/NAME`, where launched runs look (DFLASH_COMPILE_ARTIFACTS),
      written to a part file and moved into place only once whole and hashing to the sha256
      the monitor sent: a run never loads half a blob, or one that came out wrong.

Names are one plain file name ending in .bin; nothing is followed through a symlink.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import os
import re
from typing import Any

from dflash_tui.agent.errors import CommandError
from dflash_tui.agent.files import SAFE_NAME, Refused, open_dir, open_in
from trainer.contract.protocol import ARTIFACT_CHUNK, PullArtifacts, PushArtifacts

SHIPPED_DIR = "compile-artifacts"  # under the remote dir
MAX_BYTES = 1 << 30  # trainer/runtime/compile/artifacts.py loads nothing larger
SHA256 = re.compile(r"^[0-9a-f]{64}$")
_WRITE = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC  # read back to hash it


def _check_name(name: str) -> None:
    if not SAFE_NAME.match(name) or not name.endswith(".bin"):
        raise CommandError(f"bad artifact name {name!r}: one plain file name ending in .bin")


def _sha256_of(fd: int) -> str:
    h = hashlib.sha256()
    os.lseek(fd, 0, os.SEEK_SET)
    while chunk := os.read(fd, 1 << 20):
        h.update(chunk)
    return h.hexdigest()


def pull(saved_dir: str, cmd: PullArtifacts) -> dict[str, Any]:
    if cmd.name is None:
        try:
            dir_fd = open_dir(saved_dir)
        except FileNotFoundError:
            return {"folder": saved_dir, "artifacts": []}
        try:
            names = sorted(
                n for n in os.listdir(dir_fd) if SAFE_NAME.match(n) and n.endswith(".bin")
            )
        finally:
            os.close(dir_fd)
        found = []
        for name in names:
            try:
                fd = open_in(saved_dir, name)
            except (OSError, Refused):
                continue  # a symlink or a FIFO there is not one of ours
            try:
                size = os.fstat(fd).st_size
                if size <= MAX_BYTES:
                    found.append({"name": name, "size": size, "sha256": _sha256_of(fd)})
            finally:
                os.close(fd)
        return {"folder": saved_dir, "artifacts": found}
    _check_name(cmd.name)
    try:
        fd = open_in(saved_dir, cmd.name)
    except FileNotFoundError:
        raise CommandError(f"{os.path.join(saved_dir, cmd.name)}: no such artifact") from None
    try:
        size = os.fstat(fd).st_size
        if not 0 <= cmd.offset <= size:
            raise CommandError(f"offset {cmd.offset} outside {cmd.name} ({size} bytes)")
        os.lseek(fd, cmd.offset, os.SEEK_SET)
        chunk = os.read(fd, ARTIFACT_CHUNK)
    finally:
        os.close(fd)
    return {
        "name": cmd.name,
        "offset": cmd.offset,
        "size": size,
        "chunk_b64": base64.b64encode(chunk).decode(),
    }


def push(remote_dir: str, cmd: PushArtifacts) -> dict[str, Any]:
    _check_name(cmd.name)
    if not SHA256.match(cmd.sha256):
        raise CommandError("push_artifacts needs the sha256 of the whole artifact")
    if not 0 < cmd.size <= MAX_BYTES:
        raise CommandError(f"artifact size {cmd.size}: expected 1 byte to {MAX_BYTES} bytes")
    try:
        chunk = base64.b64decode(cmd.chunk_b64, validate=True)
    except binascii.Error as e:
        raise CommandError(f"push_artifacts: the chunk is not base64 ({e})") from None
    if cmd.offset < 0 or cmd.offset + len(chunk) > cmd.size:
        raise CommandError(f"chunk at {cmd.offset} (+{len(chunk)}) outside {cmd.size} bytes")
    folder = os.path.join(remote_dir, SHIPPED_DIR)
    os.makedirs(folder, exist_ok=True)
    dir_fd = open_dir(folder)
    part = f".{cmd.name}.part"
    try:
        flags = _WRITE | (os.O_TRUNC if cmd.offset == 0 else 0)
        try:
            fd = os.open(part, flags, 0o644, dir_fd=dir_fd)
        except OSError as e:
            raise CommandError(f"{os.path.join(folder, part)}: {e.strerror}") from None
        try:
            os.pwrite(fd, chunk, cmd.offset)
            if cmd.offset + len(chunk) < cmd.size:
                return {"name": cmd.name, "done": False}
            got = _sha256_of(fd)
        finally:
            os.close(fd)
        if got != cmd.sha256:
            os.unlink(part, dir_fd=dir_fd)
            raise CommandError(
                f"{cmd.name}: arrived hashing to {got[:16]}…, expected {cmd.sha256[:16]}…"
            )
        os.replace(part, cmd.name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    finally:
        os.close(dir_fd)
    return {"name": cmd.name, "done": True, "path": os.path.join(folder, cmd.name)}

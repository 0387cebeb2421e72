"""Where a restart continues: a run's newest good checkpoint, by the contract's one rule
(trainer/contract/checkpoints.py: `choose_resume`), read without torch.

`checkpoints/` is opened without following a symlink and listed through its descriptor; each
sidecar is read relative to it (files.open_in: a regular file only, never a FIFO, bounded).
Sidecars are read newest first and only until the rule has its answer, so a run with a
thousand checkpoints costs one read, and a run that went NaN one per checkpoint it skips.
A choice is kept while the folder holds the same names (the runs list asks every few
seconds; checkpoints and sidecars are renamed into place, never rewritten).
"""

from __future__ import annotations

import errno
import os
import stat

from dflash_tui.agent.files import Refused, open_dir, open_in
from trainer.contract.checkpoints import (
    CHECKPOINTS,
    MAX_META_BYTES,
    CheckpointMeta,
    ResumeChoice,
    choose_resume,
    meta_name,
    parse_meta,
    step_of,
    why_not_good,
)
from trainer.contract.typed import Unreadable

Candidates = dict[int, CheckpointMeta | Unreadable | None]


def _sidecar(folder: str, step: int) -> CheckpointMeta | Unreadable | None:
    name = meta_name(step)
    try:
        fd = open_in(folder, name)
    except FileNotFoundError:
        return None
    except Refused as e:
        return Unreadable(name, str(e))
    except OSError as e:
        return Unreadable(name, e.strerror or str(e))
    with os.fdopen(fd, "rb") as f:
        try:
            raw = f.read(MAX_META_BYTES + 1)
        except OSError as e:
            return Unreadable(name, e.strerror or str(e))
    return parse_meta(raw, name)


def _decided(meta: CheckpointMeta | Unreadable | None, step: int) -> bool:
    """Whether choose_resume stops at this candidate: good, or with no sidecar to go by."""
    return not isinstance(meta, CheckpointMeta) or why_not_good(meta, step) is None


class Checkpoints:
    """Each run's resume choice, re-read only when its checkpoints folder changed."""

    def __init__(self) -> None:
        self._seen: dict[str, tuple[tuple[int, tuple[str, ...]], ResumeChoice]] = {}

    def choice(self, run_dir: str) -> ResumeChoice:
        folder = os.path.join(run_dir, CHECKPOINTS)
        try:
            fd = open_dir(folder)
        except Refused as e:  # a planted `checkpoints -> /`: no candidate, and said
            return ResumeChoice(None, None, False, ((CHECKPOINTS, str(e)),))
        except OSError as e:
            if e.errno == errno.ENOENT:
                return ResumeChoice(None, None, False)
            return ResumeChoice(None, None, False, ((CHECKPOINTS, e.strerror or str(e)),))
        try:
            names = tuple(sorted(os.listdir(fd)))
            key = (os.fstat(fd).st_ino, names)
            seen = self._seen.get(run_dir)
            if seen is not None and seen[0] == key:
                return seen[1]
            steps, refused = self._kinds(fd, names)
        finally:
            os.close(fd)
        candidates: Candidates = {}
        for step in sorted(steps, reverse=True):
            candidates[step] = meta = _sidecar(folder, step)
            if _decided(meta, step):
                break
        choice = choose_resume(candidates)
        if refused:
            choice = ResumeChoice(
                choice.name, choice.step, choice.verified, (*refused, *choice.skipped)
            )
        self._seen[run_dir] = (key, choice)
        return choice

    @staticmethod
    def _kinds(fd: int, names: tuple[str, ...]) -> tuple[list[int], tuple[tuple[str, str], ...]]:
        """Steps of the regular `step-N.pt` files; the others of that name (a symlink, a
        folder) refused with what they are."""
        steps: list[int] = []
        refused: list[tuple[str, str]] = []
        for name in names:
            step = step_of(name)
            if step is None:
                continue
            try:
                mode = os.stat(name, dir_fd=fd, follow_symlinks=False).st_mode
            except OSError:
                continue  # gone since the listing
            if stat.S_ISREG(mode):
                steps.append(step)
            else:
                kind = "a symlink" if stat.S_ISLNK(mode) else "not a regular file"
                refused.append((f"{CHECKPOINTS}/{name}", f"{kind}: refused"))
        return steps, tuple(sorted(refused))

"""Failure injection for tests, drills and the scenario recorder: DFLASH_FAULT.

A comma-separated list of faults, each travelling the real path (the real thread raises,
blocks or slows down; the real process dies):

  ROLE:N               raise in thread role ROLE (prefetch, target, drafter) at its item N;
                       ROLE-I:N only in its thread I (processes mode: target-1 is rank 1's)
  hang:ROLE:N          ROLE's thread blocks forever at its item N (a stuck loop: the
                       heartbeat stays fresh, the steps stop); hang:ROLE-I:N only its
                       thread I (hang:drafter-1:30: one replica, the others wait for it)
  nan:N                the drafter loss is NaN from optimizer step N on
  diverge:N:FACTOR     from optimizer step N the optimizer's learning rate is FACTOR times
                       the schedule's (the lr logged is the one applied): the loss climbs
  zero_lr              the optimizer's learning rate is 0 from the first step: nothing is
                       learned, the weights stay at their init
  grad_spike:N:EVERY:FACTOR  the drafter loss is scaled by FACTOR before its backward at
                       optimizer steps N, N+EVERY, …: the gradient norm at those steps is
                       FACTOR times larger (clipping, where on, still bounds the update)
  slow:STAGE:SECONDS   STAGE takes SECONDS longer: each item of a role (prefetch, target,
                       drafter), each send of a processes-mode target rank (link: a slow
                       link as its sender sees it, inside its transfer stage), or once:
                       load_target (the weight load), data (tokenising), compile (the
                       warm-up compile); slow:ROLE-I:SECONDS only its thread I
                       (slow:target-1:0.5: one straggling target)
  slow_from:N:ROLE:SECONDS  from optimizer step N on, each item of ROLE (prefetch, target,
                       drafter) takes SECONDS longer: a run that slows down mid-way
  sigkill:N            the process SIGKILLs itself after optimizer step N (no handler runs)
  stall_checkpoint:S   every checkpoint save takes S seconds longer
  steal_signals:N      after optimizer step N, SIGUSR1 is taken at the C level behind Python's
                       back (set to ignore), as Triton's in-process LLVM does on the GPU
  wedge_main:N         after optimizer step N the main thread blocks for good inside C code
                       (a self-deadlocked mutex): no Python signal handler can run any more
  buffer_log:BYTES     train.log is written as `python train.py > train.log` without -u
                       writes it: in blocks of BYTES, no flush per line (bursts of lines)

Any fault may end in `:rank=R`: then only torchrun's rank R (its RANK) has it, the other
ranks of a processes-mode job (and a threads-mode run, which has no RANK) run clean; e.g.
slow:drafter:0.2:rank=3 makes one drafter rank a straggler.

N counts the items that role has handled (from 0), or optimizer steps for nan, diverge,
grad_spike, slow_from and sigkill. slow_from's step is the last one the optimizer finished: a
drafter's item for step N + 1 is the first one slowed; targets and prefetch, ahead by their
queues, slow down then too.
"""

from __future__ import annotations

import math
import os
import signal
import threading
import time

ROLES = ("prefetch", "target", "drafter")
STAGES = (*ROLES, "link", "load_target", "data", "compile")
GRAMMAR = (
    "(ROLE[-I]:N | hang:ROLE[-I]:N | nan:N | diverge:N:FACTOR | zero_lr"
    " | grad_spike:N:EVERY:FACTOR | slow:STAGE[-I]:SECONDS | slow_from:N:ROLE:SECONDS | sigkill:N"
    " | stall_checkpoint:SECONDS | steal_signals:N | wedge_main:N | buffer_log:BYTES)[:rank=R]"
)
RANK_QUALIFIER = "rank="


def _thread_of_role(name: str) -> bool:
    """A role (every thread of it) or ROLE-I (its thread I)."""
    role, _, index = name.partition("-")
    return role in ROLES and (not index or index.isdigit())


class InjectedFault(RuntimeError):
    pass


def _number(spec: str, text: str, cast: type[int] | type[float]) -> float:
    try:
        value = cast(text)
    except ValueError:
        raise ValueError(f"DFLASH_FAULT={spec!r}: {text!r} is not a number ({GRAMMAR})") from None
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"DFLASH_FAULT={spec!r}: {text!r} must be a finite number >= 0")
    return value


class FaultPlan:
    def __init__(self, spec: str | None = None) -> None:
        spec = os.environ.get("DFLASH_FAULT", "") if spec is None else spec
        self.raise_at: dict[str, int] = {}
        self.hang_at: dict[str, int] = {}
        self.slow: dict[str, float] = {}
        self.slow_from: dict[str, tuple[int, float]] = {}  # role -> (from step, seconds)
        self._steps_done = 0  # the last optimizer step finished (after_step)
        self.nan_from: int | None = None
        self.diverge: tuple[int, float] | None = None  # (from step, lr factor)
        self.zero_lr = False
        self.spike: tuple[int, int, float] | None = None  # (first step, every, loss factor)
        self.sigkill_after: int | None = None
        self.checkpoint_stall_s = 0.0
        self.steal_after: int | None = None
        self.wedge_after: int | None = None
        self.log_buffer_bytes: int | None = None
        rank = os.environ.get("RANK")  # torchrun's, for a fault qualified with :rank=R
        for part in filter(None, (p.strip() for p in spec.split(","))):
            f = part.split(":")
            if len(f) > 1 and f[-1].startswith(RANK_QUALIFIER):
                wanted = int(_number(spec, f[-1][len(RANK_QUALIFIER) :], int))
                # Another rank's fault is still checked, into a plan nobody uses: a typo
                # fails every rank alike.
                plan = self if rank == str(wanted) else FaultPlan("")
                plan._add(spec, f[:-1])
            else:
                self._add(spec, f)

    def _add(self, spec: str, f: list[str]) -> None:
        if len(f) == 2 and _thread_of_role(f[0]):
            self.raise_at[f[0]] = int(_number(spec, f[1], int))
        elif len(f) == 3 and f[0] == "hang" and _thread_of_role(f[1]):
            self.hang_at[f[1]] = int(_number(spec, f[2], int))
        elif len(f) == 3 and f[0] == "slow" and (f[1] in STAGES or _thread_of_role(f[1])):
            self.slow[f[1]] = _number(spec, f[2], float)
        elif len(f) == 4 and f[0] == "slow_from" and f[2] in ROLES:
            self.slow_from[f[2]] = (int(_number(spec, f[1], int)), _number(spec, f[3], float))
        elif len(f) == 2 and f[0] == "nan":
            self.nan_from = int(_number(spec, f[1], int))
        elif len(f) == 3 and f[0] == "diverge":
            self.diverge = (int(_number(spec, f[1], int)), _number(spec, f[2], float))
        elif f == ["zero_lr"]:
            self.zero_lr = True
        elif len(f) == 4 and f[0] == "grad_spike":
            every = int(_number(spec, f[2], int))
            if every < 1:
                raise ValueError(f"DFLASH_FAULT={spec!r}: grad_spike's EVERY must be >= 1")
            self.spike = (int(_number(spec, f[1], int)), every, _number(spec, f[3], float))
        elif len(f) == 2 and f[0] == "sigkill":
            self.sigkill_after = int(_number(spec, f[1], int))
        elif len(f) == 2 and f[0] == "wedge_main":
            self.wedge_after = int(_number(spec, f[1], int))
        elif len(f) == 2 and f[0] == "steal_signals":
            self.steal_after = int(_number(spec, f[1], int))
        elif len(f) == 2 and f[0] == "buffer_log":
            self.log_buffer_bytes = max(2, int(_number(spec, f[1], int)))
        elif len(f) == 2 and f[0] == "stall_checkpoint":
            self.checkpoint_stall_s = _number(spec, f[1], float)
        else:
            raise ValueError(f"DFLASH_FAULT={spec!r}: {':'.join(f)!r} is not {GRAMMAR}")

    def check(self, role: str, item: int, index: int | None = None) -> None:
        """Called by each role's thread (its `index` among them) per item, before its work."""
        if late_s := self.slow.get(role) or self.slow.get(f"{role}-{index}"):
            time.sleep(late_s)
        if (late := self.slow_from.get(role)) and self._steps_done >= late[0]:
            time.sleep(late[1])
        if item in (self.hang_at.get(role), self.hang_at.get(f"{role}-{index}")):
            threading.Event().wait()  # forever: the thread is stuck, the process lives
        if item in (self.raise_at.get(role), self.raise_at.get(f"{role}-{index}")):
            raise InjectedFault(f"injected fault in {role} at item {item} (DFLASH_FAULT)")

    def slow_s(self, stage: str) -> float:
        return self.slow.get(stage, 0.0)

    def poison_loss(self, step: int) -> bool:
        """Whether the drafter loss of optimizer step `step` is to be NaN."""
        return self.nan_from is not None and step >= self.nan_from

    def lr_factor(self, step: int) -> float:
        """What the optimizer's learning rate at optimizer step `step` is multiplied by."""
        if self.zero_lr:
            return 0.0
        if self.diverge is not None and step >= self.diverge[0]:
            return self.diverge[1]
        return 1.0

    def loss_scale(self, step: int) -> float:
        """What the drafter loss of optimizer step `step` is multiplied by before its backward
        (DFLASH_FAULT=grad_spike): the gradients, and so their norm, scale with it."""
        if self.spike is None:
            return 1.0
        first, every, factor = self.spike
        return factor if step >= first and (step - first) % every == 0 else 1.0

    def after_step(self, step: int) -> None:
        self._steps_done = step  # one writer (replica 0's thread); readers see an int
        if self.sigkill_after is not None and step >= self.sigkill_after:
            os.kill(os.getpid(), signal.SIGKILL)
        if self.steal_after is not None and step >= self.steal_after:
            self.steal_after = None  # once, as LLVM registers its handlers once
            import ctypes

            libc = ctypes.CDLL(None)
            libc.signal.restype = ctypes.c_void_p
            libc.signal(signal.SIGUSR1, ctypes.c_void_p(1))  # SIG_IGN, unseen by Python

    def supervise(self, step: int) -> None:
        """Called by the main thread as it supervises (DFLASH_FAULT=wedge_main:N)."""
        if self.wedge_after is not None and step >= self.wedge_after:
            import ctypes

            libc = ctypes.CDLL(None)
            mutex = ctypes.create_string_buffer(64)  # zeroed: PTHREAD_MUTEX_INITIALIZER
            libc.pthread_mutex_lock(mutex)
            libc.pthread_mutex_lock(mutex)  # a normal mutex locked twice: never returns

    def stall_checkpoint(self) -> None:
        if self.checkpoint_stall_s:
            time.sleep(self.checkpoint_stall_s)

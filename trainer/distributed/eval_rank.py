"""processes mode: held-out τ on a target rank of the writer's node, with the drafter's
weights sent to it from drafter rank 0 (the writer).

No rank holds both halves of threads mode's eval (trainer/evaluation/online.py): a drafter rank
holds only the target's embedding and head, and beside a 27B drafter the whole 27B target
does not fit on one card. Target 0's rank (global rank 0, on node 0 like the writer, so
both see the job's run dir) holds the truncated target training uses; it runs threads
mode's own `OnlineEval` there (the same whole target built around it, the same batched
decoding loop, the same `eval/step-N.json`), fed with the weights the writer sends:

  writer (drafter rank 0)                       eval rank (target rank 0)
  drafter thread, after optimizer step N:       eval-link thread:
    idle link? copy the trainable weights         builds OnlineEval, answers "ready"
    (in the eval's dtype) into a send buffer;     (its dtype and weight count, or why off)
    else skip and count, as threads mode does   loop: recv ("eval", N, train_acc)
  eval-link thread:                                    recv the weights -> its staging drafter
    send ("eval", N, train_acc), the weights           OnlineEval.offer, wait for it
    recv the answer: EvalInfo, graphs, result,         send the answer
    the log lines -> heartbeat, metrics row,          ("end",): close OnlineEval, leave
    train.log (the job's)

The writer publishes what the eval rank answers (its `EvalInfo`, with the writer's own
skipped count and snapshot time, since those are the training thread's), so heartbeat.json's
`eval`, metrics.jsonl's rows and train.log read as in threads mode; `eval/step-N.json` is
written by the eval rank into the job's run dir (the same host).

Deadlock: the link is two process groups of its own, [writer, eval rank]: control messages
always over gloo (host memory; a posted receive spins no GPU kernel while it waits for the
next eval, and its timeout is long: an eval interval may outlast runtime.collective_timeout_s),
the weights over the job's backend (the same gloo group on CPU, a NCCL group when the job
is on NCCL, posted only once the control message said they come). Neither shares a
communicator, tag space or ordering with the feature transfers (trainer/distributed/transfer.py,
the default group) or the drafters' all-reduce (their own group), so no send here can sit
in front of a feature message or behind it. Neither side waits on the other while holding
anything training needs: the writer's drafter thread only copies into the buffer when the
link is idle (the eval rank then sits in its receive, so the send completes as soon as the
bytes move), and the one wait, the run's last step waiting for the eval before it, waits on
an eval that needs nothing from any drafter. The eval rank's target thread never touches the
link. On NCCL, the eval's weights use a second communicator on the writer's and the eval
rank's GPUs, beside the default one, as the drafter ranks' all-reduce already does.

Memory: the writer holds one send buffer of the drafter's trainable weights in the eval's
dtype (bf16 on a GPU: 2 bytes a parameter); the eval rank its (never trained) drafter as the
staging copy, and the eval's own drafter and the target's dropped layers, as threads mode.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import threading
import time
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor

from trainer.config import Config, bad_value, one_line
from trainer.contract.evaluation import EvalInfo, EvalResult
from trainer.distributed.layout import Job, RankLayout
from trainer.evaluation.online import ROLE, EvalHandoff, OnlineEval
from trainer.model.drafter import DFlashDrafter
from trainer.targets.answers import prompt_of

EVAL_TARGET = 0  # the target whose rank evaluates: node 0's first, beside the writer
# The control group's timeout: the eval rank waits in a receive from one eval to the next.
LINK_TIMEOUT = timedelta(days=30)
_DTYPES = {str(d): d for d in (torch.float32, torch.bfloat16, torch.float16)}


def eval_wanted(cfg: Config) -> bool:
    """The job asks for held-out τ (threads mode's condition, from the config alone: every
    rank decides the same before anything loads)."""
    return bool(cfg.eval.every or (cfg.eval.final and cfg.data.held_out))


def eval_rank(layout: RankLayout) -> int:
    return layout.target_rank(EVAL_TARGET)


def check_eval_layout(cfg: Config) -> None:
    """Before any rendezvous or model: an eval this layout cannot run is bad input.
    The eval decodes on target 0's device (runtime.targets[0]), so `eval.cuda_graphs = on`
    needs a GPU there, whatever device the rank that reads this is on."""
    if not eval_wanted(cfg) or cfg.eval.cuda_graphs != "on":
        return
    device = cfg.runtime.targets[EVAL_TARGET]
    if device == "cpu" or (device == "auto" and not torch.cuda.is_available()):
        rule = (
            f"CUDA graphs need a CUDA device, and processes mode evaluates on target "
            f"{EVAL_TARGET}'s rank (runtime.targets[{EVAL_TARGET}] = {device!r}, "
            f"{'no GPU here' if device == 'auto' else 'a CPU'}); use 'auto' or 'off'"
        )
        raise bad_value("eval.cuda_graphs", "on", rule)


def rank_eval_config(mine: Config, job_cfg: Config, layout: RankLayout) -> None:
    """The eval settings this rank builds from: the job's on the eval rank (its
    OnlineEval reads them) and on the writer (checkpoint retention keeps eval steps);
    `cuda_graphs` is checked against the eval rank's device only (check_eval_layout)."""
    if not eval_wanted(job_cfg):
        return
    if layout.writer or layout.rank == eval_rank(layout):
        mine.eval = copy.deepcopy(job_cfg.eval)
    if layout.rank != eval_rank(layout):
        mine.eval.cuda_graphs = "off"  # this rank never decodes; the eval rank's device counts


@dataclasses.dataclass
class _Answer:
    """The eval rank's message to the writer: after it is built ("ready") and after each eval."""

    alive: bool  # it can take an eval (False: off, `info.error` says why)
    info: EvalInfo
    graphs: Any  # GraphInfo | None: the eval's decode step, for the heartbeat
    result: EvalResult | None
    lines: list[str]
    dtype: str = ""  # "ready" only: the weights' dtype and count it receives
    numel: int = 0


class EvalLink:
    """The writer's and the eval rank's two groups. Every rank makes them (torch's new_group
    is collective over the world); only those two use them."""

    def __init__(self, job: Job, layout: RankLayout) -> None:
        self.writer, self.evaluator = layout.writer_rank, eval_rank(layout)
        pair = sorted({self.writer, self.evaluator})
        self.control = dist.new_group(pair, backend="gloo", timeout=LINK_TIMEOUT)
        self.data = self.control
        if job.backend == "nccl":
            self.data = dist.new_group(pair, timeout=job.timeout)
        self.data_device = job.comm_device
        self.member = layout.rank in pair

    def send(self, obj: Any, dst: int) -> None:
        dist.send_object_list([obj], dst=dst, group=self.control)

    def recv(self, src: int) -> Any:
        box: list[Any] = [None]
        dist.recv_object_list(box, src=src, group=self.control)
        return box[0]


def trainable(model: DFlashDrafter) -> list[Tensor]:
    """The tensors an eval needs from training, in one order on both sides (the same arch):
    what threads mode's OnlineEval copies (the embedding and head are the target's)."""
    return [p for p in model.parameters() if p.requires_grad]


class RemoteEval(EvalHandoff):
    """The writer's end: threads mode's OnlineEval interface (start, due, offer,
    take_result, close) over the link, so the drafter pipeline calls it unchanged; `close`
    lets an eval under way answer (at most `timeout` s), then ends the eval rank's loop."""

    def __init__(self, link: EvalLink, setup: Any, state: Any, log: Callable[[str], None]) -> None:
        cfg = setup.cfg.eval
        self.link, self.state, self.log = link, state, log
        self.every, self.final = cfg.every, cfg.final
        super().__init__(self._run, "eval-link")
        self._busy = True  # until the eval rank says it is built
        self._off = False  # the eval rank cannot evaluate (said in info.error) or is lost
        self._job: tuple[int, float | None] | None = None
        self._ready: Any = None  # torch.cuda.Event | None: the buffer's copy has finished
        self._buffer: Tensor | None = None
        # What the writer knows before the eval rank answers (the same as threads mode's).
        prompts = [p for p in (prompt_of(s, cfg.prompt_len) for s in setup.held_out) if p]
        self.info = EvalInfo(
            every=cfg.every,
            held_out=len(setup.held_out),
            prompts=len(prompts[: cfg.prompts]),
            new_tokens=cfg.new_tokens,
            device=f"rank {link.evaluator}",
            tree_nodes=cfg.tree_nodes,
        )

    # -- on the drafter thread -----------------------------------------------------------
    def start(self) -> None:
        with self._lock:
            self._publish_locked()  # set up, as threads mode says it before its first eval
        self._thread.start()

    def due(self, step: int, last: bool) -> bool:
        return (self.every > 0 and step % self.every == 0) or (last and self.final)

    def offer(self, step: int, primary: DFlashDrafter, train_acc: float | None, wait: bool) -> None:
        with self._lock:
            if wait:  # the last step: wait for the eval before it (it needs no drafter)
                while self._busy and self._thread.is_alive() and not self._off:
                    self._idle.wait(0.1)
            t0 = time.monotonic()
            if self._off or not self._thread.is_alive():
                return  # said once, when it went off
            if self._skipped(step, ready=self._buffer is not None) or self._buffer is None:
                return
            self._ready = self._snapshot(primary, self._buffer)
            self._busy, self._job = True, (step, train_acc)
            self._started(step, t0)

    @torch.no_grad()
    def _snapshot(self, primary: DFlashDrafter, buffer: Tensor) -> Any:
        """The weights into the send buffer, each into its slice (no second flat copy),
        cast to the eval's dtype as threads mode's copy into its eval drafter casts: the
        optimizer may change them while the send runs."""
        params = trainable(primary)
        total = sum(p.numel() for p in params)
        if total != buffer.numel():
            raise RuntimeError(
                f"eval: the drafter has {total} trainable weights, the eval rank expects "
                f"{buffer.numel()}"
            )
        on_gpu = buffer.device.type == "cuda"  # else a host buffer: each copy completes
        offset = 0
        for p in params:
            n = p.numel()
            buffer[offset : offset + n].view_as(p).copy_(p, non_blocking=on_gpu)
            offset += n
        if not on_gpu:
            return None
        event = torch.cuda.Event()
        event.record()  # on the drafter thread's stream, after the copies
        return event

    # -- on the link thread --------------------------------------------------------------
    def _run(self) -> None:
        link, src = self.link, self.link.evaluator
        try:
            ready: _Answer = link.recv(src)
            with self._lock:
                self.info = self._merged(ready.info)
                self._off = not ready.alive
                self._apply_locked(ready)
                if ready.alive:
                    dtype = _DTYPES[ready.dtype]
                    self._buffer = torch.empty(ready.numel, dtype=dtype, device=link.data_device)
                    self._busy = False
                self._idle.notify_all()
            if not ready.alive:
                return
            while True:
                with self._lock:
                    while self._job is None and not self._closed:
                        self._idle.wait()
                    job, event = self._job, self._ready
                if job is None:  # closed with nothing under way
                    link.send(("end",), src)
                    return
                assert self._buffer is not None
                link.send(("eval", *job), src)
                with _on_device(self._buffer.device):
                    if event is not None:
                        torch.cuda.current_stream().wait_event(event)
                    dist.send(self._buffer, dst=src, group=link.data)
                    if self._buffer.device.type == "cuda":  # sent before the next copy into it
                        torch.cuda.current_stream().synchronize()
                answer: _Answer = link.recv(src)
                with self._lock:
                    self.info = self._merged(answer.info)
                    self._off = not answer.alive
                    self._apply_locked(answer)
                    self._job, self._busy = None, False
                    self._idle.notify_all()
        except Exception as e:  # the eval rank is lost: training goes on, the eval is off
            with self._lock:
                self._off = True
                self.info.error = f"the eval rank is lost: {one_line(str(e))}"
                self.info.running_step = None
                self.log(f"eval: off: {self.info.error}")
                self._publish_locked()
                self._idle.notify_all()

    def _merged(self, theirs: EvalInfo) -> EvalInfo:
        """The eval rank's info, with the writer's own: skips and snapshot time are the
        training thread's, and an eval is under way until its answer came."""
        mine = copy.deepcopy(theirs)
        mine.skipped, mine.snapshot_s = self.info.skipped, self.info.snapshot_s
        mine.running_step = None
        return mine

    def _apply_locked(self, answer: _Answer) -> None:
        for line in answer.lines:
            self.log(line)
        if answer.graphs is not None:
            self.state.set_graphs(ROLE, answer.graphs)
        if answer.result is not None:
            self._result = answer.result
        self._publish_locked()

    def _publish_locked(self) -> None:
        self.state.set_eval(copy.deepcopy(self.info))


@contextlib.contextmanager
def _on_device(device: torch.device) -> Any:
    """A thread's CUDA device is its own (the main thread's set_device is not this one's)."""
    if device.type == "cuda":
        with torch.cuda.device(device):
            yield
    else:
        yield


class _Relay:
    """The eval rank's RunState for its OnlineEval: the thread's name and state go to the
    rank's own heartbeat; the eval's info and graphs are kept for the writer too."""

    def __init__(self, state: Any) -> None:
        self.state = state
        self.info: EvalInfo | None = None
        self.graphs: Any = None

    def register_thread(self, role: str, device: str) -> None:
        self.state.register_thread(role, device)

    def thread_state(self, what: str) -> None:
        self.state.thread_state(what)

    def set_eval(self, info: EvalInfo) -> None:
        self.info = info
        self.state.set_eval(info)

    def set_graphs(self, place: str, info: Any) -> None:
        self.graphs = info
        self.state.set_graphs(place, info)


class EvalRank:
    """The eval rank's end: threads mode's OnlineEval, fed over the link."""

    def __init__(
        self,
        link: EvalLink,
        setup: Any,  # RunSetup, after finish_loading
        state: Any,
        log: Callable[[str], None],
        job_dir: Path,
        stop: threading.Event,
    ) -> None:
        self.link, self.setup, self.log = link, setup, log
        self._lines: list[str] = []
        self._lines_lock = threading.Lock()

        def said(line: str) -> None:
            log(line)  # this rank's own train.log
            with self._lines_lock:
                self._lines.append(line)  # and the job's, through the writer

        self.relay = _Relay(state)
        self.eval = OnlineEval(setup, self.relay, said, job_dir, stop)
        self._thread = threading.Thread(target=self._run, name="eval-link", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def join(self, timeout: float) -> None:
        self._thread.join(timeout)

    def _answer(self, alive: bool, **more: Any) -> _Answer:
        with self._lines_lock:
            lines, self._lines = self._lines, []
        info = self.relay.info if self.relay.info is not None else self.eval.info
        return _Answer(
            alive=alive,
            info=copy.deepcopy(info),
            graphs=copy.deepcopy(self.relay.graphs),
            result=self.eval.take_result(),
            lines=lines,
            **more,
        )

    def _run(self) -> None:
        link, writer, ev = self.link, self.link.writer, self.eval
        staging = self.setup.replicas.primary  # this rank's drafter: never trained here
        params = trainable(staging)
        numel = sum(p.numel() for p in params)
        dtype = ev.dtype
        try:
            ev.start()
            alive = ev.wait_idle()
            link.send(self._answer(alive, dtype=str(dtype), numel=numel), writer)
            if not alive:
                return
            buffer = torch.empty(numel, dtype=dtype, device=link.data_device)
            while True:
                message = link.recv(writer)
                if message[0] == "end":
                    break
                _, step, train_acc = message
                with _on_device(buffer.device):
                    dist.recv(buffer, src=writer, group=link.data)
                with torch.no_grad():
                    offset = 0
                    for p in params:
                        n = p.numel()
                        p.copy_(buffer[offset : offset + n].view_as(p))
                        offset += n
                ev.offer(step, staging, train_acc, wait=True)
                alive = ev.wait_idle()
                link.send(self._answer(alive), writer)
                if not alive:
                    return
        except Exception as e:  # the writer is lost (the job is ending): said here only
            self.log(f"eval: the link to the writer is lost: {one_line(str(e))}")
        finally:
            ev.close(timeout=5.0)

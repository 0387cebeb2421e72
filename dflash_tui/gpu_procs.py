"""Which processes are on each GPU, as nvitop shows them: pid, user, memory, command, and
whether it is the followed run's (`Store.this_run`); a GPU NVML cannot read, with its
error; the kernel log's Xid lines, or why the log cannot be read (said once, not as an
error). For `status`'s lines and the GPU processes view (`P`); `status --json` carries the
same records (`Store.to_json`). Pure: users, commands and errors are the host's text, kept
exact here and sanitised by the view that writes them (headless `say`, widgets/safe.py)."""

from __future__ import annotations

from dflash_tui.fmt import duration
from dflash_tui.state import Store
from trainer.contract.protocol import GpuProcess

GIB = 1 << 30
SHOWN_XIDS = 3  # status's lines: the newest few; the view shows them all


def whose(s: Store, p: GpuProcess) -> str:
    mine = s.this_run(p)
    return "this run" if mine else "?" if mine is None else "other"


def process_line(s: Store, index: int, p: GpuProcess) -> str:
    """`GPU 0  pid 4242  alice  40.0G  this run  python -m trainer --config …`."""
    user = p.user or ("(host pid)" if not p.local else "?")
    command = p.command or ("not in this pid namespace" if not p.local else "?")
    return f"GPU {index}  pid {p.pid}  {user}  {p.mem_used / GIB:.1f}G  {whose(s, p)}  {command}"


def xid_line(x_t: float, code: int, pci: str, text: str, now: float) -> str:
    return f"kernel log: Xid {code} on {pci or '?'} {duration(max(0.0, now - x_t))} ago: {text}"


def lines(s: Store, now: float | None = None, all_xids: bool = False) -> list[str]:
    """A line per GPU process (most memory first per GPU), per GPU NVML cannot read, the
    kernel log's newest Xid lines or why it cannot be read."""
    gpu = s.gpu
    if gpu is None or gpu.state is not None:
        return []
    now = s.remote_now(now)
    out = []
    for d in sorted(gpu.devices, key=lambda d: d.index):
        if d.error:
            out.append(f"GPU {d.index}  NVML: {d.error}")
        for p in sorted(d.processes, key=lambda p: -p.mem_used):
            out.append(process_line(s, d.index, p))
    xids = gpu.xids if all_xids else gpu.xids[-SHOWN_XIDS:]
    out += [xid_line(x.t, x.code, x.pci, x.text, now) for x in xids]
    if gpu.kernel_log:
        out.append(f"kernel log unreadable ({gpu.kernel_log}): Xid faults are not watched")
    return out


def view_text(s: Store) -> str:
    """The GPU processes view: each GPU's memory and its processes, then the kernel log."""
    gpu = s.gpu
    if gpu is None:
        return "waiting for GPU samples…"
    if gpu.state is not None:
        return f"no GPU processes to show: {gpu.state} {gpu.reason}".rstrip()
    rows = []
    for d in sorted(gpu.devices, key=lambda d: d.index):
        head = f"GPU {d.index}  {d.name.removeprefix('NVIDIA ')}"
        if d.error:
            rows.append(f"{head}  NVML: {d.error}")
            continue
        held = sum(p.mem_used for p in d.processes)
        rows.append(
            f"{head}  {d.mem_used / GIB:.1f}/{d.mem_total / GIB:.0f}G used, "
            f"{len(d.processes)} process{'es' if len(d.processes) != 1 else ''}"
            + (f" ({held / GIB:.1f}G)" if d.processes else "")
        )
        for p in sorted(d.processes, key=lambda p: -p.mem_used):
            rows.append("  " + process_line(s, d.index, p).split("  ", 1)[1])
    tail = [ln for ln in lines(s, all_xids=True) if ln.startswith("kernel log")]
    return "\n".join(rows + (["", *tail] if tail else []))

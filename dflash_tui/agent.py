"""dflash-tui agent: runs next to the trainer, streams what happens, carries out commands.

Standard library only (plus `pynvml` when importable). It is shipped as this one file: the
link starts it with `python -u -c <bootstrap>` and sends this source on stdin, so the
agent always matches the monitor's version and nothing needs installing remotely. Deploy
also copies it next to the trainer, where launched runs use its `wrap` mode.

Protocol version 1: JSON lines. Every event carries "type" and "t" (the agent's unix time).

Events (stdout):
  hello      {version, pid, host, python, run_root, remote_dir, gpu_backend, pyspy, deployed}
             gpu_backend: "nvml" | "nvidia-smi" | "none"; deployed: deployed.json or null
  gpu        {backend, devices: [{index, uuid, name, mem_used, mem_total (bytes), util (%),
             power_w, temp_c, processes: [{pid, mem_used, local}]}]}
             or {backend: "none", state: "no_gpu", reason}. `local` = the pid exists in the
             agent's pid namespace (inside a container NVML may report host pids).
  runs       {runs: [RunInfo], alive_run: run_id | null}; RunInfo = {run_id, created, name,
             phase, step, alive, exit (exit.json or null), best_tok_s, last_tok_s, steps,
             error, phases: {phase: seconds of its first visit}, role_memory: {role: bytes}}
  follow     {run_id, run_dir}: the run whose files the following events are about
  heartbeat  {run_id, data}: heartbeat.json changed (data is the whole heartbeat)
  heartbeat_error {run_id, error}: heartbeat.json unreadable (torn, partial): keep the last
  line       {run_id, file, offset, end, text}: one complete line of `file` (train.log,
             metrics.jsonl, launch.log) without its newline; bytes [offset, end) of the file
  truncated  {run_id, file, size, reason}: the file shrank or was replaced; reading restarts
             at 0 (rotation) or at the new end (truncation in place)
  liveness   {run_id, alive, pid, pgid, exit}: on change, and every 5 s
  progress   {id, message}: a long command's progress (kill, restart, deploy)
  result     {id, ok, data | error}: every command is answered exactly once
  log        {level, message}: the agent's own notes

Commands (stdin), each {"cmd": ..., "id": int, ...}:
  ping                                   -> {pong: t}
  follow      {run_id: id|"latest", offsets: {file: byte offset}, offsets_run_id}
              "latest" follows the newest run and switches when a new one starts. With no
              offset for a file, the agent starts TAIL_BYTES from its end (a 1 GB log opens
              at once). A reconnect sends the offsets it has: no loss, no duplicates.
  list_runs
  launch      {config_toml, overrides: [str], name}: refused while a run is alive
  kill        {run_id?, timeout_s=60, drain_timeout_s=120}
  restart     {run_id?, timeout_s=60, drain_timeout_s=120}
  dump_stacks {run_id?, pyspy: bool}
  clear_compile_cache
  deploy      {tar_b64, sha256}
  read_file   {run_id, name, tail_bytes}

Runs live in RUN_ROOT/<run_id>/. A run is alive while RUN_ROOT/.launch.lock is flock-ed: the
lock is taken by the agent, handed to the detached wrapper (and by it to the trainer), and
released by the kernel when the last of them exits. Not a guess from pids or timestamps.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import fcntl
import io
import json
import os
import queue
import re
import secrets
import select
import shutil
import signal
import socket
import subprocess
import sys
import tarfile
import threading
import time
import traceback
from typing import Any

VERSION = 1
TAIL_BYTES = 256 * 1024  # where a follow without offsets starts: this far from the end
READ_CHUNK = 1 << 20  # bytes read per file per poll: bounded work, bounded latency
FOLLOWED_FILES = ("train.log", "metrics.jsonl", "launch.log")
LOCK_NAME = ".launch.lock"
ACTIVE_NAME = ".active.json"
SAFE_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
SAFE_FILE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


# -- output -------------------------------------------------------------------------------
class Out:
    """JSON lines on stdout from any thread; each line is written whole."""

    def __init__(self, stream=None):
        self._stream = stream or sys.stdout.buffer
        self._lock = threading.Lock()
        self.closed = False

    def emit(self, type_, **fields):
        fields["type"] = type_
        fields["t"] = time.time()
        data = (json.dumps(fields, separators=(",", ":"), default=str) + "\n").encode()
        with self._lock:
            if self.closed:
                return
            try:
                self._stream.write(data)
                self._stream.flush()
            except (BrokenPipeError, ValueError, OSError):
                self.closed = True  # the client is gone


# -- small file helpers -------------------------------------------------------------------
def read_json(path, default=None):
    try:
        with open(path, "rb") as f:
            return json.loads(f.read())
    except (OSError, ValueError):
        return default


def write_json_atomic(path, obj):
    tmp = "%s.%s.tmp" % (path, secrets.token_hex(4))
    with open(tmp, "w") as f:
        json.dump(obj, f, indent=1, sort_keys=True, default=str)
        f.write("\n")
    os.replace(tmp, path)


def tail_text(path, max_bytes):
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - max_bytes))
            return f.read().decode("utf-8", "replace")
    except OSError:
        return ""


def pid_alive(pid):
    if not pid:
        return False
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie is dead for our purposes.
    try:
        with open("/proc/%d/stat" % int(pid)) as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return True


def group_pids(pgid):
    """Pids of live (non-zombie) processes in process group `pgid`, from /proc."""
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open("/proc/%s/stat" % entry) as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields[0] != "Z" and int(fields[2]) == pgid:
            out.append(int(entry))
    return sorted(out)


# -- following files ----------------------------------------------------------------------
class FileFollower:
    """Complete lines appended to one file, with their byte offsets.

    Survives the file not existing yet, truncation in place (size < offset: restart at the
    new end) and replacement (a new inode: rotation, restart at 0)."""

    def __init__(self, path, offset=None, tail_bytes=TAIL_BYTES):
        self.path = path
        self.offset = offset  # next byte to read; None = decide at first sight
        self.tail_bytes = tail_bytes
        self.inode = None
        self.partial = b""

    def poll(self):
        """-> (lines [(offset, end, text)], notice or None)."""
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            return [], None
        notice = None
        if self.inode is not None and st.st_ino != self.inode:
            notice = {"size": st.st_size, "reason": "replaced"}
            self.offset, self.partial = 0, b""
        elif self.offset is not None and st.st_size < self.offset + len(self.partial):
            notice = {"size": st.st_size, "reason": "truncated"}
            self.offset, self.partial = st.st_size, b""
        self.inode = st.st_ino
        if self.offset is None:
            self.offset = 0
            if st.st_size > self.tail_bytes:
                self.offset = self._line_start_after(st.st_size - self.tail_bytes)
        start = self.offset + len(self.partial)
        if st.st_size <= start:
            return [], notice
        with open(self.path, "rb") as f:
            f.seek(start)
            data = f.read(min(READ_CHUNK, st.st_size - start))
        buf = self.partial + data
        lines = []
        pos = 0
        while True:
            nl = buf.find(b"\n", pos)
            if nl < 0:
                break
            text = buf[pos:nl].decode("utf-8", "replace")
            lines.append((self.offset + pos, self.offset + nl + 1, text))
            pos = nl + 1
        self.offset += pos
        self.partial = buf[pos:]
        return lines, notice

    def _line_start_after(self, pos):
        with open(self.path, "rb") as f:
            f.seek(pos)
            while True:
                chunk = f.read(65536)
                if not chunk:
                    return pos
                nl = chunk.find(b"\n")
                if nl >= 0:
                    return pos + nl + 1
                pos += len(chunk)


class HeartbeatWatch:
    def __init__(self, path):
        self.path = path
        self.sig = None
        self.last_good = None

    def poll(self):
        """-> ("ok", data) | ("error", message) | None when unchanged."""
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            return None
        sig = (st.st_ino, st.st_mtime_ns, st.st_size)
        if sig == self.sig:
            return None
        self.sig = sig
        try:
            with open(self.path, "rb") as f:
                data = json.loads(f.read())
            if not isinstance(data, dict) or "phase" not in data:
                raise ValueError("not a heartbeat object")
        except (OSError, ValueError) as e:
            return ("error", "%s: %s" % (os.path.basename(self.path), e))
        self.last_good = data
        return ("ok", data)


class Inotify:
    """Linux inotify through ctypes: the agent sleeps until a followed file changes.

    Event-driven following keeps latency at a few ms and idle CPU near zero; where inotify
    is missing (not Linux, a filesystem without it) the agent falls back to fast polling."""

    MASK = (
        0x2 | 0x4 | 0x8 | 0x80 | 0x100 | 0x200
    )  # MODIFY ATTRIB CLOSE_WRITE MOVED_TO CREATE DELETE

    def __init__(self):
        import ctypes
        import ctypes.util

        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        self._add = libc.inotify_add_watch
        self._add.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_uint32]
        self._rm = libc.inotify_rm_watch
        self.fd = libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
        if self.fd < 0:
            raise OSError(ctypes.get_errno(), "inotify_init1 failed")
        self.watches = {}  # path -> wd

    def watch(self, paths):
        """Watch exactly these folders (missing ones are skipped: the poll covers them)."""
        for path in list(self.watches):
            if path not in paths:
                self._rm(self.fd, self.watches.pop(path))
        for path in paths:
            if path not in self.watches and os.path.isdir(path):
                wd = self._add(self.fd, os.fsencode(path), self.MASK)
                if wd >= 0:
                    self.watches[path] = wd

    def drain(self):
        while True:
            try:
                if not os.read(self.fd, 65536):
                    return
            except BlockingIOError:
                return


# -- GPUs ---------------------------------------------------------------------------------
class Gpus:
    """NVML through pynvml when importable, else nvidia-smi, else a clear no_gpu state."""

    SMI_GPU = (
        "--query-gpu=index,uuid,name,memory.used,memory.total,utilization.gpu,power.draw,"
        "temperature.gpu"
    )
    SMI_APPS = "--query-compute-apps=pid,used_memory,gpu_uuid"

    def __init__(self):
        self.backend = "none"
        self.reason = ""
        self.nvml: Any = None
        try:
            import pynvml

            pynvml.nvmlInit()
            self.nvml, self.backend = pynvml, "nvml"
            return
        except Exception as e:  # ImportError, NVMLError (no driver), anything odd
            self.reason = "NVML: %s" % (e,)
        if shutil.which("nvidia-smi"):
            try:
                self._smi()
                self.backend = "nvidia-smi"
                return
            except Exception as e:
                self.reason += "; nvidia-smi: %s" % (str(e).strip().splitlines() or ["failed"])[0]
        else:
            self.reason += "; nvidia-smi: not found"

    def sample(self):
        if self.backend == "nvml":
            return self._nvml()
        if self.backend == "nvidia-smi":
            return self._smi()
        return None

    def _nvml(self):
        n = self.nvml
        out = []
        for i in range(n.nvmlDeviceGetCount()):
            h = n.nvmlDeviceGetHandleByIndex(i)
            mem = n.nvmlDeviceGetMemoryInfo(h)
            name = n.nvmlDeviceGetName(h)
            uuid = n.nvmlDeviceGetUUID(h)
            dev: dict[str, Any] = {
                "index": i,
                "uuid": uuid.decode() if isinstance(uuid, bytes) else uuid,
                "name": name.decode() if isinstance(name, bytes) else name,
                "mem_used": int(mem.used),
                "mem_total": int(mem.total),
                "util": None,
                "power_w": None,
                "temp_c": None,
                "processes": [],
            }
            with contextlib.suppress(Exception):
                dev["util"] = int(n.nvmlDeviceGetUtilizationRates(h).gpu)
            with contextlib.suppress(Exception):
                dev["power_w"] = n.nvmlDeviceGetPowerUsage(h) / 1000.0
            with contextlib.suppress(Exception):
                dev["temp_c"] = int(n.nvmlDeviceGetTemperature(h, n.NVML_TEMPERATURE_GPU))
            with contextlib.suppress(Exception):
                for p in n.nvmlDeviceGetComputeRunningProcesses(h):
                    dev["processes"].append(
                        {
                            "pid": int(p.pid),
                            "mem_used": int(p.usedGpuMemory or 0),
                            "local": os.path.exists("/proc/%d" % p.pid),
                        }
                    )
            out.append(dev)
        return out

    def _smi(self):
        def run(query):
            r = subprocess.run(
                ["nvidia-smi", query, "--format=csv,noheader,nounits"],
                check=False,
                capture_output=True,
                text=True,
                timeout=10,
            )
            if r.returncode != 0:
                raise RuntimeError(r.stdout + r.stderr)
            return [[c.strip() for c in ln.split(",")] for ln in r.stdout.splitlines() if ln]

        def num(x, cast=float):
            try:
                return cast(float(x))
            except ValueError:
                return None

        mib = 1 << 20
        devs = []
        by_uuid = {}
        for row in run(self.SMI_GPU):
            dev = {
                "index": int(row[0]),
                "uuid": row[1],
                "name": row[2],
                "mem_used": int(float(row[3]) * mib),
                "mem_total": int(float(row[4]) * mib),
                "util": num(row[5], int),
                "power_w": num(row[6]),
                "temp_c": num(row[7], int),
                "processes": [],
            }
            devs.append(dev)
            by_uuid[dev["uuid"]] = dev
        for row in run(self.SMI_APPS):
            owner = by_uuid.get(row[2])
            if owner is not None and row[0].isdigit():
                pid = int(row[0])
                owner["processes"].append(
                    {
                        "pid": pid,
                        "mem_used": int(float(row[1]) * mib),
                        "local": os.path.exists("/proc/%d" % pid),
                    }
                )
        return devs


# -- runs ---------------------------------------------------------------------------------
class RunRoot:
    def __init__(self, path):
        self.path = path
        self._metrics_cache = {}  # run_id -> (inode, offset, best, last, steps)
        self._created = {}  # run_id -> creation time: read once, it never changes

    def run_dir(self, run_id):
        if not isinstance(run_id, str) or not SAFE_ID.match(run_id):
            raise ValueError("bad run id %r" % (run_id,))
        return os.path.join(self.path, run_id)

    def run_ids(self):
        try:
            names = os.listdir(self.path)
        except FileNotFoundError:
            return []
        out = []
        for name in names:
            if SAFE_ID.match(name) and os.path.isfile(os.path.join(self.path, name, "config.json")):
                out.append(name)
        return sorted(out, key=self.created)

    def created(self, run_id):
        if run_id not in self._created:
            self._created[run_id] = self._read_created(run_id)
        return self._created[run_id]

    def _read_created(self, run_id):
        d = os.path.join(self.path, run_id)
        cfg = read_json(os.path.join(d, "config.json"), {}) or {}
        created = (cfg.get("run") or {}).get("created") if isinstance(cfg, dict) else None
        if isinstance(created, (int, float)):
            return created
        try:
            return os.stat(d).st_mtime
        except OSError:
            return 0.0

    def latest(self):
        ids = self.run_ids()
        return ids[-1] if ids else None

    # The lock says whether *a* run is alive; .active.json says which.
    def lock_path(self):
        return os.path.join(self.path, LOCK_NAME)

    def alive_run(self):
        try:
            fd = os.open(self.lock_path(), os.O_RDONLY)
        except FileNotFoundError:
            return None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            active = read_json(os.path.join(self.path, ACTIVE_NAME), {}) or {}
            return active.get("run_id") or "?"
        else:
            fcntl.flock(fd, fcntl.LOCK_UN)
            return None
        finally:
            os.close(fd)

    def process(self, run_id):
        """(pid, pgid) of the run's trainer, from launch.json or its heartbeat."""
        d = self.run_dir(run_id)
        launch = read_json(os.path.join(d, "launch.json"), {}) or {}
        hb = read_json(os.path.join(d, "heartbeat.json"), {}) or {}
        pid = launch.get("pid") or hb.get("pid")
        pgid = launch.get("pgid") or hb.get("pgid") or pid
        return pid, pgid

    def info(self, run_id, alive_run):
        d = self.run_dir(run_id)
        cfg = read_json(os.path.join(d, "config.json"), {}) or {}
        hb = read_json(os.path.join(d, "heartbeat.json"), {}) or {}
        exit_info = read_json(os.path.join(d, "exit.json"))
        pid, _ = self.process(run_id)
        alive = alive_run == run_id or (
            exit_info is None
            and pid_alive(pid)
            and hb.get("host", socket.gethostname()) == socket.gethostname()
        )
        best, last, steps = self._metrics_summary(run_id, os.path.join(d, "metrics.jsonl"))
        return {
            "run_id": run_id,
            "created": self.created(run_id),
            "name": cfg.get("name") if isinstance(cfg, dict) else None,
            "phase": hb.get("phase"),
            "step": hb.get("step"),
            "alive": bool(alive),
            "exit": exit_info,
            "best_tok_s": best,
            "last_tok_s": last,
            "steps": steps,
            "error": (hb.get("error") or {}).get("message") if isinstance(hb, dict) else None,
            "phases": phase_durations(hb),
            "role_memory": role_memory(hb),
        }

    def _metrics_summary(self, run_id, path):
        """Best/last tok/s, read incrementally: a 1 GB metrics file is scanned once."""
        try:
            st = os.stat(path)
        except OSError:
            return None, None, 0
        inode, offset, best, last, steps = self._metrics_cache.get(
            run_id, (st.st_ino, 0, None, None, 0)
        )
        if inode != st.st_ino or st.st_size < offset:
            offset, best, last, steps = 0, None, None, 0
        if st.st_size > offset:
            with open(path, "rb") as f:
                f.seek(offset)
                data = f.read(st.st_size - offset)
            end = data.rfind(b"\n") + 1
            for raw in data[:end].splitlines():
                try:
                    m = json.loads(raw)
                    tok = float(m["tok_s"])
                except (ValueError, KeyError, TypeError):
                    continue
                last = tok
                best = tok if best is None else max(best, tok)
                steps = m.get("step", steps)
            offset += end
        self._metrics_cache[run_id] = (st.st_ino, offset, best, last, steps)
        return best, last, steps

    def new_run_dir(self, name):
        safe = re.sub(r"[^A-Za-z0-9_.-]+", "-", name or "run").strip("-.")[:40] or "run"
        os.makedirs(self.path, exist_ok=True)
        for _ in range(100):
            run_id = "%s-%s-%s" % (time.strftime("%Y%m%d-%H%M%S"), safe, secrets.token_hex(2))
            d = os.path.join(self.path, run_id)
            try:
                os.mkdir(d)
            except FileExistsError:
                continue
            return run_id, d
        raise RuntimeError("could not create a fresh run dir under %s" % self.path)


# -- the agent ----------------------------------------------------------------------------
class CommandError(Exception):
    pass


class Agent:
    def __init__(self, args, out):
        self.args = args
        self.out = out
        self.remote_dir = os.path.abspath(os.path.expanduser(args.remote_dir))
        self.runs = RunRoot(os.path.abspath(os.path.expanduser(args.run_root)))
        self.commands: queue.Queue[Any] = queue.Queue()
        self.lock = threading.Lock()
        self.follow_target = None  # nothing is followed until the client asks
        self.run_id = None
        self.followers = {}
        self.heartbeat = None
        self.last_liveness = None
        self.last_liveness_at = 0.0
        self.last_runs = None
        self.last_runs_at = 0.0
        self.stop = threading.Event()
        self.wake_r, self.wake_w = os.pipe()
        os.set_blocking(self.wake_r, False)
        os.set_blocking(self.wake_w, False)
        vendored = os.path.join(self.remote_dir, "current", "_vendor")
        if os.path.isdir(vendored):
            sys.path.insert(0, vendored)  # the pynvml that deploy carried along
        self.gpus = Gpus()

    # -- plumbing --------------------------------------------------------------------
    def hello(self):
        self.out.emit(
            "hello",
            version=VERSION,
            pid=os.getpid(),
            host=socket.gethostname(),
            python=sys.executable,
            python_version=sys.version.split()[0],
            run_root=self.runs.path,
            remote_dir=self.remote_dir,
            gpu_backend=self.gpus.backend,
            gpu_reason=self.gpus.reason,
            pyspy=bool(shutil.which("py-spy")),
            deployed=read_json(os.path.join(self.remote_dir, "deployed.json")),
        )

    def read_stdin(self):
        stream = sys.stdin.buffer
        while True:
            raw = stream.readline()
            if not raw:
                self.commands.put(None)  # EOF: the client went away
                self.wake()
                return
            raw = raw.strip()
            if not raw:
                continue
            try:
                cmd = json.loads(raw)
                if not isinstance(cmd, dict):
                    raise ValueError("not an object")
            except ValueError as e:
                self.out.emit("log", level="error", message="bad command line: %s" % e)
                continue
            self.commands.put(cmd)
            self.wake()

    def wake(self):
        with contextlib.suppress(OSError):
            os.write(self.wake_w, b"x")

    def run(self):
        self.hello()
        threading.Thread(target=self.read_stdin, name="stdin", daemon=True).start()
        threading.Thread(target=self.gpu_loop, name="gpu", daemon=True).start()
        inotify = None
        why = "--no-inotify"
        if not self.args.no_inotify:
            try:
                inotify = Inotify()
            except (OSError, AttributeError) as e:
                why = "no inotify: %s" % e
        if inotify is None:
            self.out.emit(
                "log",
                level="info",
                message="following files by polling every "
                "%.0f ms (%s)" % (self.args.poll_interval * 1e3, why),
            )
        # With inotify, a slow poll is only the safety net for missed events.
        poll = 0.5 if inotify is not None else self.args.poll_interval
        next_periodic = 0.0
        while not self.stop.is_set():
            waits = [self.wake_r] + ([inotify.fd] if inotify is not None else [])
            timeout = max(0.0, min(poll, next_periodic - time.monotonic()))
            ready, _, _ = select.select(waits, [], [], timeout)
            if self.wake_r in ready:
                with contextlib.suppress(BlockingIOError):
                    os.read(self.wake_r, 4096)
                if not self.drain_commands():
                    break
            if inotify is not None and inotify.fd in ready:
                inotify.drain()
            try:
                if time.monotonic() >= next_periodic:
                    next_periodic = time.monotonic() + 1.0
                    self.check_runs()
                self.follow_files()
                if inotify is not None:
                    inotify.watch(self.watched_dirs())
            except Exception as e:  # never die of a monitoring hiccup
                self.out.emit("log", level="error", message="tick: %s" % e)
        self.stop.set()

    def drain_commands(self):
        """Run every queued command; False once stdin has closed."""
        while True:
            try:
                cmd = self.commands.get_nowait()
            except queue.Empty:
                return True
            if cmd is None:
                return False
            self.dispatch(cmd)

    def watched_dirs(self):
        dirs = [self.runs.path]
        if self.run_id is not None:
            dirs.append(self.runs.run_dir(self.run_id))
        return dirs

    def gpu_loop(self):
        last_error = None
        if self.gpus.backend == "none":
            self.out.emit("gpu", backend="none", state="no_gpu", reason=self.gpus.reason)
            return
        while not self.stop.is_set():
            try:
                devices = self.gpus.sample()
                self.out.emit("gpu", backend=self.gpus.backend, devices=devices)
                last_error = None
            except Exception as e:
                if str(e) != last_error:  # say it once, not every second
                    last_error = str(e)
                    self.out.emit("gpu", backend=self.gpus.backend, state="error", reason=str(e))
            self.stop.wait(self.args.gpu_interval)

    # -- following ------------------------------------------------------------------
    def follow_files(self):
        with self.lock:
            run_id = self.run_id
            followers = dict(self.followers)
            hb = self.heartbeat
        if run_id is None:
            return
        if hb is not None:
            got = hb.poll()
            if got is not None:
                kind, value = got
                if kind == "ok":
                    self.out.emit("heartbeat", run_id=run_id, data=value)
                else:
                    self.out.emit("heartbeat_error", run_id=run_id, error=value)
        for name, follower in followers.items():
            try:
                lines, notice = follower.poll()
            except OSError as e:
                self.out.emit("log", level="warning", message="%s: %s" % (name, e))
                continue
            if notice:
                self.out.emit("truncated", run_id=run_id, file=name, **notice)
            for offset, end, text in lines:
                self.out.emit("line", run_id=run_id, file=name, offset=offset, end=end, text=text)

    def check_runs(self):
        """Once a second: new runs, the alive run, liveness; the runs list every 10 s."""
        alive = self.runs.alive_run()
        ids = self.runs.run_ids()
        if self.follow_target == "latest" and ids and ids[-1] != self.run_id:
            self.set_follow(ids[-1], {})
        sig = (tuple(ids), alive)
        now = time.time()
        if sig != self.last_runs or now - self.last_runs_at > 10:
            self.last_runs, self.last_runs_at = sig, now
            self.emit_runs(alive, ids)
        self.check_liveness(alive, now)

    def emit_runs(self, alive=None, ids=None):
        alive = self.runs.alive_run() if alive is None else alive
        ids = self.runs.run_ids() if ids is None else ids
        infos = []
        for run_id in ids:
            try:
                infos.append(self.runs.info(run_id, alive))
            except Exception as e:
                infos.append({"run_id": run_id, "error": str(e)})
        self.out.emit("runs", runs=infos, alive_run=alive)

    def check_liveness(self, alive_run, now):
        run_id = self.run_id
        if run_id is None:
            return
        pid, pgid = self.runs.process(run_id)
        exit_info = read_json(os.path.join(self.runs.run_dir(run_id), "exit.json"))
        alive = alive_run == run_id or (exit_info is None and pid_alive(pid))
        state = (run_id, alive, pid, pgid, json.dumps(exit_info, sort_keys=True))
        if state != self.last_liveness or now - self.last_liveness_at >= 5.0:
            self.last_liveness, self.last_liveness_at = state, now
            self.out.emit(
                "liveness", run_id=run_id, alive=alive, pid=pid, pgid=pgid, exit=exit_info
            )

    def set_follow(self, run_id, offsets):
        d = self.runs.run_dir(run_id)
        followers = {}
        for name in FOLLOWED_FILES:
            off = offsets.get(name)
            followers[name] = FileFollower(
                os.path.join(d, name),
                int(off) if isinstance(off, int) and off >= 0 else None,
                self.args.tail_bytes,
            )
        with self.lock:
            self.run_id = run_id
            self.followers = followers
            self.heartbeat = HeartbeatWatch(os.path.join(d, "heartbeat.json"))
            self.last_liveness = None
        self.out.emit("follow", run_id=run_id, run_dir=d)

    # -- commands -------------------------------------------------------------------
    QUICK = ("ping", "follow", "list_runs", "read_file")

    def dispatch(self, cmd):
        name = cmd.get("cmd")
        handler = getattr(self, "cmd_" + str(name), None)
        cid = cmd.get("id")
        if handler is None:
            self.out.emit("result", id=cid, ok=False, error="unknown command %r" % (name,))
            return

        def work():
            try:
                data = handler(cmd)
                self.out.emit("result", id=cid, ok=True, data=data)
            except CommandError as e:
                self.out.emit("result", id=cid, ok=False, error=str(e))
            except Exception as e:
                self.out.emit(
                    "result",
                    id=cid,
                    ok=False,
                    error="%s: %s" % (type(e).__name__, e),
                    traceback=traceback.format_exc(),
                )

        if name in self.QUICK:
            work()
        else:  # long commands must not stall the stream
            threading.Thread(target=work, name="cmd-%s" % name, daemon=True).start()

    def progress(self, cmd, message, **extra):
        self.out.emit("progress", id=cmd.get("id"), message=message, **extra)

    def cmd_ping(self, cmd):
        return {"pong": time.time()}

    def cmd_follow(self, cmd):
        target = cmd.get("run_id") or "latest"
        offsets = cmd.get("offsets") or {}
        if not isinstance(offsets, dict):
            raise CommandError("offsets must be an object")
        self.follow_target = target
        run_id = self.runs.latest() if target == "latest" else target
        if run_id is None:
            with self.lock:
                self.run_id = None
            return {"run_id": None}
        if not os.path.isdir(self.runs.run_dir(run_id)):
            raise CommandError("no run %r under %s" % (run_id, self.runs.path))
        # Offsets from an earlier session apply to the run they were read from only.
        if cmd.get("offsets_run_id", run_id) != run_id:
            offsets = {}
        self.set_follow(run_id, offsets)
        return {"run_id": run_id}

    def cmd_list_runs(self, cmd):
        self.emit_runs()
        return {"count": len(self.runs.run_ids())}

    def cmd_read_file(self, cmd):
        name = cmd.get("name")
        if not isinstance(name, str) or not SAFE_FILE.match(name):
            raise CommandError("bad file name %r" % (name,))
        run_id = cmd.get("run_id") or self.run_id
        if run_id is None:
            raise CommandError("no run to read from")
        path = os.path.join(self.runs.run_dir(run_id), name)
        if not os.path.isfile(path):
            raise CommandError("%s: no such file" % path)
        return {
            "run_id": run_id,
            "name": name,
            "text": tail_text(path, int(cmd.get("tail_bytes") or 1 << 20)),
        }

    # launch -------------------------------------------------------------------------
    def release_dir(self):
        cur = os.path.join(self.remote_dir, "current")
        if not os.path.isfile(os.path.join(cur, "trainer", "__main__.py")):
            raise CommandError(
                "nothing deployed in %s: run `dflash-tui deploy` first" % self.remote_dir
            )
        return os.path.realpath(cur)

    def cmd_launch(self, cmd):
        config_toml = cmd.get("config_toml")
        if not isinstance(config_toml, str) or not config_toml.strip():
            raise CommandError("launch needs the config file's text")
        overrides = cmd.get("overrides") or []
        if not all(isinstance(o, str) and "\n" not in o for o in overrides):
            raise CommandError("overrides must be single-line key=value strings")
        return self.launch(config_toml, list(overrides), str(cmd.get("name") or "run"), cmd)

    def launch(self, config_toml, overrides, name, cmd):
        release = self.release_dir()
        os.makedirs(self.runs.path, exist_ok=True)
        lock_fd = os.open(self.runs.lock_path(), os.O_RDWR | os.O_CREAT, 0o644)
        try:
            try:
                fcntl.flock(lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                active = read_json(os.path.join(self.runs.path, ACTIVE_NAME), {}) or {}
                raise CommandError(
                    "run %s is alive under %s: kill it first"
                    % (active.get("run_id", "?"), self.runs.path)
                ) from None
            run_id, run_dir = self.runs.new_run_dir(name)
            config_path = os.path.join(run_dir, "launch-config.toml")
            with open(config_path, "w") as f:
                f.write(config_toml)
            python = self.args.python or sys.executable
            argv = [python, "-m", "trainer", "--config", config_path, "--run-dir", run_dir]
            for o in overrides:
                argv += ["--set", o]
            write_json_atomic(
                os.path.join(run_dir, "launch.json"),
                {
                    "run_id": run_id,
                    "argv": argv,
                    "overrides": overrides,
                    "name": name,
                    "python": python,
                    "release": release,
                    "launched_at": time.time(),
                    "agent_pid": os.getpid(),
                },
            )
            wrapper = [
                python,
                "-u",
                os.path.join(release, "dflash_agent.py"),
                "wrap",
                "--run-dir",
                run_dir,
                "--lock-fd",
                str(lock_fd),
                "--cwd",
                release,
                "--",
                *argv,
            ]
            env = dict(os.environ)
            env["PYTHONPATH"] = release + (
                os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else ""
            )
            env["PYTHONUNBUFFERED"] = "1"
            with open(os.path.join(run_dir, "launch.log"), "ab") as log:
                try:
                    proc = subprocess.Popen(
                        wrapper,
                        cwd=release,
                        stdin=subprocess.DEVNULL,
                        stdout=log,
                        stderr=subprocess.STDOUT,
                        start_new_session=True,
                        pass_fds=(lock_fd,),
                        env=env,
                    )
                except OSError as e:
                    log.write(("could not start %s: %s\n" % (python, e)).encode())
                    write_json_atomic(
                        os.path.join(run_dir, "exit.json"),
                        {
                            "run_id": run_id,
                            "exit_code": 127,
                            "signal": None,
                            "error": "could not start %s: %s" % (python, e),
                            "ended_at": time.time(),
                            "final_phase": None,
                        },
                    )
                    raise CommandError("could not start %s: %s" % (python, e)) from None
            write_json_atomic(
                os.path.join(self.runs.path, ACTIVE_NAME),
                {"run_id": run_id, "wrapper_pid": proc.pid},
            )
        finally:
            os.close(lock_fd)  # the wrapper (and the trainer) hold the lock now
        threading.Thread(target=proc.wait, daemon=True).start()  # reap, never a zombie
        self.progress(cmd, "launched %s, waiting for the trainer to start" % run_id)
        return self.wait_started(run_id, run_dir, float(cmd.get("start_timeout_s", 30)))

    def wait_started(self, run_id, run_dir, timeout):
        """Report a run that dies before its first heartbeat at once, with its output."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            exit_info = read_json(os.path.join(run_dir, "exit.json"))
            if exit_info is not None:
                raise CommandError(
                    "run %s exited at start (%s)\n--- launch.log\n%s\n--- train.log\n%s"
                    % (
                        run_id,
                        describe_exit(exit_info),
                        tail_text(os.path.join(run_dir, "launch.log"), 4000).rstrip(),
                        tail_text(os.path.join(run_dir, "train.log"), 8000).rstrip(),
                    )
                )
            if os.path.exists(os.path.join(run_dir, "heartbeat.json")):
                return {"run_id": run_id, "run_dir": run_dir, "started": True}
            time.sleep(0.05)
        return {
            "run_id": run_id,
            "run_dir": run_dir,
            "started": False,
            "note": "no heartbeat after %.0f s; still starting?" % timeout,
        }

    # kill ---------------------------------------------------------------------------
    def target_run(self, cmd, need_alive=True):
        run_id = cmd.get("run_id") or self.runs.alive_run()
        if run_id in (None, "?"):
            if need_alive:
                raise CommandError("no run is alive under %s" % self.runs.path)
            run_id = self.runs.latest()
            if run_id is None:
                raise CommandError("no runs under %s" % self.runs.path)
        self.runs.run_dir(run_id)  # validates
        return run_id

    def cmd_kill(self, cmd):
        run_id = self.target_run(cmd)
        return self.kill(run_id, cmd)

    def kill(self, run_id, cmd):
        _pid, pgid = self.runs.process(run_id)
        if not pgid:
            raise CommandError("run %s has no recorded process group" % run_id)
        timeout = float(cmd.get("timeout_s", 60))
        pids = group_pids(pgid)
        before = self.gpu_entries()
        t0 = time.monotonic()
        used = "SIGTERM"
        if pids:
            self.progress(cmd, "SIGTERM to process group %d (pids %s)" % (pgid, pids))
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pgid, signal.SIGTERM)
            next_note = 5.0
            while group_pids(pgid) and time.monotonic() - t0 < timeout:
                if time.monotonic() - t0 > next_note:
                    self.progress(
                        cmd,
                        "waiting for a clean exit: %.0fs of %.0fs"
                        % (time.monotonic() - t0, timeout),
                    )
                    next_note += 5.0
                time.sleep(0.1)
            if group_pids(pgid):
                used = "SIGKILL"
                self.progress(cmd, "still alive after %.0fs: SIGKILL" % timeout)
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(pgid, signal.SIGKILL)
                end = time.monotonic() + 10
                while group_pids(pgid) and time.monotonic() < end:
                    time.sleep(0.05)
        stop_s = time.monotonic() - t0
        orphans = group_pids(pgid)
        drain_s, held = self.wait_drain(cmd, pids, before, float(cmd.get("drain_timeout_s", 120)))
        # The wrapper records the exit; give it a moment.
        run_dir = self.runs.run_dir(run_id)
        end = time.monotonic() + 5
        while read_json(os.path.join(run_dir, "exit.json")) is None and time.monotonic() < end:
            time.sleep(0.05)
        exit_info = read_json(os.path.join(run_dir, "exit.json"))
        if exit_info is None and not pids:
            exit_info = None
        self.progress(
            cmd,
            "stopped in %.1fs%s"
            % (stop_s, "" if drain_s is None else ", GPU memory released after %.1fs" % drain_s),
        )
        return {
            "run_id": run_id,
            "signal": used,
            "pids": pids,
            "stop_s": stop_s,
            "drain_s": drain_s,
            "gpu_held_by": held,
            "orphans": orphans,
            "exit": exit_info,
        }

    def gpu_entries(self):
        if self.gpus.backend == "none":
            return None
        try:
            devices = self.gpus.sample() or []
        except Exception:
            return None
        return {(d["index"], p["pid"]): p for d in devices for p in d["processes"]}

    def wait_drain(self, cmd, pids, before, timeout):
        """Wait until the killed processes' GPU memory is released -> (seconds, still held)."""
        if before is None:
            return None, []
        t0 = time.monotonic()
        ours = set(pids)
        # Entries we cannot map (host pids seen from a container) count as ours if they
        # were there at kill time: wait for them to go too.
        watch = {k for k, p in before.items() if k[1] in ours or not p["local"]}
        next_note = 2.0
        while True:
            now_entries = self.gpu_entries() or {}
            held = sorted({k[1] for k in watch if k in now_entries})
            if not held:
                return time.monotonic() - t0, []
            if time.monotonic() - t0 > timeout:
                return None, held
            if time.monotonic() - t0 > next_note:
                self.progress(cmd, "GPU memory still held by pids %s" % held)
                next_note += 2.0
            time.sleep(0.1)

    def cmd_restart(self, cmd):
        run_id = self.target_run(cmd, need_alive=False)
        run_dir = self.runs.run_dir(run_id)
        launch = read_json(os.path.join(run_dir, "launch.json"))
        config_path = os.path.join(run_dir, "launch-config.toml")
        if launch is None or not os.path.isfile(config_path):
            raise CommandError(
                "run %s was not launched by dflash-tui: nothing to restart from" % run_id
            )
        killed = None
        if self.runs.alive_run() == run_id:
            killed = self.kill(run_id, cmd)
        with open(config_path) as f:
            config_toml = f.read()
        started = self.launch(
            config_toml, launch.get("overrides") or [], launch.get("name") or "run", cmd
        )
        return {"killed": killed, "launched": started}

    # stacks, cache ------------------------------------------------------------------
    def cmd_dump_stacks(self, cmd):
        run_id = self.target_run(cmd, need_alive=False)
        run_dir = self.runs.run_dir(run_id)
        pid, _ = self.runs.process(run_id)
        if not pid_alive(pid):
            raise CommandError("run %s is not running (pid %s)" % (run_id, pid))
        before = set(os.listdir(run_dir))
        os.kill(int(pid), signal.SIGUSR1)
        deadline = time.monotonic() + float(cmd.get("timeout_s", 5))
        path = None
        while time.monotonic() < deadline:
            fresh = sorted(
                n for n in os.listdir(run_dir) if n.startswith("stacks-2") and n not in before
            )
            if fresh:
                candidate = os.path.join(run_dir, fresh[-1])
                if "# faulthandler" in tail_text(candidate, 1 << 22):
                    path = candidate
                    break
            time.sleep(0.05)
        if path is None:
            raise CommandError(
                "no stack dump from pid %s within %.0fs (is the main thread "
                "stuck? try SIGUSR2 or py-spy)" % (pid, float(cmd.get("timeout_s", 5)))
            )
        result = {"run_id": run_id, "pid": pid, "path": path, "text": tail_text(path, 1 << 22)}
        if cmd.get("pyspy") and shutil.which("py-spy"):
            r = subprocess.run(
                ["py-spy", "dump", "--native", "--pid", str(pid)],
                check=False,
                capture_output=True,
                text=True,
                timeout=30,
            )
            result["pyspy"] = r.stdout + r.stderr
        return result

    def compile_cache_dir(self):
        base = os.environ.get("DFLASH_CACHE_DIR")
        if not base:
            xdg = os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache")
            base = os.path.join(xdg, "dflash-tui")
        return os.path.join(base, "compile")

    def cmd_clear_compile_cache(self, cmd):
        alive = self.runs.alive_run()
        if alive:
            raise CommandError("run %s is alive: it uses the compile cache; kill it first" % alive)
        path = self.compile_cache_dir()
        if not os.path.isdir(path):
            return {"path": path, "bytes": 0, "existed": False}
        size = 0
        for root, _dirs, files in os.walk(path):
            for name in files:
                with contextlib.suppress(OSError):
                    size += os.lstat(os.path.join(root, name)).st_size
        shutil.rmtree(path)
        return {"path": path, "bytes": size, "existed": True}

    # deploy -------------------------------------------------------------------------
    def cmd_deploy(self, cmd):
        want = cmd.get("sha256")
        if not isinstance(want, str) or not re.match(r"^[0-9a-f]{64}$", want):
            raise CommandError("deploy needs the sha256 of what it ships")
        blob = base64.b64decode(cmd.get("tar_b64") or "")
        releases = os.path.join(self.remote_dir, "releases")
        os.makedirs(releases, exist_ok=True)
        tmp = os.path.join(releases, ".incoming-%s" % secrets.token_hex(4))
        os.mkdir(tmp)
        try:
            with tarfile.open(fileobj=io.BytesIO(blob), mode="r:*") as tar:
                safe_extract(tar, tmp)
            got = code_hash_of(os.path.join(tmp, "trainer"))
            if got != want:
                raise CommandError("deploy: shipped code hashes to %s, expected %s" % (got, want))
            final = os.path.join(releases, want[:16])
            if os.path.isdir(final):
                shutil.rmtree(tmp)
            else:
                os.rename(tmp, final)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        link_tmp = os.path.join(self.remote_dir, ".current-%s" % secrets.token_hex(4))
        os.symlink(os.path.join("releases", want[:16]), link_tmp)
        os.replace(link_tmp, os.path.join(self.remote_dir, "current"))  # atomic switch
        record = {"sha256": want, "release": final, "at": time.time(), "bytes": len(blob)}
        write_json_atomic(os.path.join(self.remote_dir, "deployed.json"), record)
        return record


def phase_durations(hb):
    """{phase: seconds} of each phase's first visit, from the heartbeat's history: what the
    monitor compares a slow phase against ("compile took 4m12s last time")."""
    history = hb.get("phase_history") or []
    out = {}
    ends = [h.get("started_at") for h in history[1:]] + [hb.get("now")]
    for h, end in zip(history, ends):  # noqa: B905 (equal lengths; strict= needs 3.10)
        start = h.get("started_at")
        name = h.get("phase")
        if name not in out and isinstance(start, (int, float)) and isinstance(end, (int, float)):
            out[name] = max(0.0, end - start)
    return out


def role_memory(hb):
    """{role: largest peak bytes over that role's devices}: a healthy run's memory per role."""
    peaks: dict[str, Any] = {}
    for dev, mem in (hb.get("memory") or {}).items():
        if isinstance(mem, dict):
            peaks[dev] = mem.get("peak") or mem.get("reserved") or 0
    out: dict[str, Any] = {}
    for t in hb.get("threads") or []:
        dev = t.get("device")
        if dev in peaks and t.get("role") in ("target", "drafter"):
            out[t["role"]] = max(out.get(t["role"], 0), peaks[dev])
    return out


def safe_extract(tar, dest):
    """Extract regular files and folders only, never outside `dest`."""
    root = os.path.realpath(dest)
    for member in tar.getmembers():
        target = os.path.realpath(os.path.join(dest, member.name))
        if not (target == root or target.startswith(root + os.sep)):
            raise CommandError("deploy: unsafe path in archive: %r" % member.name)
        if member.isdir():
            os.makedirs(target, exist_ok=True)
        elif member.isfile():
            os.makedirs(os.path.dirname(target), exist_ok=True)
            src = tar.extractfile(member)
            with open(target, "wb") as f:
                shutil.copyfileobj(src, f)
            os.chmod(target, 0o644 | (member.mode & 0o111))
        else:
            raise CommandError("deploy: only files and folders allowed, got %r" % member.name)


def code_hash_of(trainer_dir):
    """The trainer's own definition of its code hash (trainer/contract.py, stdlib only)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "_dflash_contract", os.path.join(trainer_dir, "contract", "codehash.py")
    )
    if spec is None or spec.loader is None:
        raise CommandError("deploy: no trainer/contract.py in the archive")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.code_hash(trainer_dir)


def describe_exit(info):
    if info.get("error"):
        return info["error"]
    if info.get("signal"):
        return "killed by %s" % info["signal"]
    return "exit code %s" % info.get("exit_code")


# -- wrap: the detached parent of one trainer run ------------------------------------------
def wrap(args):
    """Start the trainer in its own process group, wait, write exit.json.

    Runs detached (its own session), so the run survives the agent and the SSH connection.
    Its stdout is launch.log; the trainer's stdout/stderr go to train.log."""
    run_dir = args.run_dir
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        # A handler, not SIG_IGN: an ignored signal would stay ignored in the trainer.
        signal.signal(sig, lambda *_: None)
    argv = args.argv[1:] if args.argv and args.argv[0] == "--" else args.argv
    print(
        "%s wrapper pid %d: %s" % (time.strftime("%H:%M:%S"), os.getpid(), " ".join(argv)),
        flush=True,
    )
    launch_path = os.path.join(run_dir, "launch.json")
    record = read_json(launch_path, {}) or {}
    started = time.time()
    try:
        with open(os.path.join(run_dir, "train.log"), "ab") as log:
            child = subprocess.Popen(
                argv,
                cwd=args.cwd,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                pass_fds=(args.lock_fd,) if args.lock_fd >= 0 else (),
            )
    except OSError as e:
        print("could not start the trainer: %s" % e, flush=True)
        write_json_atomic(
            os.path.join(run_dir, "exit.json"),
            {
                "run_id": os.path.basename(run_dir),
                "exit_code": 127,
                "signal": None,
                "error": "could not start %s: %s" % (argv[0], e),
                "started_at": started,
                "ended_at": time.time(),
                "final_phase": None,
            },
        )
        return 127
    if args.lock_fd >= 0:
        os.close(args.lock_fd)  # the trainer holds the lock too, for as long as it lives
    record.update(pid=child.pid, pgid=child.pid, wrapper_pid=os.getpid(), started_at=started)
    write_json_atomic(launch_path, record)
    code = child.wait()
    hb = read_json(os.path.join(run_dir, "heartbeat.json"), {}) or {}
    info = {
        "run_id": os.path.basename(run_dir),
        "exit_code": code if code >= 0 else None,
        "signal": signal.Signals(-code).name if code < 0 else None,
        "started_at": started,
        "ended_at": time.time(),
        "final_phase": hb.get("phase"),
        "step": hb.get("step"),
        "error": (hb.get("error") or {}).get("message"),
    }
    write_json_atomic(os.path.join(run_dir, "exit.json"), info)
    print("%s trainer exited: %s" % (time.strftime("%H:%M:%S"), describe_exit(info)), flush=True)
    return 0


def parse_args(argv):
    p = argparse.ArgumentParser(prog="dflash_agent")
    sub = p.add_subparsers(dest="mode")
    w = sub.add_parser("wrap")
    w.add_argument("--run-dir", required=True)
    w.add_argument("--lock-fd", type=int, default=-1)
    w.add_argument("--cwd", default=None)
    w.add_argument("argv", nargs=argparse.REMAINDER)
    p.add_argument("--run-root", default="~/dflash/runs")
    p.add_argument("--remote-dir", default="~/dflash")
    p.add_argument("--python", default=None, help="interpreter for launched trainers")
    p.add_argument("--gpu-interval", type=float, default=1.0)
    p.add_argument(
        "--poll-interval",
        type=float,
        default=0.01,
        help="file poll period when inotify is not available",
    )
    p.add_argument("--no-inotify", action="store_true", help="poll instead (for tests)")
    p.add_argument("--tail-bytes", type=int, default=TAIL_BYTES)
    return p.parse_args(argv)


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    if args.mode == "wrap":
        return wrap(args)
    out = Out()
    with contextlib.suppress(KeyboardInterrupt):
        Agent(args, out).run()
    return 0


if __name__ == "__main__":
    sys.exit(main())

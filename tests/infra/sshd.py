"""A real OpenSSH sshd on 127.0.0.1, owned by one test.

Everything lives in one directory: host key, client key pair, authorized_keys, sshd_config,
client-side known_hosts/ssh_config and the server log. Nothing outside it is read or written,
except /run/sshd: sshd run as root insists on it (privilege separation), so we create it.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import os
import pwd
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from types import TracebackType

SSHD = "/usr/sbin/sshd"
PRIVSEP_DIR = Path("/run/sshd")
HOST_ALIAS = "gpu-box"


def _die_with_us() -> list[str]:
    """argv prefix that SIGTERMs sshd if the test process is killed before stop() runs.

    The parent-death signal fires when the forking *thread* ends, so it is only used from
    the main thread (where fixtures run). setpriv (util-linux) sets it and execs in place,
    so the pid stays sshd's; preexec_fn would do the same but is unsafe next to threads.
    """
    setpriv = _setpriv_with_pdeathsig()
    if setpriv is None or threading.current_thread() is not threading.main_thread():
        return []
    return [setpriv, "--pdeathsig", "TERM", "--"]


@functools.cache
def _setpriv_with_pdeathsig() -> str | None:
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        return None
    usage = subprocess.run([setpriv, "--help"], capture_output=True, text=True).stdout
    return setpriv if "--pdeathsig" in usage else None  # util-linux >= 2.33


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def keygen(path: Path, comment: str) -> str:
    """A fresh ed25519 key pair at path/path.pub; returns the public key line."""
    subprocess.run(
        ["ssh-keygen", "-q", "-N", "", "-t", "ed25519", "-C", comment, "-f", str(path)],
        check=True,
        capture_output=True,
    )
    return path.with_name(path.name + ".pub").read_text().strip()


def _stat_fields(pid: int) -> list[str] | None:
    """/proc/PID/stat after the comm field (which may hold spaces): [state, ppid, ...]."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return raw[raw.rindex(")") + 2 :].split()


def _children_map() -> dict[int, list[int]]:
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            fields = _stat_fields(int(entry))
            if fields is not None:
                children.setdefault(int(fields[1]), []).append(int(entry))
    return children


def _descendants(pid: int, children: Mapping[int, list[int]]) -> list[int]:
    out: list[int] = []
    todo = list(children.get(pid, []))
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(children.get(p, []))
    return out


def _alive(pid: int) -> bool:
    """Running, not a zombie: a killed grandchild may sit unreaped under a lazy PID 1."""
    fields = _stat_fields(pid)
    return fields is not None and fields[0] != "Z"


def _comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


@functools.cache
def _sshd_version(sshd: str) -> tuple[int, int]:
    # `sshd -V` is not an option before 9.x: it prints usage plus the version to stderr.
    out = subprocess.run([sshd, "-V"], capture_output=True, text=True)
    m = re.search(r"OpenSSH_(\d+)\.(\d+)", out.stdout + out.stderr)
    return (int(m.group(1)), int(m.group(2))) if m else (0, 0)


def _quote_config(value: str) -> str:
    """One sshd_config/ssh_config argument: quoted, with sshd's argv_split escapes."""
    if any(c in value for c in "\n\r\0"):
        raise ValueError(f"config values cannot hold line breaks or NUL: {value!r}")
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


class SshServer:
    """A real `sshd -D` on 127.0.0.1:<free port> for the current user, with fresh keys.

    env: variables every session gets (sshd's SetEnv; they override sshd's own defaults,
    PATH included, but the user's shell rc files still run after and may prepend to PATH).
    Clients may only send LANG/LC_* (AcceptEnv), as on a stock Debian/Proxmox host.
    """

    host = "127.0.0.1"

    def __init__(
        self,
        env: Mapping[str, str] | None = None,
        *,
        workdir: Path | None = None,
        sshd: str = SSHD,
        start_timeout: float = 10.0,
    ) -> None:
        for key in env or {}:
            if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key):
                raise ValueError(f"bad environment variable name: {key!r}")
        self.env = dict(env or {})
        self.sshd = sshd
        self.start_timeout = start_timeout
        self._own_dir = workdir is None
        self.dir = Path(workdir or tempfile.mkdtemp(prefix="dflash-sshd-")).resolve()
        self.dir.mkdir(parents=True, exist_ok=True)
        self.user = pwd.getpwuid(os.getuid()).pw_name
        self.port = 0
        self.proc: subprocess.Popen[bytes] | None = None
        self.log_path = self.dir / "sshd.log"
        self.config_path = self.dir / "sshd_config"
        self.host_key = self.dir / "host_ed25519"
        self.client_key = self.dir / "client_ed25519"
        self.authorized_keys = self.dir / "authorized_keys"
        self.known_hosts = self.dir / "known_hosts"
        self.wrong_known_hosts = self.dir / "wrong_known_hosts"
        self.ssh_config = self.dir / "ssh_config"
        self.start_seconds = 0.0  # how long the last start() took, keys excluded

        self.host_key_pub = keygen(self.host_key, "dflash-test-host")
        self.client_key_pub = keygen(self.client_key, "dflash-test-client")
        # Only the public half of the impostor key is needed; it never serves anything.
        self._wrong_key_pub = keygen(self.dir / "impostor_ed25519", "impostor")
        self.authorized_keys.write_text(self.client_key_pub + "\n")

    # --- files -------------------------------------------------------------------------

    def _write_files(self) -> None:
        q = _quote_config
        lines = [
            "ListenAddress 127.0.0.1",
            f"Port {self.port}",
            f"HostKey {q(str(self.host_key))}",
            f"AuthorizedKeysFile {q(str(self.authorized_keys))}",
            "PasswordAuthentication no",
            "KbdInteractiveAuthentication no",
            "PubkeyAuthentication yes",
            "PermitRootLogin prohibit-password",
            # The keys live in a pytest tmp dir whose modes we do not control.
            "StrictModes no",
            # PAM needs root and a service file; key auth works without it.
            "UsePAM no",
            f"PidFile {q(str(self.dir / 'sshd.pid'))}",
            "Subsystem sftp internal-sftp",
            "LogLevel VERBOSE",
            "MaxStartups 100",
            "MaxSessions 100",
            "AcceptEnv LANG LC_*",
            "PrintMotd no",
        ]
        if _sshd_version(self.sshd) >= (9, 8):
            # 9.8+ would lock 127.0.0.1 out after tests that fail auth or kill sessions.
            lines.append("PerSourcePenalties no")
        if self.env:
            # One line: sshd silently ignores every SetEnv line after the first.
            lines.append("SetEnv " + " ".join(q(f"{k}={v}") for k, v in self.env.items()))
        self.config_path.write_text("\n".join(lines) + "\n")

        self.known_hosts.write_text(self._known_hosts_line(self.port, self.host_key_pub))
        self.wrong_known_hosts.write_text(self._known_hosts_line(self.port, self._wrong_key_pub))
        self.ssh_config.write_text(self._ssh_config_text(HOST_ALIAS, self.port, self.known_hosts))

    def _known_hosts_line(self, port: int, key_line: str, host: str | None = None) -> str:
        key_type, key_b64 = key_line.split()[:2]
        return f"[{host or self.host}]:{port} {key_type} {key_b64}\n"

    def _ssh_config_text(self, alias: str, port: int, known_hosts: Path) -> str:
        q = _quote_config
        return (
            f"Host {alias}\n"
            f"    HostName {self.host}\n"
            f"    Port {port}\n"
            f"    User {self.user}\n"
            f"    IdentityFile {q(str(self.client_key))}\n"
            "    IdentitiesOnly yes\n"
            f"    UserKnownHostsFile {q(str(known_hosts))}\n"
            # Hermetic: no ~/.ssh or /etc/ssh state leaks into the test.
            "    GlobalKnownHostsFile /dev/null\n"
            "    StrictHostKeyChecking yes\n"
            "    UpdateHostKeys no\n"
            "    PasswordAuthentication no\n"
            "    KbdInteractiveAuthentication no\n"
        )

    def known_hosts_for(self, port: int, host: str = "127.0.0.1") -> Path:
        """known_hosts trusting this server's key at host:port, e.g. a TcpProxy in front of it."""
        path = self.dir / f"known_hosts-{host}-{port}"
        path.write_text(self._known_hosts_line(port, self.host_key_pub, host))
        return path

    def ssh_config_for(self, port: int, alias: str = HOST_ALIAS) -> Path:
        """An ssh_config like .ssh_config whose `alias` reaches this server via 127.0.0.1:port."""
        path = self.dir / f"ssh_config-{alias}-{port}"
        path.write_text(self._ssh_config_text(alias, port, self.known_hosts_for(port)))
        return path

    # --- lifecycle -----------------------------------------------------------------------

    def start(self) -> SshServer:
        if self.proc is not None and self.proc.poll() is None:
            return self
        atexit.register(self.stop)  # never outlive the test run, even if stop() is forgotten
        if os.geteuid() == 0 and not PRIVSEP_DIR.is_dir():
            # sshd refuses to start without it; the package creates it only at boot.
            PRIVSEP_DIR.mkdir(mode=0o755, parents=True, exist_ok=True)
        last_error = ""
        for _attempt in range(5):
            self.port = free_port()
            self._write_files()
            error = self._launch()
            if error is None:
                return self
            last_error = error
            # Only a lost race for the port (taken between probe and bind) is worth a retry.
            if "Address already in use" not in error:
                break
        raise RuntimeError(f"sshd did not start:\n{last_error}")

    def _launch(self) -> str | None:
        """Start sshd once; None when it listens, else the reason with its log."""
        t0 = time.monotonic()
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                [*_die_with_us(), self.sshd, "-D", "-e", "-f", str(self.config_path)],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
            )
        deadline = t0 + self.start_timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                return f"sshd exited with {self.proc.returncode}:\n{self.log_path.read_text()}"
            try:
                socket.create_connection((self.host, self.port), timeout=0.2).close()
            except OSError:
                time.sleep(0.01)
                continue
            self.start_seconds = time.monotonic() - t0
            # The probe itself spawned a connection child; let it go so that
            # connections() starts out empty.
            self._wait_gone(self.connections(), 2.0)
            return None
        self._terminate()
        return f"sshd not listening after {self.start_timeout}s:\n{self.log_path.read_text()}"

    def stop(self) -> None:
        if self.proc is not None:
            # The listener does not take its connections down with it; do that first.
            self.kill_connections()
            self._terminate()
            self.proc = None
        atexit.unregister(self.stop)
        if self._own_dir:
            shutil.rmtree(self.dir, ignore_errors=True)

    def _terminate(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.terminate()
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()

    def __enter__(self) -> SshServer:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    # --- connections ---------------------------------------------------------------------

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    def connections(self) -> list[int]:
        """Pids of the per-connection sshd processes (the listener's children), one each."""
        if self.proc is None or self.proc.poll() is not None:
            return []
        return sorted(
            p for p in _children_map().get(self.proc.pid, []) if _alive(p) and self._is_sshd(p)
        )

    @staticmethod
    def _is_sshd(pid: int) -> bool:
        # "sshd", or "sshd-session"/"sshd-auth" from OpenSSH 9.8 on.
        return _comm(pid).startswith("sshd")

    def kill_connections(self) -> list[int]:
        """SIGKILL every per-connection sshd process: all live SSH connections drop at once.

        Only sshd processes die (monitor and its privsep child); the commands the sessions
        ran are left alone, as when sshd crashes for real. Returns the pids killed.
        """
        if self.proc is None:
            return []
        children = _children_map()
        victims = [
            p
            for conn in self.connections()
            for p in (conn, *_descendants(conn, children))
            if self._is_sshd(p)
        ]
        for p in victims:
            with contextlib.suppress(ProcessLookupError):
                os.kill(p, signal.SIGKILL)
        self._wait_gone(victims, 5.0)
        return victims

    @staticmethod
    def _wait_gone(pids: Iterable[int], timeout: float) -> None:
        pending = list(pids)
        deadline = time.monotonic() + timeout
        while pending and time.monotonic() < deadline:
            pending = [p for p in pending if _alive(p)]
            if pending:
                time.sleep(0.01)

    def log(self) -> str:
        try:
            return self.log_path.read_text()
        except FileNotFoundError:
            return ""

    def ssh_argv(self, *remote: str, options: Mapping[str, str] | None = None) -> list[str]:
        """argv for the system ssh client to run `remote` here, non-interactively.

        options: extra -o settings; they win over the ssh_config file's.
        """
        opts = {"BatchMode": "yes", **(options or {})}
        flags = [f for k, v in opts.items() for f in ("-o", f"{k}={v}")]
        return ["ssh", "-F", str(self.ssh_config), *flags, HOST_ALIAS, "--", *remote]

    def __repr__(self) -> str:
        return f"SshServer({self.user}@{self.host}:{self.port}, dir={self.dir})"

"""A threaded TCP forwarder between a client and a real server, for breaking the network.

client <-> 127.0.0.1:proxy.port <-> target_host:target_port

- drop_all(): every live connection is cut on both legs at once (RST, as from a NAT box or a
  rebooted router). The peers see "connection reset"/EOF immediately. New connections
  still work afterwards.
- refuse(True): the listening socket is closed, so connects get ECONNREFUSED, exactly
  like a host whose sshd is down. refuse(False) listens again on the same port. Live
  connections are untouched. (Accept-then-close was rejected: clients then see a
  confusing handshake error instead of a refusal.)
- stall(True): bytes stop moving in both directions but every socket stays open, like a
  silent partition; only keepalives/timeouts notice. stall(False) lets the held data through.
"""

from __future__ import annotations

import contextlib
import socket
import struct
import threading
from types import TracebackType

_CHUNK = 65536


def _nodelay(sock: socket.socket) -> None:
    # SSH sends many small packets; Nagle would add up to 40 ms to each round trip.
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


def _abort(sock: socket.socket) -> None:
    """Close with RST, waking any thread blocked in recv() on it."""
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    # shutdown() is what wakes a recv() blocked in another thread; close() alone does not.
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)
    sock.close()


class _Link:
    """One proxied connection: two sockets, one pump thread per direction."""

    def __init__(self, proxy: TcpProxy, client: socket.socket, upstream: socket.socket) -> None:
        self.proxy = proxy
        self.client = client
        self.upstream = upstream
        self._lock = threading.Lock()
        self._open_directions = 2
        self._closed = False

    def start(self) -> None:
        for src, dst in ((self.client, self.upstream), (self.upstream, self.client)):
            threading.Thread(target=self._pump, args=(src, dst), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while True:
                data = src.recv(_CHUNK)
                if not data:
                    # Orderly half-close: pass the FIN on, keep the other direction going.
                    with contextlib.suppress(OSError):
                        dst.shutdown(socket.SHUT_WR)
                    break
                self.proxy._flowing.wait()
                if self._closed:
                    break
                dst.sendall(data)
        except OSError:
            self.abort()  # a reset on one leg is a reset on both
            return
        with self._lock:
            self._open_directions -= 1
            done = self._open_directions == 0
        if done:
            self.close()

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
        for sock in (self.client, self.upstream):
            with contextlib.suppress(OSError):
                sock.close()
        self.proxy._forget(self)

    def abort(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
        _abort(self.client)
        _abort(self.upstream)
        self.proxy._forget(self)


class TcpProxy:
    """Forward 127.0.0.1:<free port> to target_host:target_port; see the module docstring."""

    host = "127.0.0.1"

    def __init__(self, target_host: str, target_port: int, *, port: int = 0) -> None:
        self.target = (target_host, target_port)
        self.connections_made = 0  # client connections accepted and forwarded
        self._lock = threading.Lock()
        self._links: set[_Link] = set()
        self._flowing = threading.Event()
        self._flowing.set()
        self._listener: socket.socket | None = None
        self._acceptor: threading.Thread | None = None
        self._closed = False
        self.port = port
        self._listen()

    # --- listening -----------------------------------------------------------------------

    def _listen(self) -> None:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        # Rebinding the same port after refuse(False) must not trip over TIME_WAIT.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((self.host, self.port))
        sock.listen(128)
        # A short accept timeout lets the thread notice that refuse()/close() took its socket.
        sock.settimeout(0.05)
        self.port = sock.getsockname()[1]
        self._listener = sock
        self._acceptor = threading.Thread(target=self._accept_loop, args=(sock,), daemon=True)
        self._acceptor.start()

    def _unlisten(self) -> None:
        sock, thread = self._listener, self._acceptor
        self._listener = self._acceptor = None
        if sock is not None:
            # Connections still in the backlog get a reset, like a port nobody listens on.
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()
        if thread is not None:
            thread.join(timeout=2)

    def _accept_loop(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except TimeoutError:
                if self._listener is not listener:
                    return
                continue
            except OSError:
                return  # listener closed by refuse() or close()
            client.settimeout(None)
            try:
                upstream = socket.create_connection(self.target, timeout=5)
                upstream.settimeout(None)
            except OSError:
                _abort(client)  # target down: the client sees its connection reset
                continue
            _nodelay(client)
            _nodelay(upstream)
            link = _Link(self, client, upstream)
            with self._lock:
                self.connections_made += 1
                self._links.add(link)
            link.start()  # only once registered, so a quick close can unregister it

    def _forget(self, link: _Link) -> None:
        with self._lock:
            self._links.discard(link)

    # --- controls ------------------------------------------------------------------------

    @property
    def live(self) -> int:
        """How many proxied connections are open now."""
        with self._lock:
            return len(self._links)

    def drop_all(self) -> int:
        """Cut every live connection on both legs (RST); returns how many were cut."""
        with self._lock:
            links = list(self._links)
        for link in links:
            link.abort()
        return len(links)

    def refuse(self, on: bool = True) -> None:
        """While on, nothing listens on .port: new connects fail with ECONNREFUSED."""
        if self._closed:
            raise RuntimeError("proxy is closed")
        if on:
            self._unlisten()
        elif self._listener is None:
            self._listen()

    def stall(self, on: bool = True) -> None:
        """While on, no byte is forwarded in either direction; sockets stay open."""
        if on:
            self._flowing.clear()
        else:
            self._flowing.set()

    def close(self) -> None:
        self._closed = True
        self._unlisten()
        self._flowing.set()  # release pumps parked by stall() so they see the abort
        self.drop_all()

    def __enter__(self) -> TcpProxy:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"TcpProxy({self.host}:{self.port} -> {self.target[0]}:{self.target[1]})"

"""A TCP proxy on 127.0.0.1 for tests and benchmarks of what a network does to a client while
the server keeps its data: `delay_ms` before every request (a round trip's latency, for
every process talking to the endpoint, Spark's Python workers too), `drop()` resets every
open connection (a failover, a load balancer's idle cut, a broker restart as the client sees
it), `stall()` holds every byte both ways until `resume()` (a partition, a long pause).

Written here because the fault is needed between one client and one server inside a run:
no library we use forwards TCP with faults on command, and a network namespace or tc/netem
needs privileges a test run does not have.

Each accepted connection gets a connection to the upstream and two threads. The
client->server one sleeps `delay_ms` before the first chunk of a request: a chunk on a new
connection, or after the server has answered (HTTP/1.1 keep-alive without pipelining, as
boto3 sends, puts one request at a time on a connection). So each request waits once,
concurrent requests wait side by side, and a large response streams at full speed.
`delay_ms` may be changed while the proxy runs; it applies to requests that start after.
"""

from __future__ import annotations

import socket
import struct
import threading
import time
from typing import Any
from urllib.parse import urlparse

CHUNK = 1 << 20


class _Connection:
    def __init__(self, client: socket.socket, server: socket.socket) -> None:
        self.sockets = (client, server)
        self.fresh = True  # the client's next chunk starts a request
        self.ended = 0  # directions done (2: close both)


class FaultProxy:
    """Forwards 127.0.0.1:`port` (0: any free port) to `upstream` ("host:port", an http://
    URL, or (host, port)), which need not be listening yet: each accepted connection
    connects to it then. Accepts from construction until `close()`."""

    def __init__(self, upstream: str | tuple[str, int], delay_ms: float = 0.0, port: int = 0) -> None:
        if isinstance(upstream, tuple):
            self.upstream = upstream
        else:
            u = urlparse(upstream if "://" in upstream else f"tcp://{upstream}")
            self.upstream = (u.hostname or "127.0.0.1", u.port or 80)
        self.delay_ms = delay_ms
        self.requests = 0  # requests forwarded (first chunks), for a sanity check
        self._listener = socket.create_server(("127.0.0.1", port), backlog=256)
        self.port: int = self._listener.getsockname()[1]
        self.address = f"127.0.0.1:{self.port}"
        self.url = f"http://{self.address}"
        self._open: set[socket.socket] = set()
        self._lock = threading.Lock()
        self._flowing = threading.Event()
        self._flowing.set()
        self._closed = threading.Event()
        self._cuts: list[tuple[int, str]] = []  # cut(): armed faults, taken by responses in turn
        threading.Thread(target=self._accept, name="fault-proxy-accept", daemon=True).start()

    def drop(self) -> int:
        """Reset every open connection (RST, not FIN: as a peer that vanished); new ones are
        accepted as before. Returns how many connections were reset."""
        with self._lock:
            victims, self._open = list(self._open), set()
        for s in victims:
            _reset(s)
        return len(victims) // 2

    def cut(self, after_bytes: int, how: str = "reset", times: int = 1) -> None:
        """The next `times` responses (bytes from the upstream, each on the connection that
        receives them next) stop after `after_bytes`: their connection is then reset
        ("reset": a body cut short) or holds the rest back forever ("stall": a body that
        stops coming)."""
        if how not in ("reset", "stall"):
            raise ValueError(f"how={how!r}: reset or stall")
        with self._lock:
            self._cuts = [(after_bytes, how)] * times

    @property
    def cuts_left(self) -> int:
        """Faults armed by `cut()` that no response has met yet."""
        with self._lock:
            return len(self._cuts)

    def _take_cut(self) -> tuple[int, str] | None:
        with self._lock:
            return self._cuts.pop(0) if self._cuts else None

    def _end_cut(self, conn: _Connection, how: str) -> None:
        if how == "stall":  # hold: the client waits for bytes that never come, until it gives up
            while not self._closed.is_set() and conn.ended == 0:
                time.sleep(0.05)
            return
        _reset(conn.sockets[0])

    def stall(self) -> None:
        """Hold every byte, both ways, on every connection, until `resume()`."""
        self._flowing.clear()

    def resume(self) -> None:
        self._flowing.set()

    def close(self) -> None:
        self._closed.set()
        self._flowing.set()
        self._listener.close()
        self.drop()

    def __enter__(self) -> FaultProxy:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            try:
                server = socket.create_connection(self.upstream, timeout=10)
            except OSError:
                client.close()
                continue
            server.settimeout(None)
            for s in (client, server):
                s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            conn = _Connection(client, server)
            with self._lock:
                self._open.update(conn.sockets)
            for src, dst, up in ((client, server, True), (server, client, False)):
                threading.Thread(
                    target=self._pump, args=(src, dst, conn, up), name="fault-proxy-pump", daemon=True
                ).start()

    def _pump(self, src: socket.socket, dst: socket.socket, conn: _Connection, upstream: bool) -> None:
        cut: tuple[int, str] | None = None  # this response's: bytes still to pass, then how it ends
        try:
            while True:
                data = src.recv(CHUNK)
                if not data:
                    break
                self._flowing.wait()
                if not upstream:
                    if not conn.fresh:  # the first bytes of a response
                        cut = self._take_cut()
                    conn.fresh = True  # the server is answering: the client's next chunk is a new request
                    if cut is not None:
                        if len(data) >= cut[0]:
                            dst.sendall(data[: cut[0]])
                            self._end_cut(conn, cut[1])
                            return
                        cut = (cut[0] - len(data), cut[1])
                elif conn.fresh:
                    conn.fresh = False
                    self.requests += 1
                    if self.delay_ms > 0:
                        time.sleep(self.delay_ms / 1000)
                dst.sendall(data)
            dst.shutdown(socket.SHUT_WR)  # pass the end on; the other direction may still flow
        except OSError:
            pass  # reset by drop(), or by either side
        finally:
            with self._lock:
                conn.ended += 1
                last = conn.ended == 2
                if last:
                    self._open.difference_update(conn.sockets)
            if last:
                for s in conn.sockets:
                    s.close()


def _reset(s: socket.socket) -> None:
    """End the connection with a RST, as a peer that vanished: with SO_LINGER 0 the close
    resets instead of a FIN that a reader of a body without a length would take for its end.
    close() alone neither wakes a pump blocked in recv() on the socket nor ends the connection
    while that call holds it; shutdown(SHUT_RD) wakes it, without sending anything."""
    try:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        s.shutdown(socket.SHUT_RD)
    except OSError:
        pass
    s.close()


def in_front_of(server: Any) -> tuple[FaultProxy, dict[str, str | None]]:
    """A FaultProxy forwarding to `server` (one of keyfill.testing's store servers: SeaweedFS,
    fake-gcs-server, Azurite), and the server's `env()` with its endpoint replaced by the
    proxy's: clients set up from that environment go through the proxy."""
    u = urlparse(server.endpoint)
    root = f"{u.scheme}://{u.netloc}"
    proxy = FaultProxy(root)
    return proxy, {k: (v.replace(root, proxy.url) if v else v) for k, v in server.env().items()}

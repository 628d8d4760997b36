"""An HTTP proxy on 127.0.0.1 for tests of what an object store's refusals do to a client:
`fail(status, times)` answers the next matching requests itself with a 429 or a 503 (what
every cloud sends daily in bursts), with the store's own error body and an optional
`Retry-After`; `expire_credentials(times)` with the store's own answer to an expired
credential (which no emulator can produce: their keys never expire); `trickle(step,
every_s, times)` forwards a request but sends its answer's body `step` bytes at a time (a
slow or overloaded server); every other request goes on to the server (SeaweedFS,
fake-gcs-server, Azurite) and its answer comes back unchanged.

Written here, on the standard library (`http.server.ThreadingHTTPServer`, `http.client`),
because no maintained library injects faults per request inside a test's process: the HTTP
mocking libraries (responses, moto, vcrpy) replace the server instead of forwarding to it,
toxiproxy is a server of its own that breaks TCP, not HTTP answers, and mitmproxy, which
could script them, brings its own event loop and a large dependency tree for 300 lines.

HTTP/1.1 only, as the SDKs speak it to the emulators: keep-alive connections, request bodies
with a Content-Length (or chunked: forwarded with a length), responses passed on with their
length, chunked or until the server closes. Each client connection gets a thread and its
own connection to the server.

`in_front_of(server)` puts it behind `keyfill.testing.tcp_proxy`'s proxy and hands back that
one's environment: the clients' requests pass the TCP proxy (its faults too: `proxy.tcp`),
then this one, then the server.
"""

from __future__ import annotations

import http.client
import re
import socket
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from email.utils import formatdate
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

from keyfill.testing import tcp_proxy

CHUNK = 1 << 16
STORES = ("s3", "gcs", "azure")
# per connection, not passed on (RFC 9110 section 7.6.1); a request's Expect: 100-continue
# is answered by this side (http.server), so the server gets the body at once
HOP = {"connection", "keep-alive", "proxy-connection", "te", "trailer", "transfer-encoding", "upgrade", "expect"}

Match = Callable[[str, str], bool]  # (method, path without the query, %-decoded) -> whether to answer it


def _object_path(target: str, body: bytes) -> str:
    """A request's path as a `Match` sees it: %-decoded, without the query, but with a GCS
    upload's object name appended (from its `name=` parameter, or a multipart upload's
    metadata part), so an upload matches by its object as a PUT does on S3 and Azure."""
    parts = urlsplit(target)
    path = unquote(parts.path)
    if not path.startswith("/upload/storage/"):
        return path
    name = parse_qs(parts.query).get("name") or re.findall(rb'"name":\s*"([^"]+)"', body[:4096])[:1]
    return f"{path}/{name[0].decode() if isinstance(name[0], bytes) else name[0]}" if name else path


def any_get(method: str, path: str) -> bool:
    return method == "GET"


@dataclass
class _Fault:
    status: int  # answered with this; 0: forwarded, its answer's body trickled (`pace`)
    retry_after: int | None
    match: Match
    left: int
    expired: bool = False  # the store's expired-credential answer, not a throttling one
    pace: tuple[int, float] = (0, 0.0)  # a trickle's bytes per step and seconds between steps


class HttpFaultProxy:
    """Forwards HTTP on 127.0.0.1:`port` (0: any free port) to `upstream` ((host, port) or
    "host:port"), answering the requests armed by `fail()` itself, in `store`'s words ("s3",
    "gcs" or "azure"). Serves from construction until `close()`."""

    def __init__(self, upstream: str | tuple[str, int], store: str = "s3", port: int = 0) -> None:
        if store not in STORES:
            raise ValueError(f"store={store!r}: one of {', '.join(STORES)}")
        if isinstance(upstream, str):
            host, _, number = upstream.rpartition(":")
            upstream = (host or "127.0.0.1", int(number))
        self.upstream = upstream
        self.store = store
        self.forwarded = 0  # requests passed on to the server
        self._failed = 0
        self._faults: list[_Fault] = []
        self._lock = threading.Lock()
        self._open: set[socket.socket] = set()
        self.tcp: tcp_proxy.FaultProxy | None = None  # the TCP proxy in front, from in_front_of()

        class Handler(_Handler):
            proxy = self

        self._server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self._server.daemon_threads = True
        self.port: int = self._server.server_address[1]
        self.address = f"127.0.0.1:{self.port}"
        self.url = f"http://{self.address}"
        threading.Thread(
            target=self._server.serve_forever, args=(0.05,), name="http-fault-proxy", daemon=True
        ).start()  # polls for close() every 50 ms

    def fail(self, status: int, times: int = 1, retry_after: int | None = None, match: Match | None = None) -> None:
        """Answer the next `times` requests that `match` accepts (default: any GET) with
        `status` (429 or 503) and the store's error body, with `Retry-After: <seconds>` when
        given. Armed faults are met in the order they were armed; a request meets one at most."""
        if status not in _REASONS:
            raise ValueError(f"status={status}: one of {', '.join(map(str, _REASONS))}")
        with self._lock:
            self._faults.append(_Fault(status, retry_after, match or any_get, times))

    def expire_credentials(self, times: int = 1, match: Match | None = None) -> None:
        """Answer the next `times` requests that `match` accepts (default: any request) as the
        store answers a credential that has expired: S3 400 `ExpiredToken` (a session token's
        end), GCS 401 `Invalid Credentials` (an OAuth token's), Azure 403
        `AuthenticationFailed` (a SAS's end)."""
        status = _EXPIRED[self.store][0]
        with self._lock:
            self._faults.append(_Fault(status, None, match or _any, times, expired=True))

    def trickle(self, step: int, every_s: float, times: int = 1, match: Match | None = None) -> None:
        """Forward the next `times` requests that `match` accepts (default: any GET), then
        send each answer's headers at once and its body `step` bytes every `every_s`
        seconds: a body slower than a client's read timeout when `every_s` exceeds it, a long
        transfer that never pauses that long otherwise."""
        if step < 1 or every_s <= 0:
            raise ValueError(f"step={step}, every_s={every_s}: at least a byte, every so many seconds")
        with self._lock:
            self._faults.append(_Fault(0, None, match or any_get, times, pace=(step, every_s)))

    def clear(self) -> None:
        """Drop the faults no request has met yet (an outage armed with a large `times` ends)."""
        with self._lock:
            self._faults = []

    @property
    def failed(self) -> int:
        """Requests this proxy answered with a fault (or trickled)."""
        with self._lock:
            return self._failed

    @property
    def faults_left(self) -> int:
        """Faults armed by `fail()` that no request has met yet."""
        with self._lock:
            return sum(f.left for f in self._faults)

    def _take(self, method: str, path: str) -> _Fault | None:
        with self._lock:
            for fault in self._faults:
                if fault.left > 0 and fault.match(method, path):
                    fault.left -= 1
                    self._failed += 1
                    return fault
            return None

    def close(self) -> None:
        if self.tcp is not None:
            self.tcp.close()
        self._server.shutdown()
        self._server.server_close()
        with self._lock:
            victims, self._open = list(self._open), set()
        for s in victims:  # wake handlers waiting on idle keep-alive connections
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def __enter__(self) -> HttpFaultProxy:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def error_body(self, status: int, path: str, expired: bool = False) -> tuple[bytes, dict[str, str]]:
        """The store's error body for `status` on `path` (for an expired credential when
        `expired`), and its headers."""
        request_id = f"keyfill-fault-{time.monotonic_ns():x}"
        if self.store == "gcs":  # the JSON API's error resource
            reason, message = _EXPIRED["gcs"][1:] if expired else _GCS[status]
            body = (
                f'{{"error": {{"code": {status}, "message": "{message}", '
                f'"errors": [{{"message": "{message}", "domain": "global", "reason": "{reason}"'
                + (', "locationType": "header", "location": "Authorization"' if expired else "")
                + "}]}}"
            )
            headers = {"Content-Type": "application/json; charset=UTF-8"}
            if expired:  # as GCS sends with a 401
                headers["WWW-Authenticate"] = 'Bearer realm="https://accounts.google.com/", error="invalid_token"'
            return body.encode(), headers
        code, message = _EXPIRED[self.store][1:] if expired else (_S3 if self.store == "s3" else _AZURE)[status]
        if self.store == "azure":  # as Azure Storage writes it: request id and time on lines of their own
            message = f"{message}\nRequestId:{request_id}\nTime:{time.strftime('%Y-%m-%dT%H:%M:%S.0000000Z')}"
            xml = f"<Error><Code>{code}</Code><Message>{message}</Message></Error>"
            headers = {"x-ms-error-code": code, "x-ms-request-id": request_id}
        else:
            xml = (
                f"<Error><Code>{code}</Code><Message>{message}</Message><Resource>{path}</Resource>"
                f"<RequestId>{request_id}</RequestId></Error>"
            )
            headers = {"x-amz-request-id": request_id}
        return f'<?xml version="1.0" encoding="UTF-8"?>\n{xml}'.encode(), {"Content-Type": "application/xml", **headers}


_REASONS = {429: "Too Many Requests", 503: "Service Unavailable"}  # what fail() answers
_STATUS_LINES = {**_REASONS, 400: "Bad Request", 401: "Unauthorized", 403: "Forbidden"}
# S3's own throttling answer is 503 SlowDown; AWS sends no 429, S3-compatible stores that do
# use codes of their own, which botocore does not know: its retry of them rests on the status
_S3 = {503: ("SlowDown", "Please reduce your request rate."), 429: ("TooManyRequests", "Too many requests.")}
_AZURE = {
    503: ("ServerBusy", "The server is busy."),
    429: ("ServerBusy", "Operations per second is over the account limit."),
}
_GCS = {
    503: ("backendError", "We encountered an internal error. Please try again."),
    429: ("rateLimitExceeded", "The rate of requests to the bucket exceeds the rate limit."),
}
# An expired credential, in each store's words: (status, code or reason, message)
_EXPIRED = {
    "s3": (400, "ExpiredToken", "The provided token has expired."),
    "gcs": (401, "authError", "Invalid Credentials"),
    "azure": (
        403,
        "AuthenticationFailed",
        "Server failed to authenticate the request. Make sure the value of Authorization header is formed "
        "correctly including the signature.",
    ),
}


def _any(method: str, path: str) -> bool:
    return True


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive
    proxy: HttpFaultProxy
    _upstream: http.client.HTTPConnection | None = None

    def setup(self) -> None:
        super().setup()
        with self.proxy._lock:
            self.proxy._open.add(self.connection)

    def finish(self) -> None:
        try:
            super().finish()
        finally:
            with self.proxy._lock:
                self.proxy._open.discard(self.connection)
            if self._upstream is not None:
                self._upstream.close()

    def handle(self) -> None:
        try:
            super().handle()
        except OSError:
            pass  # the client's connection reset (the TCP proxy's drop() or close() too): no one to answer

    def log_message(self, format: str, *args: Any) -> None:
        pass  # quiet: a test's output is its own

    def _body(self) -> bytes:
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            parts = []
            while size := int(self.rfile.readline().split(b";")[0], 16):
                parts.append(self.rfile.read(size))
                self.rfile.readline()
            while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                pass  # trailers
            return b"".join(parts)
        return self.rfile.read(int(self.headers.get("Content-Length") or 0))

    def _handle(self) -> None:
        body = self._body()
        fault = self.proxy._take(self.command, _object_path(self.path, body))
        if fault is not None and fault.status:
            self._answer(fault)
            return
        try:
            response = self._forward(body)
        except (OSError, http.client.HTTPException):
            self.close_connection = True  # the client sees its connection dropped, as without a proxy
            return
        try:
            with response:
                self._relay(response, fault.pace if fault is not None else (CHUNK, 0.0))
        except OSError:  # the client went away mid-answer: this connection's state is lost
            self.close_connection = True
            if self._upstream is not None:
                self._upstream.close()

    do_GET = do_HEAD = do_PUT = do_POST = do_DELETE = do_PATCH = do_OPTIONS = _handle

    def _answer(self, fault: _Fault) -> None:
        body, headers = self.proxy.error_body(fault.status, urlsplit(self.path).path, fault.expired)
        self.send_response_only(fault.status, _STATUS_LINES[fault.status])
        for name, value in headers.items():
            self.send_header(name, value)
        if fault.retry_after is not None:
            self.send_header("Retry-After", str(fault.retry_after))
        self.send_header("Date", formatdate(usegmt=True))
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _forward(self, body: bytes) -> http.client.HTTPResponse:
        """Send the request on the handler's connection to the server; a kept-alive one the
        server has closed meanwhile is opened again once."""
        for attempt in (1, 2):
            if self._upstream is None:
                self._upstream = http.client.HTTPConnection(*self.proxy.upstream, timeout=None)
            fresh = self._upstream.sock is None
            try:
                self._upstream.putrequest(self.command, self.path, skip_host=True, skip_accept_encoding=True)
                for name, value in self.headers.items():
                    if name.lower() not in HOP and name.lower() != "content-length":
                        self._upstream.putheader(name, value)
                if body or self.command in ("PUT", "POST", "PATCH") or "Content-Length" in self.headers:
                    self._upstream.putheader("Content-Length", str(len(body)))
                self._upstream.endheaders(body or None)
                response = self._upstream.getresponse()
                with self.proxy._lock:
                    self.proxy.forwarded += 1
                return response
            except (OSError, http.client.HTTPException):
                self._upstream.close()
                if fresh or attempt == 2:
                    raise
        raise AssertionError("unreachable")

    def _relay(self, response: http.client.HTTPResponse, pace: tuple[int, float]) -> None:
        """Pass the server's answer on; its body `pace[0]` bytes at a time, `pace[1]` seconds
        apart (a trickle's; else as fast as it comes)."""
        step, every_s = pace

        def body() -> Iterator[bytes]:
            while data := response.read(step):
                yield data
                if every_s:  # the handler's writes are unbuffered: this step is on its way
                    time.sleep(every_s)

        self.send_response_only(response.status, response.reason)
        for name, value in response.getheaders():
            if name.lower() not in HOP:
                self.send_header(name, value)
        bodiless = self.command == "HEAD" or response.status in (204, 304) or response.status < 200
        if bodiless or not response.chunked and response.length is not None:
            self.end_headers()  # the server's Content-Length, passed on
            for data in () if bodiless else body():
                self.wfile.write(data)
            return
        if not response.chunked:  # a body that ends when the server closes: so does this one
            self.close_connection = True
            self.end_headers()
            for data in body():
                self.wfile.write(data)
            return
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        for data in body():
            self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
        self.wfile.write(b"0\r\n\r\n")


def in_front_of(server: Any) -> tuple[HttpFaultProxy, dict[str, str | None]]:
    """An HttpFaultProxy forwarding to `server` (one of keyfill.testing's store servers:
    SeaweedFS, fake-gcs-server, Azurite), and the environment that routes the store's SDK
    through it: `tcp_proxy.in_front_of(server)`'s, whose TCP proxy (`proxy.tcp`, closed with
    this one) forwards to this one. The store's dialect follows from that environment."""
    tcp, env = tcp_proxy.in_front_of(server)
    store = next((s for s, var in _STORE_VARS.items() if env.get(var)), None)
    if store is None:
        tcp.close()
        raise ValueError(f"{server!r}: not an S3, GCS or Azure server (none of {', '.join(_STORE_VARS.values())})")
    proxy = HttpFaultProxy(tcp.upstream, store)
    tcp.upstream = ("127.0.0.1", proxy.port)  # read at each connection: none has been made yet
    proxy.tcp = tcp
    return proxy, env


_STORE_VARS = {"s3": "AWS_ENDPOINT_URL", "gcs": "STORAGE_EMULATOR_HOST", "azure": "AZURE_STORAGE_CONNECTION_STRING"}

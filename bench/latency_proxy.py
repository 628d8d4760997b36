"""A TCP proxy on 127.0.0.1 that adds a fixed delay to every request it forwards: object-store
latency that reaches every process talking to the endpoint (Spark's Python workers too, which
a botocore hook in the driver never sees).

    python -m bench.latency_proxy --check    # SeaweedFS behind the proxy: median GET at 0, 30, 100 ms

Each accepted connection gets a connection to the upstream and two threads. The
client->server one sleeps `delay_ms` before forwarding the first chunk of a request: a chunk
that arrives on a new connection or after the server has answered (HTTP/1.1 keep-alive
without pipelining, as boto3 sends, puts one request at a time on a connection). The
server->client one forwards as bytes come. So each request on each connection waits once,
concurrent requests wait side by side, and a large response streams at full speed.
`delay_ms` may be changed while the proxy runs; it applies to requests that start after.
"""

from __future__ import annotations

import argparse
import socket
import statistics
import threading
import time
from urllib.parse import urlparse

CHUNK = 1 << 20


class LatencyProxy:
    """Forwards 127.0.0.1:`port` (0: any free port) to `upstream` ("host:port" or an
    http:// URL), sleeping `delay_ms` before each request."""

    def __init__(self, upstream: str, delay_ms: float = 0.0, port: int = 0) -> None:
        u = urlparse(upstream if "://" in upstream else f"tcp://{upstream}")
        self.upstream = (u.hostname or "127.0.0.1", u.port or 80)
        self.delay_ms = delay_ms
        self._listener = socket.create_server(("127.0.0.1", port), backlog=256)
        self.port = self._listener.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self._closed = threading.Event()
        self._conns: set[socket.socket] = set()
        self._lock = threading.Lock()
        self.requests = 0  # requests delayed (first chunks forwarded), for a sanity check

    def start(self) -> LatencyProxy:
        threading.Thread(target=self._accept, name="latency-proxy-accept", daemon=True).start()
        return self

    def stop(self) -> None:
        self._closed.set()
        self._listener.close()
        with self._lock:
            conns, self._conns = list(self._conns), set()
        for s in conns:
            _close(s)

    def __enter__(self) -> LatencyProxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            try:
                server = socket.create_connection(self.upstream, timeout=10)
            except OSError:
                _close(client)
                continue
            server.settimeout(None)
            for s in (client, server):
                s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            with self._lock:
                self._conns.update((client, server))
            fresh = [True]  # the next client chunk starts a request
            done = [0]

            def finish(client=client, server=server, done=done) -> None:
                with self._lock:
                    done[0] += 1
                    last = done[0] == 2
                    if last:
                        self._conns.difference_update((client, server))
                if last:
                    _close(client)
                    _close(server)

            threading.Thread(
                target=self._upstream, args=(client, server, fresh, finish), name="latency-proxy-c2s", daemon=True
            ).start()
            threading.Thread(
                target=self._downstream, args=(server, client, fresh, finish), name="latency-proxy-s2c", daemon=True
            ).start()

    def _upstream(self, src: socket.socket, dst: socket.socket, fresh: list[bool], finish) -> None:
        def before(_: bytes) -> None:
            if fresh[0]:  # the first chunk of a request: wait before it goes on
                fresh[0] = False
                self.requests += 1
                if self.delay_ms > 0:
                    time.sleep(self.delay_ms / 1000)

        _pump(src, dst, before, finish)

    def _downstream(self, src: socket.socket, dst: socket.socket, fresh: list[bool], finish) -> None:
        def before(_: bytes) -> None:
            fresh[0] = True  # the server is answering: the client's next chunk is a new request

        _pump(src, dst, before, finish)


def _pump(src: socket.socket, dst: socket.socket, before, finish) -> None:
    """Copy src to dst until src closes, calling `before(chunk)` ahead of each chunk."""
    try:
        while True:
            data = src.recv(CHUNK)
            if not data:
                break
            before(data)
            dst.sendall(data)
        dst.shutdown(socket.SHUT_WR)
    except OSError:
        pass
    finally:
        finish()


def _close(s: socket.socket) -> None:
    try:
        s.close()
    except OSError:
        pass


def median_get_ms(endpoint: str, bucket: str, key: str, n: int = 20) -> float:
    """Median wall time of `n` GETs of `key` through `endpoint`, in ms (one keep-alive
    connection; a first GET, not timed, opens it)."""
    import boto3

    from keyfill.testing.s3server import ACCESS_KEY, REGION, SECRET_KEY

    client = boto3.client(
        "s3",
        endpoint_url=endpoint,
        region_name=REGION,
        aws_access_key_id=ACCESS_KEY,
        aws_secret_access_key=SECRET_KEY,
    )
    client.get_object(Bucket=bucket, Key=key)["Body"].read()
    times = []
    for _ in range(n):
        t = time.perf_counter()
        client.get_object(Bucket=bucket, Key=key)["Body"].read()
        times.append((time.perf_counter() - t) * 1000)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--check", action="store_true", help="start SeaweedFS and time GETs through the proxy")
    ap.add_argument("--upstream", help="host:port to forward to (without --check)")
    ap.add_argument("--delay-ms", type=float, default=30.0)
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--latencies", default="0,30,100", help="--check: delays to time, ms")
    args = ap.parse_args()
    if not args.check:
        if not args.upstream:
            raise SystemExit("--upstream host:port is needed (or --check)")
        with LatencyProxy(args.upstream, args.delay_ms, args.port) as proxy:
            print(f"{proxy.url} -> {args.upstream}, +{args.delay_ms:g} ms per request; Ctrl-C stops", flush=True)
            try:
                threading.Event().wait()
            except KeyboardInterrupt:
                pass
        return

    from keyfill.testing.s3server import _client, start_seaweedfs

    server = start_seaweedfs("keyfill-latency-proxy")
    try:
        _client(server.endpoint).put_object(Bucket=server.bucket, Key="small", Body=b"x" * 1024)
        print(f"direct:  median GET {median_get_ms(server.endpoint, server.bucket, 'small'):6.1f} ms")
        with LatencyProxy(server.endpoint) as proxy:
            for d in (float(x) for x in args.latencies.split(",")):
                proxy.delay_ms = d
                ms = median_get_ms(proxy.url, server.bucket, "small")
                print(f"+{d:>3.0f} ms: median GET {ms:6.1f} ms through the proxy")
    finally:
        server.stop()


if __name__ == "__main__":
    main()

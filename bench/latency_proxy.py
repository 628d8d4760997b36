"""Object-store latency for the benchmarks: `keyfill.testing.tcp_proxy.FaultProxy` on
127.0.0.1 adds a fixed delay before every request it forwards, which reaches every process
talking to the endpoint (Spark's Python workers too, which a botocore hook in the driver
never sees).

    python -m bench.latency_proxy --check    # SeaweedFS behind the proxy: median GET at 0, 30, 100 ms
"""

from __future__ import annotations

import argparse
import statistics
import threading
import time

from keyfill.testing.tcp_proxy import FaultProxy

# The proxy is the testing kit's: the same delay before each request, and faults on command.
LatencyProxy = FaultProxy


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

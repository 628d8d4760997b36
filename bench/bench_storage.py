"""S3 round-trip figures against a local SeaweedFS, with local disk as the baseline.

    python -m bench.bench_storage [--small N] [--big-mb MB] [--latency-ms MS]

Starts its own SeaweedFS (same helper as the tests), runs each operation on both backends
in one run and prints the ratios: absolute numbers on a shared 2-core box drift between
runs, ratios much less. The last block adds a simulated object-store round trip (a
botocore before-send hook that sleeps) to show what threads buy when GETs wait on the
network rather than the CPU.
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from keyfill.testing.s3server import start_seaweedfs
from keygroups.storage import LocalStorage, S3Storage, Storage, open_storage

KiB, MiB = 1024, 1024 * 1024


def latencies(fn: Callable[[int], object], n: int) -> tuple[float, float]:
    """Median and p95 of n calls, in milliseconds (after a few warm-up calls)."""
    for i in range(min(5, n)):
        fn(i)
    times = []
    for i in range(n):
        t = time.perf_counter()
        fn(i)
        times.append((time.perf_counter() - t) * 1000)
    times.sort()
    return statistics.median(times), times[min(n - 1, int(n * 0.95))]


def rate(fn: Callable[[int], object], n: int, threads: int) -> float:
    """Calls per second for n calls spread over a pool of threads."""
    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(fn, range(min(n, threads))))  # warm connections
        t = time.perf_counter()
        list(pool.map(fn, range(n)))
        return n / (time.perf_counter() - t)


def run(store: Storage, args: argparse.Namespace) -> dict[str, tuple[float, ...]]:
    rng = random.Random(7)
    small = rng.randbytes(4 * KiB)
    mid = rng.randbytes(64 * KiB)
    big = rng.randbytes(args.big_mb * MiB)
    n = args.small
    out: dict[str, tuple[float, ...]] = {}

    out["put"] = latencies(lambda i: store.write(f"small/{i:05d}", small), n)
    out["get"] = latencies(lambda i: store.read(f"small/{i % n:05d}"), n)
    for i in range(4):
        store.write(f"big/{i}", big)
    t = time.perf_counter()
    reads = 12
    for i in range(reads):
        assert len(store.read(f"big/{i % 4}")) == len(big)
    out["big"] = (reads * len(big) / MiB / (time.perf_counter() - t),)
    offsets = [rng.randrange(0, len(big) - 64 * KiB) for _ in range(n)]
    out["range"] = latencies(lambda i: store.read_range(f"big/{i % 4}", offsets[i], 64 * KiB), n)
    for i in range(64):
        store.write(f"mid/{i:03d}", mid)
    get_mid = lambda i: store.read(f"mid/{i % 64:03d}")  # noqa: E731
    out["t1"] = (rate(get_mid, n, 1),)
    out["t16"] = (rate(get_mid, 4 * n, 16),)
    if isinstance(store, LocalStorage):
        # Interleaved, so both see the same disk weather.
        nosync = LocalStorage(store.root, fsync=False)
        both = [store, nosync]
        for i in range(10):  # warm-up, and the folders exist before timing
            both[i % 2].write(f"sync/{i % 2}/warm{i}", small)
        times: list[list[float]] = [[], []]
        for i in range(2 * n):
            t = time.perf_counter()
            both[i % 2].write(f"sync/{i % 2}/{i:05d}", small)
            times[i % 2].append((time.perf_counter() - t) * 1000)
        for name, ts in zip(("put_fsync", "put_nosync"), times):
            ts.sort()
            out[name] = (statistics.median(ts), ts[int(len(ts) * 0.95)])
    return out


def with_latency(store: S3Storage, args: argparse.Namespace) -> dict[str, tuple[float, float]]:
    """GET rates with 1 and 16 threads when every request first waits a simulated RTT."""
    delay = args.latency_ms / 1000

    def sleep(**kwargs: object) -> None:  # returning None lets the real request go on
        time.sleep(delay)

    out = {}
    store.client.meta.events.register("before-send.s3.GetObject", sleep)
    try:
        for label, fmt, count in (("4 KiB", "small/{:05d}", args.small), ("64 KiB", "mid/{:03d}", 64)):
            get = lambda i, fmt=fmt, count=count: store.read(fmt.format(i % count))  # noqa: E731
            out[label] = (rate(get, max(20, args.small // 6), 1), rate(get, 2 * args.small, 16))
    finally:
        store.client.meta.events.unregister("before-send.s3.GetObject", sleep)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--small", type=int, default=300, help="calls per latency figure")
    ap.add_argument("--big-mb", type=int, default=8, help="size of the large objects")
    ap.add_argument("--latency-ms", type=float, default=30.0, help="simulated S3 round trip")
    ap.add_argument("--dir", default=None, help="folder for the local baseline (default: TMPDIR)")
    args = ap.parse_args()

    local_dir = tempfile.mkdtemp(prefix="keyfill-bench-", dir=args.dir)
    server = start_seaweedfs("keyfill-bench")
    server.apply_env()
    try:
        local = open_storage(local_dir)
        s3 = open_storage(f"s3://{server.bucket}/bench", threads=16)
        assert isinstance(s3, S3Storage)
        print(
            f"keyfill storage benchmark: {os.cpu_count()} cores, SeaweedFS at "
            f"{server.endpoint}, local baseline in {local_dir}",
            flush=True,
        )
        lo = run(local, args)
        s3r = run(s3, args)
        lat = with_latency(s3, args)
    finally:
        server.stop()
        shutil.rmtree(local_dir, ignore_errors=True)

    def ms(v: tuple[float, ...]) -> str:
        return f"{v[0]:7.2f} / {v[1]:6.2f}"

    def ratio(a: tuple[float, ...], b: tuple[float, ...], higher_is_better: bool) -> str:
        r = [(x / y if higher_is_better else y / x) if x and y else float("nan") for x, y in zip(a, b)]
        return " / ".join(f"{v:6.1f}x" for v in r)

    rows = [
        ("PUT 4 KiB latency, median / p95 ms", "put", ms, False),
        ("GET 4 KiB latency, median / p95 ms", "get", ms, False),
        (f"GET {args.big_mb} MiB throughput, MB/s", "big", lambda v: f"{v[0]:16.1f}", True),
        (f"ranged GET 64 KiB of {args.big_mb} MiB, median / p95 ms", "range", ms, False),
        ("GET 64 KiB, 1 thread, objects/s", "t1", lambda v: f"{v[0]:16.0f}", True),
        ("GET 64 KiB, 16 threads, objects/s", "t16", lambda v: f"{v[0]:16.0f}", True),
    ]
    print(f"\n{'operation':<46} {'local':>16} {'s3':>16}   {'local is faster by':>18}")
    for label, key, fmt, hib in rows:
        print(f"{label:<46} {fmt(lo[key]):>16} {fmt(s3r[key]):>16}   {ratio(lo[key], s3r[key], hib):>18}")
    print(
        f"{'16 vs 1 thread GET speed-up':<46} {lo['t16'][0] / lo['t1'][0]:15.1f}x {s3r['t16'][0] / s3r['t1'][0]:15.1f}x"
    )
    print(
        f"\nlocal PUT 4 KiB, median / p95 ms, interleaved: with fsync {ms(lo['put_fsync'])}, "
        f"without {ms(lo['put_nosync'])}"
    )
    print(
        f"\nS3 with a {args.latency_ms:.0f} ms simulated round trip (before-send hook), "
        f"GET objects/s (1 thread bound: {1000 / args.latency_ms:.1f}/s):"
    )
    for label, (one, sixteen) in lat.items():
        print(
            f"  {label:>6}: 1 thread {one:7.1f}   16 threads {sixteen:7.1f}   "
            f"speed-up {sixteen / one:5.1f}x (ideal 16x)"
        )


if __name__ == "__main__":
    main()

"""The Spark source's I/O settings on S3 with object-store latency: batch reads of
`format("keyfill")` from a local SeaweedFS behind a latency proxy, at +0, +30 and +100 ms
per request, over a small grid of `readAheadBytes`, `rangeBytes` and `numPartitions`, in one
local[2] Spark session.

    python -m bench.bench_spark_io           # 2M records, 16 groups, ~300 MB (compacted once, cached)
    python -m bench.bench_spark_io --quick   # 600K records, one repetition
    python -m bench.bench_spark_io --replay  # the same sweep for `reader.replay` (threads, read-ahead, GET size)

The latency comes from `bench.latency_proxy` (a TCP proxy on 127.0.0.1 in front of
SeaweedFS's S3 port that waits before forwarding each request), and the Spark session is
started with AWS_ENDPOINT_URL pointing at it, so Spark's Python workers (the driver-side
planner as well as the tasks' reads) inherit it: a botocore hook in the driver would reach
neither. The proxy stays in the path at +0 ms too, so every latency pays its copying. The
archive is uploaded straight to SeaweedFS.

Each point is `spark.read.format("keyfill").options(...).load(url)` written to Spark's noop
sink (every column materialised), timed from `load()` to the end of the job (planning
included), repeated --repeat times (each repeat runs every latency and setting in turn, so a
stretch of load from other processes spreads over all points), best kept. Printed: rows/s
of every setting at every latency, then per latency the defaults' rows/s, the best setting,
and defaults / best, flagged where it is below 0.9.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from bench.latency_proxy import LatencyProxy, median_get_ms

MiB = 1 << 20
FLAG = 0.9  # defaults / best below this is flagged


# numPartitions (None: the default, the session's cores here), readAhead MiB, range MiB
Point = tuple[int | None, int, int]


def settings(args: argparse.Namespace) -> list[tuple[str, dict[str, str], Point]]:
    """(label, options, point): the defaults first, then readAheadBytes x rangeBytes at the
    default numPartitions, then each numPartitions at each readAheadBytes (rangeBytes default;
    every rangeBytes with --full)."""
    ra0, rb0 = default_io()
    out: list[tuple[str, dict[str, str], Point]] = [("defaults", {}, (None, ra0, rb0))]
    seen = {(None, ra0, rb0)}
    for parts in [None, *args.num_partitions]:
        for ra in args.read_ahead_mib:
            for rb in args.range_mib if (parts is None or args.full) else [rb0]:
                if (parts, ra, rb) in seen:
                    continue
                seen.add((parts, ra, rb))
                opts = {"readAheadBytes": str(ra * MiB), "rangeBytes": str(rb * MiB)}
                if parts is not None:
                    opts["numPartitions"] = str(parts)
                out.append((label(parts, ra, rb), opts, (parts, ra, rb)))
    return out


def replay_settings(args: argparse.Namespace) -> list[tuple[str, dict[str, int], Point]]:
    """The replay's grid (--replay): the defaults, then threads x read_ahead_bytes x range_bytes."""
    import reader

    d = reader.ReplayOptions()
    ra0, rb0 = d.read_ahead_bytes // MiB, d.range_bytes // MiB
    out: list[tuple[str, dict[str, int], Point]] = [("defaults", {}, (None, ra0, rb0))]
    for t in args.threads:
        for ra in sorted({ra0, *args.read_ahead_mib}):
            for rb in args.range_mib:
                if (t, ra, rb) != (d.threads, ra0, rb0):
                    opts = {"threads": t, "read_ahead_bytes": ra * MiB, "range_bytes": rb * MiB}
                    out.append((f"threads={t:<3} readAhead={ra:>4} MiB range={rb:>2} MiB", opts, (t, ra, rb)))
    return out


def replay_once(url: str, opts: dict) -> float:
    """Seconds to replay the whole archive (every record taken by the consumer)."""
    import reader

    t = time.perf_counter()
    with reader.replay(url, **opts) as events:
        for _ in events:
            pass
    return time.perf_counter() - t


def default_io() -> tuple[int, int]:
    """The source's default readAheadBytes and rangeBytes, in MiB."""
    from reader.spark.options import Options

    return Options.read_ahead_bytes // MiB, Options.range_bytes // MiB


def ensure_archive(args: argparse.Namespace, spark) -> str:
    """The compacted payments archive (generated and compacted unless the cache has it; as
    `bench.archives.cached_compacted`, with a codec: uncompressed by default, so each record
    moves about as many bytes as a real topic's compressed records, ~160 B)."""
    from compactor.job import CompactConfig, compact
    from keyfill.synth.generate import GeneratorConfig, generate

    tag = f"{args.records}-{args.groups}-{args.slice_duration}-{args.codec}"
    src, dest = os.path.join(args.dir, f"source-{tag}"), os.path.join(args.dir, f"compacted-{tag}")
    if not os.path.exists(os.path.join(dest, "_done")):
        shutil.rmtree(src, ignore_errors=True)
        shutil.rmtree(dest, ignore_errors=True)
        print(f"generating {args.records:,} records ...", flush=True)
        config = GeneratorConfig(
            out=src,
            records=args.records,
            keys=100_000,
            partitions=4,
            chunk_records=250_000,
            headers=True,
            rate=2_000.0,
            codec=args.codec,
        )
        generate(config, progress=False)
        print("compacting ...", flush=True)
        compact(
            CompactConfig(
                source=src, dest=dest, groups=args.groups, slice_duration=args.slice_duration, codec=args.codec
            ),
            spark,
        )
        Path(dest, "_done").touch()
        shutil.rmtree(src, ignore_errors=True)  # only the compacted archive is read
    return dest


def upload(local_root: str, dest, threads: int = 16) -> None:
    """Every file of the local archive to `dest` (a Storage), in parallel."""
    from keygroups.storage import open_storage

    files = [o.key for o in open_storage(local_root).list() if o.key.endswith((".avro", ".json", ".parquet"))]

    def put(key: str) -> None:
        with open(os.path.join(local_root, key), "rb") as f:
            dest.write(key, f.read())

    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(put, files))


def label(parts: int | None, ra: int, rb: int) -> str:
    return f"numPartitions={parts or 'default':<7} readAhead={ra:>3} MiB range={rb:>2} MiB"


def read_once(spark, url: str, opts: dict[str, str]) -> float:
    """Seconds to read the whole archive into the noop sink."""
    t = time.perf_counter()
    spark.read.format("keyfill").options(**opts).load(url).write.format("noop").mode("overwrite").save()
    return time.perf_counter() - t


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="smaller archive, one repetition")
    ap.add_argument(
        "--replay", action="store_true", help="sweep reader.replay (threads, read_ahead_bytes, range_bytes) instead"
    )
    ap.add_argument("--threads", default="4,16,64", help="--replay: thread counts")
    ap.add_argument("--records", type=int, default=None, help="records (default 2M; --quick 600K)")
    ap.add_argument("--groups", type=int, default=16)
    ap.add_argument("--slice-duration", default="1m")
    ap.add_argument("--codec", default="null", help="codec of the archive (null: ~160 B per record)")
    ap.add_argument("--latencies", default="0,30,100", help="ms added per request")
    ap.add_argument("--read-ahead-mib", default="16,128,512", help="readAheadBytes values, MiB")
    ap.add_argument("--range-mib", default="4,16", help="rangeBytes values, MiB")
    ap.add_argument(
        "--num-partitions", default="2,8,16", help="numPartitions values besides the default (16: one per group)"
    )
    ap.add_argument("--full", action="store_true", help="every rangeBytes with every numPartitions too")
    ap.add_argument("--repeat", type=int, default=None, help="runs per point, best kept (default 2; --quick 1)")
    ap.add_argument("--dir", default="/tmp/keyfill-bench-spark-io", help="archive cache")
    args = ap.parse_args()
    args.records = args.records or (600_000 if args.quick else 2_000_000)
    repeat = args.repeat or (1 if args.quick else 2)
    args.latencies = [float(x) for x in args.latencies.split(",")]
    args.read_ahead_mib = [int(x) for x in args.read_ahead_mib.split(",")]
    args.range_mib = [int(x) for x in args.range_mib.split(",")]
    args.num_partitions = [int(x) for x in args.num_partitions.split(",") if x]
    args.threads = [int(x) for x in args.threads.split(",")]
    grid = replay_settings(args) if args.replay else settings(args)

    from compactor.spark_session import local_spark
    from keyfill.testing.s3server import start_seaweedfs
    from keygroups import compacted
    from keygroups.storage import open_storage

    server = start_seaweedfs("keyfill-bench-spark-io")
    proxy = LatencyProxy(server.endpoint)
    spark = None
    try:
        # Spark's JVM, and through it every Python worker, keeps the environment it starts
        # with: point it at the proxy before the session exists.
        server.apply_env()
        with server.applied_env():  # this client talks to SeaweedFS directly: the upload skips the proxy
            bucket = open_storage(f"s3://{server.bucket}", threads=32)
            bucket.client  # noqa: B018 (built now, with the direct endpoint)
        os.environ["AWS_ENDPOINT_URL"] = proxy.url
        spark = local_spark("local[2]", app="keyfill bench spark io", progress=False)
        spark.sparkContext.setLogLevel("ERROR")
        import reader.spark

        reader.spark.register(spark)
        local = ensure_archive(args, spark)
        manifest = compacted.load_manifest(open_storage(local))
        records = int(manifest.totals.records)
        t = time.perf_counter()
        upload(local, bucket.sub("archive"))
        url = f"s3://{server.bucket}/archive"
        print(
            f"\nkeyfill Spark source I/O benchmark: {os.cpu_count()} cores, local[2], load average "
            f"{os.getloadavg()[0]:.1f} at start\narchive: {records:,} records, {manifest.groups} groups x "
            f"{manifest.slices} slices, {manifest.totals.files} files, "
            f"{manifest.totals.file_bytes / MiB:.0f} MiB (uploaded in {time.perf_counter() - t:.1f} s)",
            flush=True,
        )
        # Workers started, numba's decoder loaded, and the row count checked once.
        n = spark.read.format("keyfill").load(url).count()
        if n != records:
            raise SystemExit(f"the source read {n:,} rows; the archive holds {records:,}")
        read_once(spark, url, {})

        key = next(o.key for o in bucket.sub("archive").list("_versions/"))
        results: dict[float, dict[str, float]] = {d: {} for d in args.latencies}
        measured: dict[float, float] = {}
        for d in args.latencies:
            proxy.delay_ms = d
            measured[d] = median_get_ms(proxy.url, server.bucket, f"archive/{key}")
            print(f"+{d:g} ms per request: median small GET through the proxy {measured[d]:.1f} ms", flush=True)
        # Repeats outermost, then latencies, then settings: a stretch of load from other
        # processes spreads over all points instead of spoiling one latency's.
        for r in range(repeat):
            for d in args.latencies:
                proxy.delay_ms = d
                print(f"\nrun {r + 1}/{repeat}, +{d:g} ms (load average {os.getloadavg()[0]:.1f})", flush=True)
                for name, opts, _ in grid:
                    rate = records / (replay_once(url, opts) if args.replay else read_once(spark, url, opts))
                    results[d][name] = max(results[d].get(name, 0.0), rate)
                    print(f"  {name:<52} {rate:>11,.0f} rows/s", flush=True)
    finally:
        if spark is not None:
            spark.stop()
        proxy.close()
        server.stop()

    print(f"\n=== results (load average {os.getloadavg()[0]:.1f} at end; best of {repeat}) ===")
    print(
        f"{records:,} records, {manifest.groups} groups, slices of {args.slice_duration}; rows/s of a batch read "
        "into the noop sink; median small GET: "
        + ", ".join(f"+{d:g} ms -> {measured[d]:.1f} ms" for d in args.latencies)
    )
    print(f"{'setting':<52}" + "".join(f" {f'+{d:g} ms':>11}" for d in args.latencies))
    for name, _, _ in grid:
        print(f"{name:<52}" + "".join(f" {results[d][name]:>11,.0f}" for d in args.latencies))
    print()
    flagged = []
    for d in args.latencies:
        top = max(results[d], key=results[d].__getitem__)
        ratio = results[d]["defaults"] / results[d][top]
        flag = f"  < {FLAG}: FLAGGED" if ratio < FLAG else ""
        print(
            f"+{d:>3g} ms: defaults {results[d]['defaults']:>11,.0f} rows/s; best {top.strip()} "
            f"{results[d][top]:>11,.0f} rows/s; defaults/best {ratio:.2f}{flag}"
        )
        if ratio < FLAG:
            flagged.append(d)
    print(
        "defaults within 0.9x of the best at every latency"
        if not flagged
        else f"defaults below 0.9x of the best at +{', +'.join(f'{d:g}' for d in flagged)} ms"
    )
    if args.replay:
        return 0
    # Which knob it is: the default readAheadBytes/rangeBytes against the best of those two at
    # the same numPartitions.
    ra0, rb0 = default_io()
    print(f"\nreadAhead={ra0} MiB range={rb0} MiB (the I/O defaults) / the best I/O setting at the same numPartitions")
    for parts in [None, *args.num_partitions]:
        mine = [(name, point) for name, _, point in grid if point[0] == parts]
        base = next((name for name, point in mine if point[1:] == (ra0, rb0)), None)
        if base is None:
            continue
        cells = []
        for d in args.latencies:
            top = max((name for name, _ in mine), key=results[d].__getitem__)
            cells.append(f"+{d:g} ms {results[d][base] / results[d][top]:.2f}")
        print(f"  numPartitions={parts or 'default':<7} " + ", ".join(cells))
    return 0


if __name__ == "__main__":
    sys.exit(main())

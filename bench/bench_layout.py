"""The compacted layout at any slice length: files, replay and Spark rates, GETs per GB, in one run.

    python -m bench.bench_layout            # a 2M-record archive + a >= 1 GB one (cached sources)
    python -m bench.bench_layout --quick    # smaller archives: a fast check of the whole table

1. A 2M-record archive (8 partitions, 20K keys, skew 1.0, 1,000 records/s,
   seed 3), compacted with 64 groups at 10m, 1m and 10s slices: files, average file,
   pieces, compaction time; `reader.replay` records/s on local disk (4 threads, page cache)
   and on S3 (SeaweedFS on this machine, +--latency-ms per GET, 16 threads), GETs counted at
   the storage layer; the Spark source's rows/s (`format("keyfill")`, local[2],
   Trigger.AvailableNow, maxBytesPerTrigger = the largest slice of any of the archives, so
   every slice length gets batches of the same size and count: a micro-batch takes whole
   slices, so a smaller limit gives long slices fewer, larger batches, and Spark's fixed cost
   per batch, not the slice length, decides the ratio). Ratios: 10s and 1m over 10m, measured here.
2. A >= 1 GB archive with 64 groups (1m slices): objects written against the bound
   sum over groups of ceil(group bytes / target) plus metadata; GETs per replayed GB;
   compaction time against a sequential fastavro read of the source (fastavro.reader over
   every chunk, one process: what a plain Python job pays to read the archive once).
"""

from __future__ import annotations

import argparse
import io
import os
import shutil
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

GB, MB = 1e9, 1e6


class CountingStore:
    """Counts the requests a reader makes (whole and ranged GETs) and the bytes they return."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner
        self.gets = 0
        self.bytes = 0
        self._lock = threading.Lock()

    def _count(self, data: bytes) -> bytes:
        with self._lock:
            self.gets += 1
            self.bytes += len(data)
        return data

    def read(self, key: str) -> bytes:
        return self._count(self._inner.read(key))

    def read_range(self, key: str, start: int, length: int) -> bytes:
        return self._count(self._inner.read_range(key, start, length))

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


@dataclass
class Layout:
    duration: str
    url: str
    files: int
    file_bytes: int
    pieces: int
    slices: int
    compact_s: float
    local: float = 0.0
    local_gets: int = 0
    s3: float = 0.0
    s3_gets: int = 0
    spark: float = 0.0


def generate_source(root: str, records: int, **kw: Any) -> str:
    from bench.archives import cached_source
    from keyfill.synth.generate import GeneratorConfig

    return cached_source(GeneratorConfig(out=os.path.join(root, f"source-{records}"), records=records, **kw))


def fastavro_read(src: str) -> tuple[int, float]:
    """Records and seconds of reading every chunk with fastavro, sequentially."""
    import fastavro

    files = sorted(Path(src).rglob("*.avro"))
    started = time.perf_counter()
    n = 0
    for f in files:
        for _ in fastavro.reader(io.BytesIO(f.read_bytes())):
            n += 1
    return n, time.perf_counter() - started


def compact_timed(
    spark, src: str, dest: str, groups: int | None, duration: str, codec: str = "snappy"
) -> tuple[Any, float]:
    from compactor.job import CompactConfig, compact

    shutil.rmtree(dest, ignore_errors=True)
    started = time.perf_counter()
    # seal_all: every slice length publishes every record (by default the last, unsealed
    # slices wait for the next append, and how many records that leaves out depends on the length)
    config = CompactConfig(source=src, dest=dest, groups=groups, slice_duration=duration, codec=codec, seal_all=True)
    result = compact(config, spark)
    return result, time.perf_counter() - started


def replay_rate(store: Any, threads: int, expect: int) -> tuple[float, int]:
    """Best records/s of two runs (the first also warms caches), and the GETs of one run."""
    import reader

    best, gets = 0.0, 0
    for _ in range(2):
        counting = CountingStore(store)
        started = time.perf_counter()
        n = 0
        with reader.replay(store.url, threads=threads, store=counting) as events:
            for ev in events:
                if isinstance(ev, reader.Records):
                    n += ev.batch.num_rows
        if n != expect:
            raise SystemExit(f"replay of {store.url} gave {n} records, expected {expect}")
        best, gets = max(best, n / (time.perf_counter() - started)), counting.gets
    return best, gets


def spark_rate(spark, url: str, expect: int, batch_bytes: int, ck: str) -> float:
    """Rows/s of the streaming source into a noop sink, AvailableNow, best of two."""
    best = 0.0
    for i in range(2):
        shutil.rmtree(f"{ck}-{i}", ignore_errors=True)  # a query of an earlier run's archive
        started = time.perf_counter()
        q = (
            spark.readStream.format("keyfill")
            .option("maxBytesPerTrigger", str(batch_bytes))
            .option("numPartitions", "4")
            .load(url)
            .writeStream.format("noop")
            .option("checkpointLocation", f"{ck}-{i}")
            .trigger(availableNow=True)
            .start()
        )
        q.awaitTermination()
        rows = sum(p["numInputRows"] for p in q.recentProgress)
        if rows != expect:
            raise SystemExit(f"Spark source read {rows} rows of {url}, expected {expect}")
        best = max(best, rows / (time.perf_counter() - started))
    return best


def largest_slice_bytes(url: str) -> int:
    from keygroups import compacted
    from keygroups.piece_index import PieceIndex
    from keygroups.storage import open_storage

    store = open_storage(url)
    m = compacted.load_manifest(store)
    return max(PieceIndex.of(store, m).slice_rows(0, m.slices).column("bytes").to_pylist(), default=1)


def objects_bound(url: str, target: int) -> tuple[int, int, int]:
    """(segment files, sum over groups of ceil(group bytes / target), metadata objects)."""
    from keygroups import compacted
    from keygroups.storage import open_storage

    store = open_storage(url)
    keys = [o for o in store.list()]
    segments = [o for o in keys if o.key.startswith(compacted.GROUPS + "/")]
    per_group: dict[str, int] = {}
    for o in segments:
        g = o.key.split("/")[1]
        per_group[g] = per_group.get(g, 0) + o.size
    bound = sum(-(-b // target) for b in per_group.values())
    return len(segments), bound, len(keys) - len(segments)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="400K + 1.5M records instead of 2M + 7M")
    ap.add_argument("--records", type=int, default=None, help="the issue's archive (default 2M)")
    ap.add_argument("--big-records", type=int, default=None, help="the >= 1 GB archive (default 7M)")
    ap.add_argument("--groups", type=int, default=64)
    ap.add_argument("--big-codec", default="null", help="codec of the big archive (null: 7M records make > 1 GB)")
    ap.add_argument("--durations", default="10m,1m,10s")
    ap.add_argument("--latency-ms", type=float, default=30.0)
    ap.add_argument("--cases", default="local,s3,spark,big", help="which of local,s3,spark,big to run")
    ap.add_argument("--rounds", type=int, default=3, help="interleaved rounds of the replay rows, best kept")
    ap.add_argument("--dir", default="/tmp/keyfill-bench-layout")
    args = ap.parse_args()
    records = args.records or (400_000 if args.quick else 2_000_000)
    big_records = args.big_records or (1_500_000 if args.quick else 7_000_000)
    durations = args.durations.split(",")
    cases = set(args.cases.split(","))
    os.makedirs(args.dir, exist_ok=True)

    from compactor.defaults import TARGET_FILE_BYTES as DEFAULT_TARGET_BYTES
    from compactor.spark_session import local_spark
    from keygroups.storage import open_storage

    src = generate_source(
        args.dir, records, partitions=8, keys=20_000, chunk_records=50_000, skew=1.0, rate=1000.0, seed=3
    )
    spark = local_spark("local[2]", app="keyfill bench layout", progress=False)
    spark.sparkContext.setLogLevel("ERROR")
    import reader.spark

    reader.spark.register(spark)
    rows: list[Layout] = []
    big = defaults = None
    try:
        compact_timed(spark, src, os.path.join(args.dir, "warm"), 4, "10m")  # Spark and numba warmed
        for d in durations:
            dest = os.path.join(args.dir, f"compacted-{d}")
            result, seconds = compact_timed(spark, src, dest, args.groups, d)
            rows.append(Layout(d, dest, result.files, result.file_bytes, result.pieces, result.slices, seconds))
            print(f"compacted at {d}: {result.files} files, {result.pieces:,} pieces, {seconds:.1f} s", flush=True)
        if "local" in cases:
            for _ in range(args.rounds):  # interleaved, so every slice length sees the same machine
                for r in rows:
                    rate, r.local_gets = replay_rate(open_storage(r.url), 4, records)
                    r.local = max(r.local, rate)
            for r in rows:
                print(f"local {r.duration}: {r.local:,.0f} records/s, {r.local_gets} GETs", flush=True)
        if "spark" in cases:
            batch = max(largest_slice_bytes(r.url) for r in rows)  # the same batches at every slice length
            for r in rows:
                r.spark = spark_rate(spark, r.url, records, batch, os.path.join(args.dir, f"ck-{r.duration}"))
                print(f"spark {r.duration}: {r.spark:,.0f} rows/s", flush=True)
        if "big" in cases:
            big_src = generate_source(
                args.dir, big_records, partitions=4, keys=1_000_000, chunk_records=250_000, headers=True, rate=2000.0
            )
            n, read_s = fastavro_read(big_src)
            dest = os.path.join(args.dir, "compacted-big")
            result, compact_s = compact_timed(spark, big_src, dest, args.groups, "1m", args.big_codec)
            segments, bound, metadata = objects_bound(dest, DEFAULT_TARGET_BYTES)
            rate, gets = replay_rate(open_storage(dest), 16, big_records)
            big = (n, read_s, result, compact_s, segments, bound, metadata, rate, gets)
            # the --groups default on the same archive, for the rule's justification
            dest = os.path.join(args.dir, "compacted-big-default")
            default, default_s = compact_timed(spark, big_src, dest, None, "1m", args.big_codec)
            default_rate, default_gets = replay_rate(open_storage(dest), 16, big_records)
            defaults = (default, default_s, default_rate, default_gets)
    finally:
        spark.stop()

    if "s3" in cases:
        from keyfill.testing.s3server import start_seaweedfs

        server = start_seaweedfs("keyfill-bench-layout")
        server.apply_env()
        try:
            root = open_storage(f"s3://{server.bucket}", threads=64)
            delay = args.latency_ms / 1000

            def sleep(**kwargs: object) -> None:  # returning None lets the real request go on
                time.sleep(delay)

            for r in rows:
                s3 = root.sub(f"compacted-{r.duration}")
                local = open_storage(r.url)
                for o in local.list():
                    s3.write(o.key, local.read(o.key))
            root.client.meta.events.register("before-send.s3.GetObject", sleep)  # uploads done: reads only
            for _ in range(args.rounds):
                for r in rows:
                    rate, r.s3_gets = replay_rate(root.sub(f"compacted-{r.duration}"), 16, records)
                    r.s3 = max(r.s3, rate)
            for r in rows:
                print(f"s3 {r.duration}: {r.s3:,.0f} records/s, {r.s3_gets} GETs", flush=True)
        finally:
            server.stop()

    print(
        f"\n=== compacted layout: {records:,} records, 8 partitions, {args.groups} groups, {os.cpu_count()} cores ==="
    )
    base = next((r for r in rows if r.duration == "10m"), rows[0])
    print(
        f"{'slices':>6} {'files':>6} {'avg file':>9} {'pieces':>7} {'compact s':>9} "
        f"{'local 4 thr rec/s':>18} {'x10m':>5} {'S3 16 thr rec/s':>16} {'x10m':>5} {'GETs':>5} "
        f"{'Spark rows/s':>13} {'x10m':>5}"
    )
    for r in rows:

        def ratio(a: float, b: float) -> str:
            return f"{a / b:.2f}" if a and b else "-"

        print(
            f"{r.duration:>6} {r.files:>6} {r.file_bytes / max(1, r.files) / MB:>7.2f}MB {r.pieces:>7,} "
            f"{r.compact_s:>9.1f} {r.local:>18,.0f} {ratio(r.local, base.local):>5} {r.s3:>16,.0f} "
            f"{ratio(r.s3, base.s3):>5} {r.s3_gets:>5} {r.spark:>13,.0f} {ratio(r.spark, base.spark):>5}"
        )
    if big:
        n, read_s, result, compact_s, segments, bound, metadata, rate, gets = big
        gb = result.file_bytes / GB
        print(
            f"\n>= 1 GB archive: {n:,} records, {result.file_bytes / GB:.2f} GB compacted ({args.big_codec}), "
            f"{args.groups} groups, "
            f"1m slices ({result.slices:,}), {result.pieces:,} pieces"
        )
        print(
            f"  objects: {segments} segment files (bound sum ceil(group bytes / 64 MiB) = {bound}: "
            f"{'met' if segments <= bound else 'MISSED'}) + {metadata} metadata objects"
        )
        print(
            f"  replay, 16 threads, local: {rate:,.0f} records/s with {gets} GETs = {gets / gb:.0f} GETs per GB "
            f"(target <= 128: {'met' if gets / gb <= 128 else 'MISSED'})"
        )
        print(
            f"  compaction {compact_s:.1f} s vs sequential fastavro read {read_s:.1f} s = {compact_s / read_s:.2f}x "
            f"(target <= 3x: {'met' if compact_s <= 3 * read_s else 'MISSED'})"
        )
    if big and defaults:
        default, default_s, default_rate, default_gets = defaults
        print(
            f"  --groups default ({default.groups} groups): {default.files} files of avg "
            f"{default.file_bytes / max(1, default.files) / MB:.1f} MB, {default_gets / (default.file_bytes / GB):.0f} "
            f"GETs per GB, replay {default_rate:,.0f} records/s = {default_rate / rate:.2f}x of {args.groups} groups; "
            f"compaction {default_s:.1f} s"
        )


if __name__ == "__main__":
    main()

"""Replay speed: the compacted replay against the two baselines over the source archive,
on local disk and on a local S3 server with injected GET latency, measured in one run.

    python -m bench.bench_replay           # ~2 GB archive (generated and compacted once, cached)
    python -m bench.bench_replay --quick   # small archive, fast check of the whole pipeline

Rows: the per-partition baseline (one reader per Kafka partition), the sharded-by-key
baseline (N readers each reading everything; its bytes read show the I/O amplification)
and `reader.replay` at 1, 4 and 16 threads. Every row consumes all records into a null sink
and is timed from opening the archive to the last record (the baselines get their chunk
index, built from the chunk headers, before the clock starts). Both baselines decode with
the reader's compiled decoder and fetch one chunk ahead, so the comparison is about the I/O
pattern and the parallelism.

The source archive uses the same codec as the compacted one, with chunks of about the
compacted files' size, so neither side wins by moving fewer bytes or fewer objects: that
is the strengthened baseline. On S3 two more rows show today's practice as users run it:
one sequential reader per partition that GETs an object, decodes it, then GETs the next
(no read-ahead), over the same archive and over the same records as a Kafka Connect S3
sink lays them out with flush.size=--sink-chunk-records (6,000 records: about 1 MB
objects; Connect writes one object per flush.size records per partition, and flush sizes
of a few thousand records keep its per-partition buffers small; the archive holds the same
records, only cut into smaller objects). Those rows still use the compiled decoder (a
fastavro reader would be about 10x slower), so they are generous to today's practice.
The summary prints the compacted replay's ratio against every baseline row.
Local disk means the page cache (the archives are read once before timing). The S3 server
is SeaweedFS on this machine, sharing its 2 cores with the replay; every GetObject first
sleeps --latency-ms in a botocore before-send hook, which models an object store's round
trip (waiting releases the GIL, as real network waits do).

--drift (on by default): on a hot-key
archive (one key = 90% of bytes), no control vs the seed's proportional sleep vs the drift
bound: max event-time spread across threads (sampled by the consumer) and throughput.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import reader
from bench.baselines import PerPartitionReplay, SeedPacedReplay, ShardedReplay
from compactor.sources.envelope import build_index
from keygroups import compacted
from keygroups.storage import ObjectInfo, S3Storage, Storage, open_storage

GB, MB = 1e9, 1e6
LOCAL_TARGET = 2_000_000  # records/s, compacted replay on local disk
S3_TARGET = 3.0  # compacted replay at 16 threads / per-partition baseline, on latency-injected S3


# --- archives (cached between runs) -----------------------------------------------------


def ensure_archives(args: argparse.Namespace) -> tuple[str, str, str | None, str | None, str]:
    """Generate and compact what the cache lacks; (source, compacted, hot source, hot
    compacted, sink-sized source) paths. Generation and compaction are not measured here."""
    from keyfill.synth.generate import GeneratorConfig

    tag = f"{args.records}-{args.keys}-{args.partitions}-{args.chunk_records}-{args.codec}"
    src = os.path.join(args.dir, f"source-{tag}")
    dest = os.path.join(args.dir, f"compacted-{tag}-G{args.groups}-{args.slice_duration}")
    todo: list[tuple[str, GeneratorConfig | None, str, int]] = []
    base: dict[str, Any] = {
        "partitions": args.partitions,
        "chunk_records": args.chunk_records,
        "headers": True,
        "codec": args.codec,
        "rate": 2_000.0,
    }
    todo.append((src, GeneratorConfig(out=src, records=args.records, keys=args.keys, **base), dest, args.groups))
    # The same records in Kafka Connect S3 sink-sized objects: generated, never compacted.
    sink_tag = f"{args.records}-{args.keys}-{args.partitions}-{args.sink_chunk_records}-{args.codec}"
    sink_src = os.path.join(args.dir, f"source-{sink_tag}")
    sink_cfg = GeneratorConfig(
        out=sink_src, records=args.records, keys=args.keys, **{**base, "chunk_records": args.sink_chunk_records}
    )
    hot_src = hot_dest = None
    if args.drift:
        hot_tag = f"{args.hot_records}-{args.partitions}-{args.codec}-r500"
        hot_src = os.path.join(args.dir, f"hot-source-{hot_tag}")
        hot_dest = os.path.join(args.dir, f"hot-compacted-{hot_tag}-G{args.groups}-{args.slice_duration}")
        # A slower event rate than the main archive, so even --quick spans several slices.
        hot = GeneratorConfig(
            out=hot_src, records=args.hot_records, keys=10_000, hot_key_share=0.9, **{**base, "rate": 500.0}
        )
        todo.append((hot_src, hot, hot_dest, args.groups))
    if "s3" in args.cases.split(",") and not os.path.exists(os.path.join(sink_src, "_done")):
        from keyfill.synth.generate import generate

        shutil.rmtree(sink_src, ignore_errors=True)
        print(f"generating {args.records:,} records into {sink_src} ...", flush=True)
        generate(sink_cfg, progress=False)
        Path(sink_src, "_done").touch()
    spark = None
    try:
        for src_dir, cfg, dest_dir, groups in todo:
            if not os.path.exists(os.path.join(src_dir, "_done")):
                from keyfill.synth.generate import generate

                shutil.rmtree(src_dir, ignore_errors=True)
                print(f"generating {cfg.records:,} records into {src_dir} ...", flush=True)
                generate(cast(GeneratorConfig, cfg), progress=False)
                Path(src_dir, "_done").touch()
                shutil.rmtree(dest_dir, ignore_errors=True)
            if not os.path.exists(os.path.join(dest_dir, "_done")):
                from compactor.job import CompactConfig, compact
                from compactor.spark_session import local_spark

                if spark is None:
                    spark = local_spark("local[2]", app="keyfill bench replay", progress=False)
                    spark.sparkContext.setLogLevel("ERROR")
                print(f"compacting {src_dir} into {groups} groups ...", flush=True)
                t = time.perf_counter()
                compact(
                    CompactConfig(
                        source=src_dir,
                        dest=dest_dir,
                        groups=groups,
                        slice_duration=args.slice_duration,
                        codec=args.codec,
                        seal_all=True,  # every record, as the baselines read them all
                        overwrite=True,
                    ),
                    spark,
                )
                print(f"  compacted in {time.perf_counter() - t:.0f} s", flush=True)
                Path(dest_dir, "_done").touch()
    finally:
        if spark is not None:
            spark.stop()
    return src, dest, hot_src, hot_dest, sink_src


def archive_files(root: str) -> list[ObjectInfo]:
    return [o for o in open_storage(root).list() if o.key.endswith((".avro", ".json", ".parquet"))]


def warm_page_cache(roots: Iterable[str]) -> None:
    """Read every file once, so local-disk rows all start from the page cache."""
    for root in roots:
        for o in archive_files(root):
            with open(os.path.join(root, o.key), "rb") as f:
                while f.read(8 << 20):
                    pass


def warm_up_compiled(root: str) -> None:
    """Load the numba-compiled decoder and key hash once, so no row pays for it."""
    from keygroups import envelope
    from reader.flink_keyby import consumer_indexes

    store = open_storage(root)
    key = next(o.key for o in store.list("groups/") if o.key.endswith(".avro"))
    consumer_indexes(envelope.decode_avro(store.read(key))[1], 4, key_type="bytes")


def upload(local_root: str, dest: Storage, threads: int = 16) -> None:
    files = archive_files(local_root)

    def put(o: ObjectInfo) -> None:
        with open(os.path.join(local_root, o.key), "rb") as f:
            dest.write(o.key, f.read())

    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(put, files))


# --- measuring ----------------------------------------------------------------------------


@dataclass
class Row:
    label: str
    readers: int
    records: int
    seconds: float
    bytes_read: int

    @property
    def rate(self) -> float:
        return self.records / self.seconds


class CountingStore:
    """Delegates to a Storage and counts the bytes its reads return (the reader takes a
    `store`, so the compacted rows report bytes read like the baselines do)."""

    def __init__(self, inner: Storage) -> None:
        self._inner = inner
        self._lock = threading.Lock()
        self.bytes_read = 0

    def read(self, key: str) -> bytes:
        data = self._inner.read(key)
        with self._lock:
            self.bytes_read += len(data)
        return data

    def read_range(self, key: str, start: int, length: int) -> bytes:
        data = self._inner.read_range(key, start, length)
        with self._lock:
            self.bytes_read += len(data)
        return data

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


def run_baseline(label: str, make: Callable[[], PerPartitionReplay | ShardedReplay], expect: int) -> Row:
    t = time.perf_counter()
    n = 0
    with make() as replay:
        for batch in replay:
            n += batch.num_rows
        seconds = time.perf_counter() - t
        row = Row(label, replay.readers, n, seconds, replay.bytes_read)
    check_count(label, n, expect)
    return row


def run_compacted(label: str, store: Storage, threads: int, expect: int, **options: Any) -> Row:
    counting = CountingStore(store)
    t = time.perf_counter()
    n = 0
    with reader.replay(store.url, threads=threads, store=cast(Storage, counting), **options) as events:
        for ev in events:
            if isinstance(ev, reader.Records):
                n += ev.batch.num_rows
    row = Row(label, threads, n, time.perf_counter() - t, counting.bytes_read)
    check_count(label, n, expect)
    return row


def run_ceiling(label: str, store: Storage, threads: int, decode: bool, expect: int) -> Row:
    """All group files of the compacted archive through a plain thread pool, in no order, with
    no queue or barrier: what this box allows at all (GET + decode, or GET alone)."""
    from keygroups import envelope

    t = time.perf_counter()
    files = [o for o in store.list("groups/") if o.key.endswith(".avro")]

    def one(key: str) -> int:
        data = store.read(key)
        return envelope.decode_avro(data, name=key)[1].num_rows if decode else 0

    with ThreadPoolExecutor(threads) as pool:
        n = sum(pool.map(one, [o.key for o in files]))
    seconds = time.perf_counter() - t
    if decode:
        check_count(label, n, expect)
    return Row(label, threads, expect, seconds, sum(o.size for o in files))


def check_count(label: str, n: int, expect: int) -> None:
    if n != expect:
        raise SystemExit(f"{label}: replayed {n:,} records, the archive holds {expect:,}")


def print_rows(title: str, rows: list[Row], archive_bytes: int, notes: dict[str, str]) -> None:
    print(f"\n{title}")
    print(f"  {'':<44} {'readers':>7} {'seconds':>8} {'records/s':>11} {'GB read':>8} {'x archive':>9}")
    for r in rows:
        print(
            f"  {r.label:<44} {r.readers:>7} {r.seconds:>8.1f} {r.rate:>11,.0f} {r.bytes_read / GB:>8.2f} "
            f"{r.bytes_read / archive_bytes:>8.2f}x  {notes.get(r.label, '')}"
        )


# --- the cases ----------------------------------------------------------------------------


def measure_case(
    src: Storage, dest: Storage, args: argparse.Namespace, records: int, s3: bool, sink_src: Storage | None = None
) -> list[Row]:
    """All rows on one backend: the box's ceiling first (a plain thread pool over the compacted
    files: 2 threads for the 2 cores locally, 16 on S3 where GETs wait), then the baselines
    (on S3 also today's practice: sequential GET-then-decode per partition, over `sink_src`
    too), then the replay."""
    rows = []
    if s3:  # the I/O alone, without decoding
        rows.append(run_ceiling("ceiling: GET only, no decode", dest, 16, False, records))
        print(f"  {rows[-1].label}: {rows[-1].rate:,.0f} records/s", flush=True)
    rows.append(run_ceiling("ceiling: GET + decode, plain pool", dest, 16 if s3 else 2, True, records))
    print(f"  {rows[-1].label}: {rows[-1].rate:,.0f} records/s", flush=True)
    # The baselines get the chunk index for free (a real one would read the listing only).
    index = build_index(src)
    if sink_src is not None:
        sink_index = build_index(sink_src)
        mb = sink_index.bytes / len(sink_index.all_chunks()) / MB
        rows.append(
            run_baseline(
                f"today: per-partition, sequential, {mb:.1f} MB objs",
                lambda: PerPartitionReplay(sink_src.url, store=sink_src, index=sink_index, read_ahead=0),
                records,
            )
        )
        print(f"  {rows[-1].label}: {rows[-1].rate:,.0f} records/s", flush=True)
    if s3:
        rows.append(
            run_baseline(
                "per-partition baseline, no read-ahead",
                lambda: PerPartitionReplay(src.url, store=src, index=index, read_ahead=0),
                records,
            )
        )
        print(f"  {rows[-1].label}: {rows[-1].rate:,.0f} records/s", flush=True)
    rows.append(
        run_baseline("per-partition baseline", lambda: PerPartitionReplay(src.url, store=src, index=index), records)
    )
    print(f"  {rows[-1].label}: {rows[-1].rate:,.0f} records/s", flush=True)
    rows.append(
        run_baseline(
            "sharded-by-key baseline",
            lambda: ShardedReplay(src.url, store=src, index=index, shards=args.shards),
            records,
        )
    )
    print(f"  {rows[-1].label}: {rows[-1].rate:,.0f} records/s", flush=True)
    for t in args.threads:
        rows.append(run_compacted(f"compacted replay, {t} threads", dest, t, records))
        print(f"  {rows[-1].label}: {rows[-1].rate:,.0f} records/s", flush=True)
    return rows


def run_drift(store: Storage, args: argparse.Namespace, records: int) -> list[tuple[str, Row, int, int | None]]:
    """(label, row, max sampled spread, the replay's own max spread if it keeps one)."""
    out = []
    variants: list[tuple[str, Callable[..., Any], dict[str, Any]]] = [
        ("no control", reader.replay, {}),
        ("seed's proportional sleep (bench.baselines)", SeedPacedReplay, {}),
        (f"max_drift_ms={args.drift_bound_ms:,}", reader.replay, {"max_drift_ms": args.drift_bound_ms}),
    ]
    for label, open_replay, options in variants:
        t = time.perf_counter()
        n = 0
        spread = 0
        with open_replay(store.url, threads=args.drift_threads, store=store, **options) as events:
            sample = getattr(events, "spread_ms", None)
            for ev in events:
                if isinstance(ev, reader.Records):
                    n += ev.batch.num_rows
                if sample is not None:
                    spread = max(spread, int(sample()))
            own = getattr(events, "max_spread_ms", None)
        row = Row(label, args.drift_threads, n, time.perf_counter() - t, 0)
        check_count(label, n, records)
        out.append((label, row, spread, own))
        print(f"  {label}: {row.rate:,.0f} records/s, max spread {spread:,} ms", flush=True)
    return out


def describe(src_root: str, dest_root: str) -> tuple[int, int, int]:
    index = build_index(open_storage(src_root))
    manifest = compacted.load_manifest(open_storage(dest_root))
    files = manifest.totals.files
    totals = manifest.totals
    gb = manifest.group_payload_bytes
    print(
        f"source:    {index.records:,} records, {index.bytes / GB:.2f} GB in {len(index.all_chunks())} chunks "
        f"(avg {index.bytes / len(index.all_chunks()) / MB:.1f} MB), {len(index.partitions())} partitions, "
        f"codec {manifest.config.codec}"
    )
    print(
        f"compacted: {manifest.groups} groups x {manifest.slices} slices, {manifest.totals.pieces} pieces in "
        f"{files} files, "
        f"{totals['file_bytes'] / GB:.2f} GB (avg {totals['file_bytes'] / max(1, files) / MB:.1f} MB), "
        f"{totals['keys']:,} keys, max/mean group bytes {max(gb) / (sum(gb) / len(gb)):.2f}"
    )
    return index.records, index.bytes, int(totals["file_bytes"])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="small archive (a few hundred MB): a fast check")
    ap.add_argument("--records", type=int, default=None, help="records (default 13M, about 2.1 GB; --quick 1.5M)")
    ap.add_argument("--keys", type=int, default=None, help="keys (default 1M; --quick 200K)")
    ap.add_argument("--partitions", type=int, default=4)
    ap.add_argument("--groups", type=int, default=64)
    ap.add_argument(
        "--chunk-records",
        type=int,
        default=20_000,
        help="records per source chunk (20K: about the compacted files' size)",
    )
    ap.add_argument(
        "--sink-chunk-records",
        type=int,
        default=6_000,
        help="records per object of the Kafka Connect-sized source (flush.size; 6K: about 1 MB)",
    )
    ap.add_argument("--slice-duration", default="10m")
    ap.add_argument("--codec", default="null", help="codec of both archives")
    ap.add_argument("--threads", default="1,4,16", help="compacted replay thread counts")
    ap.add_argument("--shards", type=int, default=16, help="readers of the sharded baseline")
    ap.add_argument("--latency-ms", type=float, default=30.0, help="injected S3 GET latency")
    ap.add_argument("--cases", default="local,s3", help="which of local,s3 to run")
    ap.add_argument(
        "--drift",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="drift-bound comparison (default: on)",
    )
    ap.add_argument("--hot-records", type=int, default=None, help="records of the hot-key archive (2M; --quick 300K)")
    ap.add_argument("--drift-bound-ms", type=int, default=60_000)
    ap.add_argument("--drift-threads", type=int, default=16)
    ap.add_argument("--dir", default="/tmp/keyfill-bench-replay", help="archive cache")
    args = ap.parse_args()
    args.records = args.records or (1_500_000 if args.quick else 13_000_000)
    args.keys = args.keys or (200_000 if args.quick else 1_000_000)
    args.hot_records = args.hot_records or (300_000 if args.quick else 2_000_000)
    args.threads = [int(t) for t in args.threads.split(",")]
    cases = set(args.cases.split(","))

    src_root, dest_root, _, hot_dest, sink_root = ensure_archives(args)
    print(f"\nkeyfill replay benchmark: {os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f} at start")
    records, src_bytes, dest_bytes = describe(src_root, dest_root)
    warm_up_compiled(dest_root)
    notes_common = {"sharded-by-key baseline": f"(N = {args.shards}: every reader reads every chunk)"}
    results: dict[str, list[Row]] = {}

    if "local" in cases:
        warm_page_cache([src_root, dest_root])
        print("\nlocal disk ...", flush=True)
        results["local"] = measure_case(open_storage(src_root), open_storage(dest_root), args, records, False)

    if "s3" in cases:
        from keyfill.testing.s3server import start_seaweedfs

        print("\nS3: starting SeaweedFS and uploading both archives ...", flush=True)
        server = start_seaweedfs("keyfill-bench-replay")
        server.apply_env()
        try:
            root = open_storage(f"s3://{server.bucket}", threads=64)
            assert isinstance(root, S3Storage)
            s3_src, s3_dest, s3_sink = root.sub("source"), root.sub("compacted"), root.sub("sink-source")
            t = time.perf_counter()
            upload(src_root, s3_src)
            upload(dest_root, s3_dest)
            upload(sink_root, s3_sink)
            print(
                f"  uploaded {(2 * src_bytes + dest_bytes) / GB:.2f} GB in {time.perf_counter() - t:.0f} s", flush=True
            )
            delay = args.latency_ms / 1000

            def sleep(**kwargs: object) -> None:  # returning None lets the real request go on
                time.sleep(delay)

            root.client.meta.events.register("before-send.s3.GetObject", sleep)
            results["s3"] = measure_case(s3_src, s3_dest, args, records, True, sink_src=s3_sink)
        finally:
            server.stop()

    drift_rows = None
    if args.drift and hot_dest is not None:
        warm_page_cache([hot_dest])
        hot_records = compacted.load_manifest(open_storage(hot_dest)).totals.records
        print("\ndrift bound (local disk, hot-key archive) ...", flush=True)
        drift_rows = run_drift(open_storage(hot_dest), args, hot_records)

    # --- report
    print(f"\n=== results (load average {os.getloadavg()[0]:.1f} at end) ===")
    print(
        f"archive: {records:,} records; source {src_bytes / GB:.2f} GB, compacted {dest_bytes / GB:.2f} GB; "
        f"{args.partitions} partitions, {args.groups} groups"
    )
    for case, title in (
        ("local", "local disk (page cache)"),
        ("s3", f"S3 (local SeaweedFS, +{args.latency_ms:.0f} ms per GET)"),
    ):
        if case not in results:
            continue
        rows = results[case]
        notes = dict(notes_common)
        base = next(r for r in rows if r.label == "per-partition baseline")
        top = max((r for r in rows if r.label.startswith("compacted")), key=lambda r: r.readers)
        if case == "local":
            for r in rows:
                if r.label.startswith("compacted"):
                    notes[r.label] = (
                        f"target >= {LOCAL_TARGET / 1e6:.0f}M/s: {'met' if r.rate >= LOCAL_TARGET else 'MISSED'}"
                    )
        print_rows(title, rows, src_bytes, notes)
        shape = args.partitions == 4 and args.groups == 64 and top.readers == 16
        for other in [r for r in rows if "baseline" in r.label or r.label.startswith("today")]:
            ratio = top.rate / other.rate
            line = f"  compacted {top.readers} threads / {other.label}: {ratio:.2f}x"
            if case == "s3" and (other is base or other.label.startswith("today")):
                ok = ratio >= S3_TARGET and shape
                line += (
                    f"  (target >= {S3_TARGET:.0f}x, 4 partitions, 64 groups, 16 threads: {'met' if ok else 'MISSED'})"
                )
            print(line)
    if args.drift and drift_rows:
        print(
            f"\ndrift bound: hot-key archive (one key = 90% of bytes), {hot_records:,} records, "
            f"{args.drift_threads} threads, local disk"
        )
        print(f"  {'':<44} {'records/s':>11} {'max spread ms (sampled)':>24} {'(replay max)':>13}")
        for label, row, spread, own in drift_rows:
            print(f"  {label:<44} {row.rate:>11,.0f} {spread:>24,} {'' if own is None else f'{own:,}':>13}")
    with open(os.path.join(args.dir, "last-results.json"), "w") as f:
        json.dump({k: [r.__dict__ for r in v] for k, v in results.items()}, f, indent=1)


if __name__ == "__main__":
    main()

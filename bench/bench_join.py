"""A join of two topics backfilled three ways (and a fourth), in one local[2] Spark session
(issue 44, item 6).

The generator's payments topic (two weeks of event time) and its logins topic (a login by the
same user 1-30 s before about one payment in ten, from a week after the payments' start: a
twentieth of the payments' records), both generated in process from a fixed seed and
compacted in process (payments in 1-hour slices, logins in 30-minute ones). The same job,
`jobs.fraud_join.fraud_join` (the payments whose user logged in within 10 minutes before
them, a left semi join, both sides under a 1-minute watermark), runs as a streaming query
with Trigger.AvailableNow to a noop sink over:

- paced:     two keyfill sources with `maxEventTimePerTrigger` (--stride) and a common
             `startingTimestamp` (the earlier archive's first slice), under Spark's default
             `multipleWatermarkPolicy=min`;
- paced-max: the same under `multipleWatermarkPolicy=max`, as jobs/fraud_join.py runs them.
             Spark counts an input that has had no rows yet as watermark 0 under `min`, so while the paced logins source
             reads the week before its first login, the global watermark stays at 0 and
             every payment of that week stays in the join's state; `max` (safe with pacing:
             no source reads past the stride of the batch) lets it move with the payments;
- slices:    two keyfill sources with `maxSlicesPerTrigger`, chosen so the query runs about
             as many micro-batches as the paced one;
- files:     the topics' source chunks, each written once as a Parquet file (timestamp, key,
             value), read by Spark's own file source with `maxFilesPerTrigger`, chosen alike.

    python -m bench.bench_join            # 500K payments, 3-hour strides (about 110 micro-batches a query)
    python -m bench.bench_join --quick    # 100K payments, 12-hour strides

Per query: peak join state (the largest numRowsTotal and memoryUsedBytes of the progress'
stateOperators), rows dropped by the watermark (numRowsDroppedByWatermark, summed),
micro-batches, wall time (start() to the end) and output rows, against the join computed
directly from the topics' records. Targets: paced peak state rows <= 1/10 of files' and <=
slices', no row dropped as late, paced time <= slices'. State sizes do not depend on the
machine's load; times do (the load average is printed with them).

Here the files and slices queries read the whole logins topic within their first batches
(it starts a week later, and a file or slice of logins spans more event time than one of
payments), so their peak state is about the logins topic plus a batch of payments, while a
paced query holds about a stride of payments: paced/files is about 20 / (strides + 20), below
1/10 from about 180 strides over the two weeks (`--stride "1 hour"`: 340 micro-batches a query),
whatever the number of records. A query's time grows with its state too: the hottest user
has 13% of the records (Zipf 1.1 over 100K users), and each of its rows is checked against
all of its rows in the other side's state.
"""

from __future__ import annotations

import argparse
import math
import os
import shutil
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

DAY_MS = 86_400_000
WITHIN, WITHIN_MS, DELAY = "10 minutes", 600_000, "1 minute"
PAYMENT_SLICE, LOGIN_SLICE = "1h", "30m"
FILE_SCHEMA = "`timestamp` timestamp, `key` binary, `value` binary"
STATE_TARGET = 0.1  # paced peak state rows / files'
WAYS = ("paced", "paced-max", "slices", "files")
POLICY = "spark.sql.streaming.multipleWatermarkPolicy"


@dataclass
class Topics:
    payments_src: str
    logins_src: str
    payments_url: str  # compacted
    logins_url: str


@dataclass
class Result:
    name: str
    option: str
    batches: int = 0
    rows_in: tuple[int, int] = (0, 0)  # payments, logins
    out: int = 0
    dropped: int = 0
    peak_rows: int = 0
    peak_bytes: int = 0
    peak_batch: int = 0
    seconds: float = 0.0
    state: list[int] = field(default_factory=list)  # state rows after each micro-batch
    first_logins: int = -1  # the first micro-batch with logins rows
    durations: dict[str, int] = field(default_factory=dict)  # durationMs summed over the micro-batches


def prepare(root: str, records: int, days: float, partitions: int, chunk_records: int, keys: int) -> Topics:
    """Both topics generated (seed 0) and compacted in process, cached under `root` (`_done`)."""
    from compactor.job import CompactConfig, compact
    from keyfill.synth.generate import GeneratorConfig, generate

    tag = f"{records}-{days:g}d-{partitions}p-{chunk_records}c-{keys}k"
    base = os.path.join(root, tag)
    t = Topics(*(os.path.join(base, n) for n in ("payments", "logins", "payments-compacted", "logins-compacted")))
    if Path(base, "_done").exists():
        return t
    shutil.rmtree(root, ignore_errors=True)  # one cache: a cache is replaced whole
    started = time.perf_counter()
    cfg = GeneratorConfig(
        out=t.payments_src,
        records=records,
        keys=keys,
        partitions=partitions,
        chunk_records=chunk_records,
        rate=records / (days * DAY_MS / 1000),
        seed=0,
        logins_out=t.logins_src,
        logins_after_ms=7 * DAY_MS,
    )
    g = generate(cfg, progress=False)
    took = time.perf_counter() - started
    print(f"generated {g.records:,} payments and {g.logins:,} logins in {took:.1f} s", flush=True)
    for src, dest, d in ((t.payments_src, t.payments_url, PAYMENT_SLICE), (t.logins_src, t.logins_url, LOGIN_SLICE)):
        started = time.perf_counter()
        r = compact(CompactConfig(source=src, dest=dest, groups=4, slice_duration=d, seal_all=True))  # no Spark
        print(f"compacted {dest}: {r.records:,} records, {r.slices} slices of {d} in {r.seconds:.1f} s", flush=True)
    Path(base, "_done").touch()
    return t


def source_records(src: str) -> list[tuple[str, int, pa.Table]]:
    """Each source chunk as (name, last event time ms, its timestamp, key and value), in name order."""
    from compactor.sources.envelope import build_index, read_chunk
    from keygroups.storage import open_storage

    store = open_storage(src)
    out = []
    for c in build_index(store).all_chunks():  # by topic, partition, first offset: the names' order
        b = read_chunk(store, c)
        ts = b.column("timestamp").cast(pa.timestamp("us", tz="UTC"))
        name = f"{c.topic}-{c.partition:05d}-{c.first_offset:020d}.parquet"
        table = pa.table({"timestamp": ts, "key": b.column("key"), "value": b.column("value")})
        out.append((name, c.max_timestamp, table))
    return out


def write_files(chunks: list[tuple[str, int, pa.Table]], dest: str, order: str) -> None:
    """Each chunk as one Parquet file under `dest`. Spark's file source takes files in order of
    modification time (FileStreamSource sorts its listing by it; ties stay in listing order):
    set, one second apart, to the order in which the chunks' last records happened (`closed`:
    the order a sink that closes chunks as they fill writes them) or to the names' order
    (`name`: partition by partition, as a copy of the archive would get them)."""
    shutil.rmtree(dest, ignore_errors=True)
    os.makedirs(dest)
    ranked = sorted(chunks, key=lambda c: (c[1], c[0])) if order == "closed" else chunks
    for rank, (name, _, table) in enumerate(ranked):
        path = os.path.join(dest, name)
        pq.write_table(table, path)
        os.utime(path, (1_700_000_000 + rank, 1_700_000_000 + rank))


def expected_joins(payments: pa.Table, logins: pa.Table) -> int:
    """How many payments (with a user) have a login by their user in [paid_at - WITHIN, paid_at]."""
    keys = pa.chunked_array(payments.column("key").chunks + logins.column("key").chunks).combine_chunks()
    codes = pc.dictionary_encode(keys).indices.fill_null(0).to_numpy(zero_copy_only=False)
    valid = keys.is_valid().to_numpy(zero_copy_only=False)
    ts = [t.column("timestamp").cast(pa.int64()).to_numpy() // 1000 for t in (payments, logins)]  # us -> ms
    t0 = min(x.min() for x in ts) - 2 * WITHIN_MS
    n = payments.num_rows
    pu, lu = codes[:n].astype(np.int64), codes[n:].astype(np.int64)
    pv, lv = valid[:n], valid[n:]
    login_at = np.sort((lu[lv] << 42) + (ts[1][lv] - t0))
    paid = (pu[pv] << 42) + (ts[0][pv] - t0)
    i = np.searchsorted(login_at, paid - WITHIN_MS, side="left")
    hit = i < len(login_at)
    hit[hit] = login_at[i[hit]] <= paid[hit]
    return int(hit.sum())


def measure(spark, name: str, option: str, payments_df, logins_df, ck: str, policy: str = "min") -> Result:
    """The join to a noop sink, Trigger.AvailableNow, under `policy` (multipleWatermarkPolicy)."""
    from jobs.fraud_join import fraud_join

    shutil.rmtree(ck, ignore_errors=True)
    joined = fraud_join(payments_df, logins_df, within=WITHIN, watermark_delay=DELAY)
    spark.conf.set(POLICY, policy)  # taken when the query starts (and kept in its checkpoint)
    started = time.perf_counter()
    q = joined.writeStream.format("noop").outputMode("append").option("checkpointLocation", ck)
    q = q.trigger(availableNow=True).start()
    q.awaitTermination()
    r = Result(name, option, seconds=time.perf_counter() - started)
    spark.conf.set(POLICY, "min")
    progress = q.recentProgress  # every one: the session keeps them all (numRecentProgressUpdates)
    shutil.rmtree(ck, ignore_errors=True)
    r.batches = len(progress)
    r.rows_in = tuple(sum(p["sources"][i]["numInputRows"] for p in progress) for i in (0, 1))
    r.out = sum(max(0, p["sink"].get("numOutputRows", 0)) for p in progress)
    for b, p in enumerate(progress):
        ops = p.get("stateOperators", [])
        rows = sum(op.get("numRowsTotal", 0) for op in ops)
        r.state.append(rows)
        if r.first_logins < 0 and p["sources"][1]["numInputRows"]:
            r.first_logins = b
        for k, v in p.get("durationMs", {}).items():
            r.durations[k] = r.durations.get(k, 0) + v
        r.dropped += sum(op.get("numRowsDroppedByWatermark", 0) for op in ops)
        r.peak_bytes = max(r.peak_bytes, sum(op.get("memoryUsedBytes", 0) for op in ops))
        if rows > r.peak_rows:
            r.peak_rows, r.peak_batch = rows, b
    return r


def keyfill_sources(spark, t: Topics, options: dict):
    return [spark.readStream.format("keyfill").options(**options).load(u) for u in (t.payments_url, t.logins_url)]


def profile(r: Result, points: int = 12) -> str:
    """State rows after every len/points-th micro-batch."""
    step = max(1, len(r.state) // points)
    return " ".join(f"{r.state[b]:,}" for b in range(0, len(r.state), step))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="100K payments, 12-hour strides")
    ap.add_argument("--records", type=int, default=None, help="payments (default 500K; --quick 100K)")
    ap.add_argument("--days", type=float, default=14.0, help="the payments' span of event time")
    ap.add_argument("--stride", default=None, help="paced: maxEventTimePerTrigger (default 3 hours; --quick 12 hours)")
    ap.add_argument("--max-slices-per-trigger", type=int, default=None, help="slices (default: the paced batch count)")
    ap.add_argument("--max-files-per-trigger", type=int, default=None, help="files (default: the paced batch count)")
    ap.add_argument("--file-order", choices=("closed", "name"), default="closed", help="the files' modification times")
    ap.add_argument("--partitions", type=int, default=4)
    ap.add_argument("--chunk-records", type=int, default=None, help="source chunk size (default records/800)")
    ap.add_argument("--keys", type=int, default=100_000)
    ap.add_argument("--shuffle-partitions", default="2")
    ap.add_argument("--ways", default=",".join(WAYS), help="of " + ",".join(WAYS))
    ap.add_argument("--dir", default="/tmp/keyfill-bench-join", help="topics and archives (cached)")
    args = ap.parse_args()
    records = args.records or (100_000 if args.quick else 500_000)
    stride = args.stride or ("12 hours" if args.quick else "3 hours")
    chunk_records = args.chunk_records or max(1, records // 800)
    ways = [w for w in WAYS if w in args.ways.split(",")]

    import reader.spark as rs
    from compactor.spark_session import local_spark
    from jobs.fraud_join import first_time
    from keygroups import compacted
    from keygroups.durations import parse_duration
    from keygroups.storage import open_storage

    began = time.perf_counter()
    t = prepare(args.dir, records, args.days, args.partitions, chunk_records, args.keys)
    chunks = {k: source_records(s) for k, s in (("payments", t.payments_src), ("logins", t.logins_src))}
    tables = {k: pa.concat_tables([c[2] for c in v]) for k, v in chunks.items()}
    expected = expected_joins(tables["payments"], tables["logins"])
    print(f"topics read and the join computed from them in {time.perf_counter() - began:.1f} s", flush=True)

    # the paced query's micro-batches: strides from the earlier archive's first to the later's last slice
    manifests = [compacted.load_manifest(open_storage(u)) for u in (t.payments_url, t.logins_url)]
    start = first_time([t.payments_url, t.logins_url])
    stride_ms = parse_duration(stride, option="--stride")
    end = max(m.bounds(m.slices - 1)[1] for m in manifests)
    strides = end // stride_ms - start // stride_ms
    nonempty = []  # slices with records, what maxSlicesPerTrigger counts
    for u in (t.payments_url, t.logins_url):
        planner = rs.ArchivePlanner(rs.Options.parse({"path": u}))
        nonempty.append(int((planner.slice_sizes(0, planner.manifest.slices)[0] > 0).sum()))
    max_slices = args.max_slices_per_trigger or max(1, math.ceil(max(nonempty) / strides))
    files = {k: len(v) for k, v in chunks.items()}
    max_files = args.max_files_per_trigger or max(1, math.ceil(max(files.values()) / strides))

    spark = local_spark(
        "local[2]",
        app="keyfill bench join",
        progress=False,
        conf={"spark.sql.streaming.numRecentProgressUpdates": "1000000", "spark.sql.session.timeZone": "UTC"},
    )
    spark.sparkContext.setLogLevel("ERROR")
    spark.conf.set("spark.sql.shuffle.partitions", args.shuffle_partitions)
    rs.register(spark)
    work = os.path.join(args.dir, "run")
    shutil.rmtree(work, ignore_errors=True)
    try:
        dirs = {k: os.path.join(work, k) for k in chunks}
        if "files" in ways:
            for k, v in chunks.items():
                write_files(v, dirs[k], args.file_order)
        paced = {"maxEventTimePerTrigger": stride, "startingTimestamp": str(start)}
        # warm-up (workers started, numba loaded, the JVM's join code compiled): the last two strides, paced
        last = {**paced, "startingTimestamp": str((end // stride_ms - 2) * stride_ms)}
        warm = measure(spark, "warm", "", *keyfill_sources(spark, t, last), os.path.join(work, "ck-warm"))
        took = time.perf_counter() - began
        print(f"session, files and warm-up ({warm.batches} batches, {warm.seconds:.1f} s): {took:.1f} s", flush=True)
        results = []
        for w in ways:
            if w.startswith("paced"):
                option = f"maxEventTimePerTrigger={stride}, startingTimestamp={start}"
                option += ", policy max" if w == "paced-max" else ""
                dfs = keyfill_sources(spark, t, paced)
            elif w == "slices":
                option = f"maxSlicesPerTrigger={max_slices}"
                dfs = keyfill_sources(spark, t, {"maxSlicesPerTrigger": str(max_slices)})
            else:
                option = f"maxFilesPerTrigger={max_files}"
                dfs = [
                    spark.readStream.schema(FILE_SCHEMA).option("maxFilesPerTrigger", max_files).parquet(dirs[k])
                    for k in ("payments", "logins")
                ]
            load = os.getloadavg()[0]
            policy = "max" if w == "paced-max" else "min"
            r = measure(spark, w, option, *dfs, os.path.join(work, f"ck-{w}"), policy)
            print(f"{w}: {r.batches} micro-batches, {r.seconds:.1f} s (load average {load:.1f} before)", flush=True)
            results.append(r)
    finally:
        spark.stop()
        shutil.rmtree(work, ignore_errors=True)

    p, lg = tables["payments"].num_rows, tables["logins"].num_rows
    print(
        f"\n{p:,} payments over {args.days:g} days ({args.partitions} partitions, {files['payments']} source chunks, "
        f"slices of {PAYMENT_SLICE}) and {lg:,} logins from day 7 ({files['logins']} chunks, slices of {LOGIN_SLICE}); "
        f"fraud_join within {WITHIN}, watermark delay {DELAY}; local[2], {args.shuffle_partitions} shuffle partitions, "
        f"noop sink, Trigger.AvailableNow; {expected:,} payments with a login computed from the records; "
        f"a stride of {stride} holds about {p / strides:,.0f} payments"
    )
    print(
        "files: Spark's file source takes files in modification-time order (ties in listing order); here "
        + (
            "the order of each chunk's last event time (a sink closing chunks as they fill)"
            if args.file_order == "closed"
            else "the names' order (partition by partition)"
        )
    )
    head = f"{'way':<9} {'option':<70} {'batches':>7} {'rows in (pay/login)':>20} {'out':>8} {'dropped':>8}"
    print(head + f" {'peak state rows':>15} {'peak MB':>8} {'@batch':>7} {'time s':>7}")
    for r in results:
        rows = f"{r.rows_in[0]:,}/{r.rows_in[1]:,}"
        out = f"{r.out:,}" + ("" if r.out == expected else "!")
        print(
            f"{r.name:<9} {r.option:<70} {r.batches:>7} {rows:>20} {out:>8} {r.dropped:>8,} "
            f"{r.peak_rows:>15,} {r.peak_bytes / 1e6:>8.1f} {r.peak_batch:>7} {r.seconds:>7.1f}"
        )
    print(f"load average after: {' '.join(f'{x:.1f}' for x in os.getloadavg())} (2 cores)")
    by = {r.name: r for r in results}
    for r in results:
        if r.rows_in != (p, lg):
            print(f"{r.name}: read {r.rows_in[0]:,}/{r.rows_in[1]:,} rows, not {p:,}/{lg:,}")
        if r.out != expected:
            print(
                f"{r.name}: {r.out:,} output rows, not {expected:,} ({r.out - expected:+,}; "
                f"{r.dropped:,} rows dropped as late)"
            )
        print(
            f"{r.name}: state rows by batch (every {max(1, len(r.state) // 12)}th): {profile(r)}; "
            f"peak at batch {r.peak_batch}, the first logins rows in batch {r.first_logins}"
        )
        top = sorted(r.durations.items(), key=lambda kv: -kv[1])[:5]
        print(f"{r.name}: ms a batch: " + ", ".join(f"{k} {v / max(1, r.batches):.0f}" for k, v in top))
    for name in ("paced", "paced-max"):
        if name not in by:
            continue
        a = by[name]
        for ref, bound in (("files", STATE_TARGET), ("slices", 1.0)):
            if ref in by:
                b = by[ref]
                rows = a.peak_rows / b.peak_rows if b.peak_rows else float("inf")
                mem = a.peak_bytes / b.peak_bytes if b.peak_bytes else float("inf")
                secs = a.seconds / b.seconds
                print(
                    f"{name}/{ref}: peak state rows {rows:.3f}x (target <= {bound:g}: "
                    f"{'ok' if rows <= bound else 'missed'}), peak state bytes {mem:.3f}x, time {secs:.2f}x"
                    + (f" (target <= 1: {'ok' if secs <= 1 else 'missed'})" if ref == "slices" else "")
                )
        print(f"{name}: {a.dropped} rows dropped as late (target 0: {'ok' if a.dropped == 0 else 'missed'})")
    return 0


if __name__ == "__main__":
    sys.exit(main())

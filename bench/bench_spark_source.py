"""Rows/s of `format("keyfill")` against two references over the same records, in one
local[2] Spark session (issue 43):

- trivial: a Python data source that plans keyfill's micro-batches and input partitions
  (it subclasses keyfill's stream reader) and, in `read()`, yields prebuilt Arrow batches:
  the partition's own records as keyfill yields them, a batch per piece as keyfill cuts
  them, built once per Python worker and partition (the same partitions recur every round),
  doing nothing per batch: the ceiling of PySpark's Python Data Source path on this machine;
- parquet: the same records as Parquet files (written once, a micro-batch of keyfill's per
  set of files, in order), read by Spark's own file source with `maxFilesPerTrigger` set so
  it runs the same micro-batches.

    python -m bench.bench_spark_source            # 2M records (generated and compacted once, cached)
    python -m bench.bench_spark_source --quick    # 400K records, one run per row

Two queries, each with Trigger.AvailableNow to a noop sink: the source only (`key`,
`timestamp`, `length(value)`, and `size(headers)` with headers), and a 10 s watermark plus
a 1-minute window count per key; each without and with `includeHeaders=true`. The sources
alternate within a round, best of --repeat rounds. Rows/s are over the micro-batches (the
sum of their triggerExecution: no query start-up), the whole query's in brackets.
Targets: keyfill >= 0.9x trivial on both queries, >= 0.75x parquet on the windowed one.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa

import reader.spark as rs
from bench.archives import cached_compacted
from keygroups import worker_gc

TRIVIAL_TARGET, PARQUET_TARGET = 0.9, 0.75
SOURCES = ("trivial", "keyfill", "parquet")
_RECORDS: dict[str, tuple[pa.Table, dict[tuple[int, int], tuple[int, int]]]] = {}
_PREBUILT: dict[tuple[str, tuple], list[pa.RecordBatch]] = {}


def prebuilt(path: str, pieces: tuple, rows: int) -> list[pa.RecordBatch]:
    """The records of `pieces`, as keyfill yields them, a batch per piece (of at most `rows`):
    keyfill's batches are its decode steps, ~1 MiB of compressed records, here a piece, and
    the JVM takes batches of 65,536 rows at ~1.4x the CPU per row of these. Built once per
    Python worker and partition (the same partitions come back in every round), from the
    archive's records written by `write_records` (memory-mapped: read once, not copied)."""
    key = (path, tuple((p.group, p.slice) for p in pieces))
    if key not in _PREBUILT:
        if path not in _RECORDS:
            with pa.memory_map(path) as f:
                reader = pa.ipc.open_file(f)
                index = json.loads(reader.schema.metadata[b"pieces"])
                _RECORDS[path] = reader.read_all(), {(g, s): (a, z) for g, s, a, z in index}
        table, where = _RECORDS[path]
        pieces = (table.slice(a, z - a).combine_chunks() for a, z in (where[k] for k in key[1]))
        _PREBUILT[key] = [b for t in pieces for b in t.to_batches(max_chunksize=rows)]
    return _PREBUILT[key]


class TrivialStreamReader(rs.KeyfillStreamReader):
    """keyfill's offsets and input partitions; `read()` yields the partition's records in
    prebuilt batches (the same records as keyfill's, so a windowed query keeps the same
    state: repeating one batch would make its aggregation cheaper than the real one)."""

    def __init__(self, opts: rs.Options, records_path: str):
        super().__init__(opts)
        self.records_path = records_path

    def read(self, partition: rs.GroupsPartition) -> Iterator[pa.RecordBatch]:
        worker_gc.settle()  # as keyfill's read: its worker holds the same modules (numba) to collect
        return iter(prebuilt(self.records_path, partition.pieces, self.opts.batch_size))


class TrivialDataSource(rs.KeyfillDataSource):
    @classmethod
    def name(cls) -> str:
        return "keyfill_trivial"

    def _opts(self) -> dict[str, str]:  # keyfill refuses options it does not know
        return {k: v for k, v in self.options.items() if k.lower() != "prebuilt"}

    def schema(self) -> str:
        return rs.schema_ddl(rs.Options.parse(self._opts()).include_headers)

    def streamReader(self, schema):
        return TrivialStreamReader(rs.Options.parse(self._opts()), self.options["prebuilt"])


def write_records(url: str, path: str, headers: bool) -> None:
    """Every record of the archive as keyfill yields them, piece by piece, in one Arrow file
    whose metadata says where each piece's rows are (group, slice, first row, end row)."""
    planner = rs.SourcePlanner(rs.Options.parse({"path": url, "includeHeaders": str(headers).lower()}))
    batches, index, at = [], [], 0
    for part in planner.plan(0, planner.manifest.slices):
        for piece in part.pieces:
            got = list(planner.read(rs.GroupsPartition((piece,), part.topic)))
            n = sum(b.num_rows for b in got)
            assert n == piece.records
            batches += got
            index.append((piece.group, piece.slice, at, at + n))
            at += n
    schema = rs.arrow_schema(headers).with_metadata({"pieces": json.dumps(index)})
    with pa.OSFile(path, "wb") as f, pa.ipc.new_file(f, schema) as w:
        for b in batches:
            w.write_batch(pa.RecordBatch.from_arrays(b.columns, schema=schema))


def write_parquet(spark, url: str, dest: str, opts: dict) -> tuple[int, int]:
    """The archive's records (with headers) as Parquet files under `dest`, written by a
    keyfill query with `opts`: each micro-batch as `files` files whose modification times
    follow the batch order, so a file source with maxFilesPerTrigger=files runs the same
    batches. Cached (`_done` holds files and batches)."""
    done = Path(dest, "_done")
    if done.exists():
        files, batches = map(int, done.read_text().split())
        return files, batches
    shutil.rmtree(dest, ignore_errors=True)
    staging = dest + ".staging"
    shutil.rmtree(staging, ignore_errors=True)
    ck = dest + ".checkpoint"
    shutil.rmtree(ck, ignore_errors=True)
    files = int(opts.get("numPartitions") or spark.sparkContext.defaultParallelism)

    def write(df, batch_id: int) -> None:
        df.repartition(files).write.parquet(os.path.join(staging, f"{batch_id:06d}"))

    df = spark.readStream.format("keyfill").option("includeHeaders", "true")
    for k, v in opts.items():
        df = df.option(k, v)
    q = df.load(url).writeStream.foreachBatch(write).option("checkpointLocation", ck).trigger(availableNow=True)
    q.start().awaitTermination()
    os.makedirs(dest)
    batches = sorted(os.listdir(staging))
    for b, name in enumerate(batches):
        parts = sorted(p for p in os.listdir(os.path.join(staging, name)) if p.endswith(".parquet"))
        assert len(parts) == files, f"batch {name}: {len(parts)} files, not {files}"
        for p in parts:
            target = os.path.join(dest, f"{name}-{p}")
            os.rename(os.path.join(staging, name, p), target)
            os.utime(target, (1_700_000_000 + b, 1_700_000_000 + b))  # listing order = batch order
    shutil.rmtree(staging)
    shutil.rmtree(ck)
    done.write_text(f"{files} {len(batches)}")
    return files, len(batches)


def query(spark, source: str, url: str, opts: dict, headers: bool, windowed: bool, extra: dict):
    from pyspark.sql import functions as F

    if source == "parquet":
        df = spark.readStream.schema(rs.schema_ddl(headers)).option("maxFilesPerTrigger", extra["files"])
        df = df.parquet(extra["parquet"])
    else:
        df = spark.readStream.format("keyfill" if source == "keyfill" else "keyfill_trivial")
        for k, v in {**opts, "includeHeaders": str(headers).lower()}.items():
            df = df.option(k, v)
        if source == "trivial":
            df = df.option("prebuilt", extra["prebuilt"][headers])
        df = df.load(url)
    if windowed:
        return df.withWatermark("timestamp", "10 seconds").groupBy(F.window("timestamp", "1 minute"), "key").count()
    cols = [F.col("key"), F.col("timestamp"), F.length("value").alias("value_length")]
    return df.select(*cols, *([F.size("headers").alias("headers_size")] if headers else []))


class CpuSampler:
    """CPU seconds of the JVM (its threads) and of the Python workers that run its tasks
    (`pyspark.daemon pyspark.worker` processes: daemons and the workers they fork), from
    /proc every 0.1 s while a query runs: a worker's ticks are its own, whenever it exits
    (reaped ones would otherwise move to a parent, or be lost with it). Left out: the Python
    processes that plan queries (their start-up is per query, not per row)."""

    def __init__(self, jvm: int) -> None:
        self.jvm = jvm
        self.first: dict[int, int] = {}
        self.last: dict[int, int] = {}
        self._workers: dict[int, bool] = {}  # pid -> a task worker (cmdline read once)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _poll(self, baseline: bool = False) -> None:
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            pid = int(entry)
            if self._workers.get(pid) is False:
                continue
            try:
                stat = Path("/proc", entry, "stat").read_text()
                fields = stat[stat.rindex(")") + 2 :].split()
                if pid not in self._workers:  # this JVM's, a daemon or a worker it forked (not another session's)
                    parent = int(fields[1])
                    cmd = Path("/proc", entry, "cmdline").read_bytes()
                    ours = parent == self.jvm or self._workers.get(parent, False)
                    self._workers[pid] = pid == self.jvm or (ours and cmd.endswith(b"pyspark.worker\0"))
            except OSError:
                continue
            if not self._workers[pid]:
                continue
            ticks = int(fields[11]) + int(fields[12])  # utime + stime, its own (all its threads)
            if baseline:
                self.first[pid] = ticks
            else:
                self.first.setdefault(pid, 0)  # started during the query: all its ticks count
            self.last[pid] = ticks

    def _run(self) -> None:
        while not self._stop.wait(0.1):
            self._poll()

    def __enter__(self) -> CpuSampler:
        self._poll(baseline=True)  # what every process had used before: not the query's
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self._poll()

    def seconds(self) -> tuple[float, float]:
        """(JVM, Python task workers)."""
        hz = os.sysconf("SC_CLK_TCK")
        used = {pid: t - self.first[pid] for pid, t in self.last.items()}
        jvm = used.pop(self.jvm, 0)
        return jvm / hz, sum(used.values()) / hz


def measure(spark, df, ck: str) -> tuple[int, float, float, int, float, float]:
    """Rows, seconds inside micro-batches (no query start-up), seconds from start() to the
    end, micro-batches with rows, CPU seconds of the JVM and of the Python task workers."""
    shutil.rmtree(ck, ignore_errors=True)
    with CpuSampler(spark.sparkContext._gateway.proc.pid) as cpu:
        started = time.perf_counter()
        q = df.writeStream.format("noop").outputMode("append").option("checkpointLocation", ck)
        q = q.trigger(availableNow=True).start()
        q.awaitTermination()
        wall = time.perf_counter() - started
    progress = [p for p in q.recentProgress if p["numInputRows"]]
    in_batches = sum(p["durationMs"].get("triggerExecution", 0) for p in q.recentProgress) / 1000
    shutil.rmtree(ck, ignore_errors=True)
    return sum(p["numInputRows"] for p in progress), in_batches, wall, len(progress), *cpu.seconds()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="400K records, one run per row")
    ap.add_argument("--records", type=int, default=None, help="records (default 2M; --quick 400K)")
    ap.add_argument("--groups", type=int, default=16)
    ap.add_argument("--slice-duration", default="2m")
    ap.add_argument("--max-slices-per-trigger", default="4", help="keyfill's option ('' for its default)")
    ap.add_argument("--num-partitions", default="", help="keyfill's option ('' for its default: the cores)")
    ap.add_argument("--batch-size", default="", help="keyfill's batchSize, the trivial source's rows a batch")
    ap.add_argument("--repeat", type=int, default=None, help="rounds, best kept (default 2; --quick 1)")
    ap.add_argument("--sources", default=",".join(SOURCES), help="of " + ",".join(SOURCES))
    ap.add_argument("--headers", default="off,on", help="off, on or both (off,on)")
    ap.add_argument("--queries", default="source,windowed")
    ap.add_argument("--dir", default="/tmp/keyfill-bench-spark-source", help="archive and Parquet cache")
    args = ap.parse_args()
    args.records = args.records or (400_000 if args.quick else 2_000_000)
    repeat = args.repeat or (1 if args.quick else 2)
    sources = [s for s in SOURCES if s in args.sources.split(",")]
    headers_cases = [h == "on" for h in args.headers.split(",")]
    queries = [q == "windowed" for q in args.queries.split(",")]

    # Workers import the trivial source by reference (bench.bench_spark_source), so its batch
    # is read once per Python worker instead of travelling with each task: they need the
    # checkout (where `python -m bench...` runs) on their path.
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [os.getcwd(), os.environ.get("PYTHONPATH")]))
    from bench.bench_spark_source import TrivialDataSource
    from compactor.spark_session import local_spark

    spark = local_spark("local[2]", app="keyfill bench spark source", progress=False)
    spark.sparkContext.setLogLevel("ERROR")
    spark.conf.set("spark.sql.shuffle.partitions", "4")
    rs.register(spark)
    spark.dataSource.register(TrivialDataSource)
    tmp = tempfile.mkdtemp(prefix="keyfill-bench-spark-")
    try:
        root = os.path.join(args.dir, str(args.records))  # one cache per size: a cache is replaced whole
        url = cached_compacted(root, args.records, args.groups, args.slice_duration, lambda: spark, seal_all=True)
        opts = {
            "maxSlicesPerTrigger": args.max_slices_per_trigger,
            "numPartitions": args.num_partitions,
            "batchSize": args.batch_size,
        }
        opts = {k: v for k, v in opts.items() if v}
        planner = rs.SourcePlanner(rs.Options.parse({"path": url}))
        expected = int(planner.slice_sizes(0, planner.manifest.slices)[0].sum())
        batch_rows = rs.Options.parse({"path": url, **opts}).batch_size
        extra: dict = {"prebuilt": {}}
        for h in (False, True):
            extra["prebuilt"][h] = os.path.join(tmp, f"records-{h}.arrow")
            write_records(url, extra["prebuilt"][h], h)
        if "parquet" in sources:
            tag = "-".join(f"{k}={v}" for k, v in sorted(opts.items()) if k != "batchSize")
            extra["parquet"] = url.rstrip("/") + f".parquet-{tag}"
            extra["files"], _ = write_parquet(spark, url, extra["parquet"], opts)
        for s in sources:  # workers started, numba compiled and loaded, the JVM's code warm
            measure(spark, query(spark, s, url, opts, True, True, extra), os.path.join(tmp, "warm"))
        if "trivial" in sources:  # its batches built in the workers (where a task of each partition ran)
            for h in headers_cases:
                measure(spark, query(spark, "trivial", url, opts, h, False, extra), os.path.join(tmp, "warm"))
        results: dict[tuple[bool, bool, str], tuple[float, float, int]] = {}
        cpu: dict[tuple[bool, bool, str], tuple[float, float]] = {}
        for i in range(repeat):  # alternating, so every source sees the same machine
            for h in headers_cases:
                for w in queries:
                    for s in sources:
                        df = query(spark, s, url, opts, h, w, extra)
                        n, in_batches, wall, batches, jvm, py = measure(spark, df, os.path.join(tmp, f"ck-{i}"))
                        assert n == expected, f"{s}: {n} rows, not {expected}"
                        best = results.get((h, w, s), (0.0, 0.0, 0))
                        results[(h, w, s)] = (max(best[0], n / in_batches), max(best[1], n / wall), batches)
                        least = cpu.get((h, w, s), (1e9, 1e9))
                        cpu[(h, w, s)] = (min(least[0], jvm / n * 1e6), min(least[1], py / n * 1e6))
                        print(
                            f"round {i + 1}: {s:<8} headers={'on' if h else 'off':<4} windowed={w!s:<5} "
                            f"{n / in_batches:>10,.0f} rows/s, CPU per row {jvm / n * 1e6:.2f} us JVM, "
                            f"{py / n * 1e6:.2f} us Python",
                            flush=True,
                        )
        print(
            f"\n{expected:,} records, {args.groups} groups, slices of {args.slice_duration}, local[2], "
            f"keyfill options {opts or 'default'}, batchSize {batch_rows}, best of {repeat}"
        )
        print("rows/s over the micro-batches (over the whole query, start-up included, in brackets)")
        head = f"{'query':<31} {'headers':<8}" + "".join(f"{s:>23}" for s in sources)
        ratios = [s for s in ("trivial", "parquet") if s in sources and "keyfill" in sources]
        print(head + "".join(f"{'keyfill/' + s:>20}" for s in ratios))
        for h in headers_cases:
            for w in queries:
                name = "watermark + 1-min window count" if w else "source only"
                line = f"{name:<31} {'on' if h else 'off':<8}"
                for s in sources:
                    rate, wall_rate, _ = results[(h, w, s)]
                    line += f"{rate:>12,.0f} ({wall_rate:>8,.0f})"
                for s in ratios:
                    kf, ref = results[(h, w, "keyfill")], results[(h, w, s)]
                    target = TRIVIAL_TARGET if s == "trivial" else (PARQUET_TARGET if w else None)
                    mark = "" if target is None else (" ok" if kf[0] / ref[0] >= target else " low")
                    line += f"{kf[0] / ref[0]:>9.2f}x ({kf[1] / ref[1]:.2f}x){mark}"
                print(line)
        # On a busy machine rows/s swing with the load; CPU per row much less. Where every
        # core is busy, rows/s follow its inverse: the ratios of CPU per row are printed too.
        print("\nCPU us per row (least of the rounds): the JVM / the Python task workers")
        print(
            f"{'query':<31} {'headers':<8}"
            + "".join(f"{s:>23}" for s in sources)
            + "".join(f"{'keyfill/' + s:>20}" for s in ratios)
        )
        for h in headers_cases:
            for w in queries:
                name = "watermark + 1-min window count" if w else "source only"
                line = f"{name:<31} {'on' if h else 'off':<8}"
                for s in sources:
                    line += f"{cpu[(h, w, s)][0]:>15.2f} / {cpu[(h, w, s)][1]:.2f}"
                for s in ratios:
                    line += f"{sum(cpu[(h, w, s)]) / sum(cpu[(h, w, 'keyfill')]):>19.2f}x"
                print(line)
        batches = {results[k][2] for k in results}
        print(f"micro-batches per query: {sorted(batches)}")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())

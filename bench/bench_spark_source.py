"""`format("keyfill")` timed as a user times a query: from `start()` to the end of
`awaitTermination()`, Trigger.AvailableNow to a `noop` sink, every source at its defaults,
against two references over the same records in the same local[2] session:

- python: the best a Python data source reaches on this path: one that yields prebuilt Arrow
  batches of the same records and columns as keyfill's (4 input partitions, the records
  memory-mapped from files written once, nothing else per batch), at each of --python-rows
  rows a batch; the best of them is the ceiling;
- python+decode: the same prebuilt source, each task also reading and decoding its share of
  keyfill's pieces (keyfill's task side, the records dropped) as it hands over batches: what
  any source that must decode this archive in Python can reach;
- parquet: the same records as Parquet files (written once by Spark), read by Spark's own file
  source at its defaults (every file in one micro-batch).

and keyfill-schema: keyfill given the three columns the queries use by `.schema(...)`, so
the other six never reach the JVM (not a default: a query opts in).

    python -m bench.bench_spark_source                    # 2M records (generated and compacted once, cached)
    python -m bench.bench_spark_source --records 10000000
    python -m bench.bench_spark_source --quick            # 400K records, one round
    python -m bench.bench_spark_source --installed-pyspark  # workers import pip's byte-compiled pyspark

The archive: --records generated records (8 partitions, 20K keys, headers in the archive),
compacted with 16 groups, `--seal-all`, the slice length the compactor derives. Two queries:
the source only (`key`, `timestamp`, `length(value)`), and a 10 s watermark with a 1-minute
window, count and sum of value lengths per key (4 shuffle partitions). Sources alternate
within a round; best of --repeat rounds. A second table explains the first: seconds inside
micro-batches (their triggerExecution: no query start), the number of micro-batches, and CPU
per row in the JVM and in the Python task workers, and the query's start: from `start()` to
its first micro-batch (for a Python source, mostly the process Spark starts to plan it, which
imports pyspark from Spark's pyspark.zip and compiles it: the zip holds no bytecode).
`--installed-pyspark` runs every Python worker of the session, that process included, with
pip's installed (byte-compiled) pyspark instead (tests/spark-conf/worker-python): the same code,
what Spark's start costs every Python source.
Targets: keyfill >= 0.9x python on both queries, >= 0.75x parquet on the windowed one.
"""

from __future__ import annotations

import argparse
import os
import pickle
import shutil
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import pyarrow as pa

import reader.spark as rs
from bench.archives import cached_compacted
from reader.spark.enumerator import ArchivePlanner
from reader.spark.options import Options
from reader.spark.rows import arrow_schema, schema_ddl
from reader.spark.split_reader import read_archive

PYTHON_TARGET, PARQUET_TARGET = 0.9, 0.75
PYTHON_PARTITIONS = 4
QUERIES = ("source", "windowed")
DECODING = "python+decode"  # the prebuilt source, decoding keyfill's pieces as it goes
SCHEMA = "keyfill-schema"  # keyfill given the queries' columns by `.schema()`: the rest never reach the JVM
QUERY_COLUMNS = "key binary, value binary, timestamp timestamp"  # what both queries use


def write_records(url: str, dest: str) -> list[str]:
    """Every record of the archive as keyfill yields them (its schema), in PYTHON_PARTITIONS
    Arrow files of about equal rows, each one contiguous chunk (cached under `dest`)."""
    files = [os.path.join(dest, f"part-{i}.arrow") for i in range(PYTHON_PARTITIONS)]
    if Path(dest, "_done").exists():
        return files
    shutil.rmtree(dest, ignore_errors=True)
    os.makedirs(dest)
    planner = ArchivePlanner(Options.parse({"path": url}))
    batches = [b for part in planner.plan(0, planner.manifest.slices) for b in read_archive(planner.opts, part)]
    table = pa.Table.from_batches(batches, arrow_schema(False)).combine_chunks()
    per = -(-table.num_rows // PYTHON_PARTITIONS)
    for i, path in enumerate(files):
        with pa.OSFile(path, "wb") as f, pa.ipc.new_file(f, table.schema) as w:
            w.write_table(table.slice(i * per, per))
    Path(dest, "_done").touch()
    return files


def write_partitions(url: str, path: str) -> str:
    """keyfill's input partitions of the whole archive, one per Python source partition, pickled."""
    planner = ArchivePlanner(Options.parse({"path": url, "numPartitions": str(PYTHON_PARTITIONS)}))
    with open(path, "wb") as f:
        pickle.dump(planner.plan(0, planner.manifest.slices), f)
    return path


def write_parquet(spark, url: str, dest: str) -> None:
    """The archive's records (keyfill's columns) as Parquet files, written by Spark at its
    defaults from a batch read of the archive (cached: `_done`)."""
    if Path(dest, "_done").exists():
        return
    shutil.rmtree(dest, ignore_errors=True)
    spark.read.format("keyfill").load(url).write.parquet(dest)
    Path(dest, "_done").touch()


def query(spark, source: str, url: str, windowed: bool, extra: dict):
    from pyspark.sql import functions as F

    if source == "parquet":
        df = spark.readStream.schema(schema_ddl(False)).parquet(extra["parquet"])
    elif source.startswith("python"):
        df = spark.readStream.format("prebuilt").option("files", ",".join(extra["files"]))
        if source.startswith(DECODING):
            df = df.option("decode", extra["decode"]).option("url", url)
        df = df.option("rows", source.split("-")[-1]).load()
    elif source == SCHEMA:
        df = spark.readStream.format("keyfill").schema(QUERY_COLUMNS).load(url)
    else:
        df = spark.readStream.format("keyfill").load(url)
    if windowed:
        df = df.withWatermark("timestamp", "10 seconds").groupBy(F.window("timestamp", "1 minute"), "key")
        return df.agg(F.count("*").alias("records"), F.sum(F.length("value")).alias("value_bytes"))
    return df.select("key", "timestamp", F.length("value").alias("value_length"))


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


@dataclass
class Run:
    rows: int
    wall: float  # start() to the end of awaitTermination()
    to_first: float  # start() to the first micro-batch's start: the query's start
    in_batches: float  # the micro-batches' triggerExecution, summed
    batches: int  # micro-batches with rows
    all_batches: int  # with those without: a windowed query's last emits its windows
    jvm_cpu: float
    python_cpu: float


def measure(spark, df, ck: str) -> Run:
    shutil.rmtree(ck, ignore_errors=True)
    with CpuSampler(spark.sparkContext._gateway.proc.pid) as cpu:
        epoch, started = time.time(), time.perf_counter()
        q = df.writeStream.format("noop").outputMode("append").option("checkpointLocation", ck)
        q = q.trigger(availableNow=True).start()
        q.awaitTermination()
        wall = time.perf_counter() - started
    progress = [p for p in q.recentProgress if p["numInputRows"]]
    in_batches = sum(p["durationMs"].get("triggerExecution", 0) for p in q.recentProgress) / 1000
    shutil.rmtree(ck, ignore_errors=True)
    rows = sum(p["numInputRows"] for p in progress)
    first = datetime.fromisoformat(q.recentProgress[0]["timestamp"].replace("Z", "+00:00")).timestamp() - epoch
    return Run(rows, wall, first, in_batches, len(progress), len(q.recentProgress), *cpu.seconds())


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="400K records, one round")
    ap.add_argument("--records", type=int, default=None, help="records (default 2M; --quick 400K)")
    ap.add_argument("--repeat", type=int, default=None, help="rounds, best kept (default 2; --quick 1)")
    ap.add_argument("--python-rows", default="16384,65536,262144", help="the Python source's rows a batch, swept")
    ap.add_argument("--queries", default=",".join(QUERIES))
    ap.add_argument(
        "--installed-pyspark",
        action="store_true",
        help="Python workers import pip's byte-compiled pyspark, not Spark's pyspark.zip",
    )
    ap.add_argument("--dir", default="/tmp/keyfill-bench-spark-source", help="archive and Parquet cache")
    args = ap.parse_args()
    records = args.records or (400_000 if args.quick else 2_000_000)
    repeat = args.repeat or (1 if args.quick else 2)
    queries = [q for q in QUERIES if q in args.queries.split(",")]
    pythons = [f"python-{int(r)}" for r in args.python_rows.split(",")]
    sources = ["keyfill", SCHEMA, *pythons, f"{DECODING}-65536", "parquet"]

    # Workers import the Python source by reference (bench.python_source): they need the
    # checkout (where `python -m bench...` runs) on their path.
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [os.getcwd(), os.environ.get("PYTHONPATH")]))
    if args.installed_pyspark:  # before the session: every Python worker it starts
        os.environ["PYSPARK_PYTHON"] = os.path.join(os.getcwd(), "tests", "spark-conf", "worker-python")
        os.environ["KEYFILL_TESTS_PYTHON"] = sys.executable
    from bench.python_source import PrebuiltDataSource
    from compactor.spark_session import local_spark

    spark = local_spark("local[2]", app="keyfill bench spark source", progress=False)
    spark.sparkContext.setLogLevel("ERROR")
    spark.conf.set("spark.sql.shuffle.partitions", "4")
    rs.register(spark)
    spark.dataSource.register(PrebuiltDataSource)
    tmp = tempfile.mkdtemp(prefix="keyfill-bench-spark-")
    try:
        root = os.path.join(args.dir, str(records))  # one cache per size: a cache is replaced whole
        url = cached_compacted(
            root, records, 16, None, lambda: spark, seal_all=True, keys=20_000, partitions=8, rate=1_000.0
        )
        extra = {"files": write_records(url, url.rstrip("/") + ".arrow"), "parquet": url.rstrip("/") + ".parquet"}
        extra["decode"] = write_partitions(url, os.path.join(tmp, "partitions.pickle"))
        write_parquet(spark, url, extra["parquet"])
        for s in sources:  # workers started, numba compiled and loaded, the JVM's code warm
            measure(spark, query(spark, s, url, True, extra), os.path.join(tmp, "warm"))
        runs: dict[tuple[str, str], list[Run]] = {}
        for i in range(repeat):  # alternating, so every source sees the same machine
            for q in queries:
                for s in sources:
                    run = measure(spark, query(spark, s, url, q == "windowed", extra), os.path.join(tmp, f"ck-{i}"))
                    assert run.rows == records, f"{s}: {run.rows} rows, not {records}"
                    runs.setdefault((q, s), []).append(run)
                    print(
                        f"round {i + 1}: {q:<9} {s:<14} {run.wall:6.2f} s, {records / run.wall:>10,.0f} rows/s "
                        f"({run.batches} micro-batches with rows of {run.all_batches}, {run.in_batches:.2f} s in them)",
                        flush=True,
                    )
        report(runs, queries, pythons, records, repeat, sources)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        spark.stop()
    return 0


def report(
    runs: dict[tuple[str, str], list[Run]],
    queries: list[str],
    pythons: list[str],
    n: int,
    repeat: int,
    sources: list[str],
) -> None:
    best = {k: min(v, key=lambda r: r.wall) for k, v in runs.items()}
    print(
        f"\n{n:,} records, local[2], every source at its defaults, whole query (start() to the end), best of {repeat}"
    )
    decoding = next(s for s in sources if s.startswith(DECODING))
    print(
        f"{'query':<10}{'keyfill':>11}{'python (rows)':>21}{'parquet':>11}{'keyfill/python':>16}"
        f"{'keyfill/parquet':>17}{'keyfill/(python+decode)':>25}{'schema/python':>15}{'schema/parquet':>16}"
    )
    for q in queries:
        top = min(pythons, key=lambda s: best[(q, s)].wall)
        kf, py, pq, dec, sch = (n / best[(q, s)].wall for s in ("keyfill", top, "parquet", decoding, SCHEMA))
        py_mark = " ok" if kf / py >= PYTHON_TARGET else " low"
        pq_mark = "" if q != "windowed" else (" ok" if kf / pq >= PARQUET_TARGET else " low")
        print(
            f"{q:<10}{kf:>11,.0f}{py:>11,.0f} ({top.split('-')[-1]:>7}){pq:>11,.0f}"
            f"{kf / py:>12.2f}x{py_mark:<4}{kf / pq:>12.2f}x{pq_mark:<4}{kf / dec:>20.2f}x"
            f"{sch / py:>14.2f}x{sch / pq:>15.2f}x"
        )
    print("rows/s; python+decode: the prebuilt source, each task also decoding its share of keyfill's pieces;")
    print(f"schema: keyfill given the queries' columns ({QUERY_COLUMNS}) by .schema(), not at its defaults")
    print(
        "\nwhere the time went (best run of each): seconds from start() to the first micro-batch and in "
        "micro-batches, micro-batches (with rows/all), CPU us a row"
    )
    print(
        f"{'query':<10}{'source':<22}{'whole s':>9}{'start s':>9}{'batches s':>11}{'batches':>9}{'JVM us':>9}"
        f"{'Python us':>11}"
    )
    for q in queries:
        for s in sources:
            r = best[(q, s)]
            print(
                f"{q:<10}{s:<22}{r.wall:>9.2f}{r.to_first:>9.2f}{r.in_batches:>11.2f}{f'{r.batches}/{r.all_batches}':>9}"
                f"{r.jvm_cpu / n * 1e6:>9.2f}{r.python_cpu / n * 1e6:>11.2f}"
            )


if __name__ == "__main__":
    sys.exit(main())

"""Rows/s of the Spark source `format("keyfill")` against a synthetic source that yields the
same Arrow batches without reading or decoding files, in one local[2] Spark session.

    python -m bench.bench_spark_source            # 3M records (generated and compacted once, cached)
    python -m bench.bench_spark_source --quick    # 400K records

The synthetic source plans exactly the keyfill source's micro-batches and input partitions
(it subclasses the planner) and, in `read()`, yields slices of one decoded template batch
(loaded once per Python worker from an Arrow IPC file) until the partition's record count is
reached: the ceiling of what Spark can take in from a Python data source, here. Two
queries each, with Trigger.AvailableNow to a noop sink: the source alone, and a watermark
plus a 1-minute window count per key. Target: keyfill at >= 60% of the synthetic rows/s.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator

import pyarrow as pa

import reader.spark as rs
from bench.archives import cached_compacted

TARGET = 0.6
_TEMPLATE: dict[str, pa.RecordBatch] = {}


def template(path: str) -> pa.RecordBatch:
    if path not in _TEMPLATE:  # once per Python worker: the only file the synthetic source reads
        with pa.OSFile(path) as f:  # read into memory: batches must not depend on the file
            _TEMPLATE[path] = pa.ipc.open_file(f).read_all().combine_chunks().to_batches()[0]
    return _TEMPLATE[path]


class SyntheticPlanner(rs.SourcePlanner):
    """The keyfill planner's batches and partitions; reads produce template rows instead."""

    def __init__(self, opts: rs.Options, template_path: str):
        super().__init__(opts)
        self.template_path = template_path

    def __getstate__(self) -> dict:
        return {**super().__getstate__(), "template_path": self.template_path}

    def read(self, partition: rs.GroupsPartition) -> Iterator[pa.RecordBatch]:
        t = template(self.template_path)
        for f in partition.pieces:
            left = f.records
            while left:
                n = min(left, t.num_rows, self.opts.batch_size)
                yield t.slice(0, n)
                left -= n


class SyntheticStreamReader(rs.KeyfillStreamReader):
    def __init__(self, opts: rs.Options, template_path: str):
        super().__init__(opts)
        self.planner = SyntheticPlanner(opts, template_path)


class SyntheticDataSource(rs.KeyfillDataSource):
    @classmethod
    def name(cls) -> str:
        return "keyfill_synthetic"

    def streamReader(self, schema):
        opts = {k: v for k, v in self.options.items() if k.lower() != "template"}  # the source refuses unknown options
        return SyntheticStreamReader(rs.Options.parse(opts), self.options["template"])


def ensure_archive(args: argparse.Namespace, spark) -> str:
    return cached_compacted(args.dir, args.records, args.groups, args.slice_duration, lambda: spark)


def write_template(url: str, path: str) -> None:
    """The largest decoded piece, in the source's Spark schema, as the synthetic rows."""
    from keygroups import compacted
    from keygroups.piece_index import PieceIndex
    from keygroups.storage import open_storage

    store = open_storage(url)
    manifest = compacted.load_manifest(store)
    biggest = max(
        (p for m in PieceIndex.of(store, manifest).metas(0, manifest.slices) for p in m.pieces),
        key=lambda p: p.records,
    )
    header = store.read_range(biggest.file, 0, biggest.file_header)
    batch = compacted.read_piece(header, store.read_range(biggest.file, biggest.offset, biggest.length), biggest, url)
    out = pa.Table.from_batches(
        list(rs.to_spark_batches(batch, biggest.group, biggest.slice, 1 << 30))
    ).combine_chunks()
    with pa.OSFile(path, "wb") as f, pa.ipc.new_file(f, rs.ARROW_SCHEMA) as w:
        w.write_batch(out.to_batches()[0])


def measure(spark, fmt: str, url: str, opts: dict, windowed: bool, ck: str) -> tuple[int, float, float]:
    """Rows, seconds from start() to the end, seconds inside micro-batches (no query start-up)."""
    from pyspark.sql import functions as F

    df = spark.readStream.format(fmt)
    for k, v in opts.items():
        df = df.option(k, v)
    df = df.load(url)
    if windowed:
        df = df.withWatermark("timestamp", "10 seconds").groupBy(F.window("timestamp", "1 minute"), "key").count()
    shutil.rmtree(ck, ignore_errors=True)
    started = time.perf_counter()
    q = (
        df.writeStream.format("noop")
        .outputMode("append")
        .option("checkpointLocation", ck)
        .trigger(availableNow=True)
        .start()
    )
    q.awaitTermination()
    seconds = time.perf_counter() - started
    in_batches = sum(p["durationMs"].get("triggerExecution", 0) for p in q.recentProgress) / 1000
    return sum(p["numInputRows"] for p in q.recentProgress), seconds, in_batches


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="small archive, one repetition")
    ap.add_argument("--records", type=int, default=None, help="records (default 3M; --quick 400K)")
    ap.add_argument("--groups", type=int, default=16)
    ap.add_argument("--slice-duration", default="2m")
    ap.add_argument("--max-slices-per-trigger", default="4")
    ap.add_argument("--num-partitions", default="4", help="the source's numPartitions option (both sources)")
    ap.add_argument("--repeat", type=int, default=None, help="runs per row, best kept (default 2; --quick 1)")
    ap.add_argument("--dir", default="/tmp/keyfill-bench-spark-source", help="archive cache")
    args = ap.parse_args()
    args.records = args.records or (400_000 if args.quick else 3_000_000)
    repeat = args.repeat or (1 if args.quick else 2)

    # Workers import the synthetic source by reference (bench.bench_spark_source), so its
    # template cache lives once per Python worker instead of travelling with each task: they
    # need the checkout (where `python -m bench...` runs) on their path.
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [os.getcwd(), os.environ.get("PYTHONPATH")]))
    from bench.bench_spark_source import SyntheticDataSource as Synthetic
    from compactor.spark_session import local_spark

    spark = local_spark("local[2]", app="keyfill bench spark source", progress=False)
    spark.sparkContext.setLogLevel("ERROR")
    spark.conf.set("spark.sql.shuffle.partitions", "4")
    rs.register(spark)
    spark.dataSource.register(Synthetic)
    try:
        url = ensure_archive(args, spark)
        tmp = tempfile.mkdtemp(prefix="keyfill-bench-spark-")
        tpl = os.path.join(tmp, "template.arrow")
        write_template(url, tpl)
        opts = {"maxSlicesPerTrigger": args.max_slices_per_trigger, "numPartitions": args.num_partitions}
        measure(spark, "keyfill", url, opts, False, os.path.join(tmp, "warm"))  # workers started, numba loaded
        rows = []
        for windowed in (False, True):
            result: dict[str, tuple[float, float]] = {}
            for i in range(repeat):  # alternating, so both sources see the same machine
                for fmt, extra in (("keyfill_synthetic", {"template": tpl}), ("keyfill", {})):
                    n, s, b = measure(spark, fmt, url, {**opts, **extra}, windowed, os.path.join(tmp, f"ck-{fmt}-{i}"))
                    best = result.get(fmt, (0.0, 0.0))
                    result[fmt] = (max(best[0], n / s), max(best[1], n / b))
            rows.append(("source + watermark + 1-min window count" if windowed else "source only", result))
        print(
            f"\n{args.records:,} records, {args.groups} groups, slices of {args.slice_duration}, local[2], "
            f"maxSlicesPerTrigger={args.max_slices_per_trigger}, numPartitions={args.num_partitions}"
        )
        print("rows/s over the whole query (start-up included) and, in brackets, over its micro-batches")
        print(f"{'query':<42} {'synthetic rows/s':>27} {'keyfill rows/s':>27} {'keyfill/synthetic':>18}")
        for name, r in rows:
            (syn, syn_b), (kf, kf_b) = r["keyfill_synthetic"], r["keyfill"]
            ok = "ok" if kf / syn >= TARGET else f"below the {TARGET:.0%} target"
            print(
                f"{name:<42} {syn:>14,.0f} ({syn_b:>10,.0f}) {kf:>14,.0f} ({kf_b:>10,.0f}) "
                f"{kf / syn:>7.2f}x ({kf_b / syn_b:.2f}x)  {ok}"
            )
        shutil.rmtree(tmp, ignore_errors=True)
    finally:
        spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())

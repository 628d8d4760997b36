"""A self-join of one archive with a filter on `partition` on each side (issue 44, item 2),
batch, in one local[2] Spark session: the rows the source hands Spark per side (the scans'
numOutputRows) and the query's time, before (no pushdown: Spark filters what the source
reads) and after (spark.sql.python.filterPushdown.enabled, each side its own `load()`); then
the same with one loaded DataFrame for both sides, which PySpark 4.3 reads wrong, and the
streaming self-join, which gets no filters at all (PySpark 4.3's DataSourceStreamReader has no
pushFilters).

    python -m bench.bench_pushdown              # 1M records over 4 Kafka partitions, 16 groups
    python -m bench.bench_pushdown --records 200000

The join: side a `partition = 0`, side b `partition IN (0, 1)`, on the offset with b's
timestamp within 5 s of a's (a key equality would pair a hot key's records quadratically and
time the join, not the reads; an equality on partition would let Spark infer `partition = 0`
for b too). Last, a scan of `key_group < 4` (of 16 groups), whose filter skips pieces.
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time

from bench.archives import cached_compacted

SIDES = ("partition = 0", "partition IN (0, 1)")


def scan_rows(df) -> list[int]:
    """numOutputRows of each keyfill scan of the executed query, in plan order."""
    out, stack = [], [df._jdf.queryExecution().executedPlan()]
    while stack:
        node = stack.pop()
        if "BatchScan" in node.nodeName():
            out.append(int(node.metrics().apply("numOutputRows").value()))
        children = node.children()
        stack += [children.apply(i) for i in reversed(range(children.size()))]
    return out


def condition():
    from pyspark.sql import functions as F

    same = F.col("a.offset") == F.col("b.offset")
    near = F.col("b.timestamp").between(
        F.col("a.timestamp") - F.expr("INTERVAL 5 SECONDS"), F.col("a.timestamp") + F.expr("INTERVAL 5 SECONDS")
    )
    return same & near


def join(spark, url: str, one_load: bool):
    one = spark.read.format("keyfill").load(url)
    a, b = (
        (one if one_load else spark.read.format("keyfill").load(url)).where(cond).alias(name)
        for cond, name in zip(SIDES, "ab")
    )
    return a.join(b, condition()).groupBy().count()


def run(spark, url: str, pushdown: bool, one_load: bool) -> tuple[int, list[int], float]:
    import reader.spark

    spark.conf.set("spark.sql.python.filterPushdown.enabled", str(pushdown).lower())
    reader.spark.register(spark, filter_pushdown=pushdown)
    q = join(spark, url, one_load)
    t = time.perf_counter()
    n = q.collect()[0][0]
    return n, scan_rows(q), time.perf_counter() - t


def groups(spark, url: str, pushdown: bool) -> tuple[int, float]:
    """A scan of a quarter of the groups: rows the source hands Spark, and seconds."""
    import reader.spark

    spark.conf.set("spark.sql.python.filterPushdown.enabled", str(pushdown).lower())
    reader.spark.register(spark, filter_pushdown=pushdown)
    q = spark.read.format("keyfill").load(url).where("key_group < 4").groupBy().count()
    t = time.perf_counter()
    q.collect()
    return scan_rows(q)[0], time.perf_counter() - t


def streaming(spark, url: str, tmp: str) -> list[tuple[int, int]]:
    """numInputRows of each source per micro-batch of the streaming self-join."""
    import reader.spark

    spark.conf.set("spark.sql.python.filterPushdown.enabled", "true")
    reader.spark.register(spark, filter_pushdown=True)
    a, b = (
        spark.readStream.format("keyfill").option("maxSlicesPerTrigger", 2).load(url).where(c).alias(n)
        for c, n in zip(SIDES, "ab")
    )
    a, b = a.withWatermark("timestamp", "10 seconds"), b.withWatermark("timestamp", "10 seconds")
    q = (
        a.join(b, condition())
        .writeStream.format("noop")
        .option("checkpointLocation", os.path.join(tmp, "ck"))
        .trigger(availableNow=True)
        .start()
    )
    q.awaitTermination()
    return [tuple(s["numInputRows"] for s in p["sources"]) for p in q.recentProgress if p["numInputRows"]]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--records", type=int, default=1_000_000)
    ap.add_argument("--groups", type=int, default=16)
    ap.add_argument("--slice-duration", default="2m")
    ap.add_argument("--repeat", type=int, default=2, help="rounds, best time kept")
    ap.add_argument("--dir", default="/tmp/keyfill-bench-pushdown", help="archive cache")
    args = ap.parse_args()

    # Spark's Python workers import keyfill from this checkout (where `python -m bench...` runs)
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [os.getcwd(), os.environ.get("PYTHONPATH")]))
    import reader.spark
    from compactor.spark_session import local_spark

    spark = local_spark("local[2]", app="keyfill bench pushdown", progress=False)
    spark.sparkContext.setLogLevel("ERROR")
    spark.conf.set("spark.sql.shuffle.partitions", "4")
    spark.conf.set("spark.sql.adaptive.enabled", "false")  # the scans stay in the executed plan, with their metrics
    tmp = tempfile.mkdtemp(prefix="keyfill-bench-pushdown-")
    try:
        root = os.path.join(args.dir, str(args.records))
        url = cached_compacted(root, args.records, args.groups, args.slice_duration, lambda: spark, seal_all=True)
        reader.spark.register(spark)
        total = spark.read.format("keyfill").load(url).count()
        run(spark, url, False, False)  # workers started, the JVM's code warm
        best: dict[tuple[bool, bool], tuple[int, list[int], float]] = {}
        for _ in range(args.repeat):
            for case in ((False, False), (True, False)):
                n, rows, secs = run(spark, url, *case)
                if case not in best or secs < best[case][2]:
                    best[case] = (n, rows, secs)
        one = run(spark, url, True, True)
        print(f"archive: {total:,} records, {args.records:,} generated; sides: a {SIDES[0]}, b {SIDES[1]}")
        for (pushdown, _), (n, rows, secs) in best.items():
            label = "after (pushdown, two loads)" if pushdown else "before (no pushdown)"
            print(f"{label:<36} join rows {n:>10,}  rows read per side {rows[0]:>10,} / {rows[1]:>10,}  {secs:6.2f} s")
        n, rows, secs = one
        right = best[(False, False)][0]
        print(
            f"{'pushdown, one loaded DataFrame':<36} join rows {n:>10,}  rows read per side {rows[0]:>10,} / "
            f"{rows[1]:>10,}  {secs:6.2f} s  ({'right' if n == right else f'WRONG: {right:,} expected'})"
        )
        scans = {p: min((groups(spark, url, p) for _ in range(args.repeat)), key=lambda r: r[1]) for p in (False, True)}
        print(
            f"{'key_group < 4, before / after':<36} rows read {scans[False][0]:>10,} / {scans[True][0]:>10,}  "
            f"{scans[False][1]:6.2f} s / {scans[True][1]:6.2f} s"
        )
        batches = streaming(spark, url, tmp)
        read = [sum(b[i] for b in batches) for i in (0, 1)]
        print(
            f"{'streaming (pushdown on)':<36} {len(batches)} micro-batches, rows read per side "
            f"{read[0]:>10,} / {read[1]:>10,} (of {total:,}): no filter reaches a stream reader"
        )
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        spark.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

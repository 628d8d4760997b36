"""Worked example: backfill a fraud-style streaming job from a compacted payments archive,
then hand off to live Kafka.

    spark-submit jobs/fraud_backfill.py s3://compacted/payments --out s3a://... \\
        --window "1 minute" --watermark-delay "10 seconds"
    # on one machine, with the example archive of `make example`:
    PYSPARK_PYTHON=.venv/bin/python .venv/bin/spark-submit --master 'local[*]' \\
        jobs/fraud_backfill.py example/compacted --out example/fraud --overwrite

The job is the streaming job a team runs on live traffic: parse each payment's JSON value,
keep per-user windowed aggregates (payments, spend, largest payment, distinct merchants)
under a watermark, append finished windows to Parquet with a checkpoint. Only the source
differs: `format("keyfill")` replays the archive in whole slices per micro-batch, so
Spark's watermark never declares a record late that was not already late in its own Kafka
partition by more than the delay. Trigger.AvailableNow runs the whole archive and stops;
an interrupted run resumes from its checkpoint. At the end it prints the busiest windows
and where the live Kafka consumer starts (`startingOffsets` and a
`kafka-consumer-groups --reset-offsets --from-file` CSV).
"""

from __future__ import annotations

import argparse
import os
import sys
import time

PAYMENT = "user string, amount double, merchant string, currency string, ts long"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="jobs/fraud_backfill.py", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("archive", help="compacted payments archive (local path or s3://)")
    p.add_argument(
        "--out",
        required=True,
        help="output folder (local, or s3a:// on a cluster): windows/ (Parquet), _checkpoint/, handoff.csv",
    )
    p.add_argument("--window", default="1 minute", help="tumbling window length (Spark interval)")
    p.add_argument(
        "--watermark-delay",
        default="10 seconds",
        help="Spark watermark delay: at least the source's own out-of-orderness",
    )
    p.add_argument(
        "--max-slices-per-trigger", type=int, help="slices per micro-batch (default: by bytes, the source's default)"
    )
    p.add_argument("--max-bytes-per-trigger", type=int, help="compacted bytes per micro-batch (default: 512 MiB)")
    p.add_argument("--top", type=int, default=5, help="busiest windows to print")
    p.add_argument("--overwrite", action="store_true", help="start over: remove earlier output and checkpoint")
    return p.parse_args(argv)


def fraud_windows(source, window: str = "1 minute", watermark_delay: str = "10 seconds"):
    """The job's logic over a DataFrame of the keyfill source's schema (streaming or not):
    per user and tumbling window, payments, spend, largest payment and distinct merchants,
    under a watermark. Kept apart from the I/O so `keyfill.testing.spark` can check it."""
    from pyspark.sql import functions as F

    payments = (
        source.select("timestamp", F.from_json(F.col("value").cast("string"), PAYMENT).alias("p"))
        .where(F.col("p.user").isNotNull())  # records without a user key are not payments by anyone
        .select("timestamp", "p.user", "p.amount", "p.merchant")
    )
    return (
        payments.withWatermark("timestamp", watermark_delay)
        .groupBy(F.window("timestamp", window).alias("window"), "user")
        .agg(
            F.count("*").alias("payments"),
            F.round(F.sum("amount"), 2).alias("spend"),
            F.max("amount").alias("largest"),
            F.approx_count_distinct("merchant").alias("merchants"),
        )
        .select(
            F.col("window.start").alias("window_start"),
            F.col("window.end").alias("window_end"),
            "user",
            "payments",
            "spend",
            "largest",
            "merchants",
        )
    )


def run(spark, args: argparse.Namespace) -> dict:
    from pyspark.sql import functions as F

    import reader.spark
    from keygroups import compacted, handoff
    from keygroups.storage import StorageError, open_storage, overlapping

    windows_dir = args.out.rstrip("/") + "/windows"
    checkpoint = args.out.rstrip("/") + "/_checkpoint"
    # Spark writes through Hadoop (s3a:// on a cluster); keyfill's own files go through its
    # storage layer, which calls the same bucket s3://.
    out_store = open_storage(args.out)
    if overlapping(out_store, open_storage(args.archive)):
        raise StorageError(f"--out {args.out} overlaps the archive {args.archive}: choose an output folder outside it")
    if args.overwrite:  # only what this job writes: never other files in --out
        for prefix in ("windows/", "_checkpoint/"):
            out_store.delete_prefix(prefix)
        out_store.delete("handoff.csv")

    reader.spark.register(spark)
    limits = {"maxSlicesPerTrigger": args.max_slices_per_trigger, "maxBytesPerTrigger": args.max_bytes_per_trigger}
    source = (
        spark.readStream.format("keyfill")
        .options(**{k: str(v) for k, v in limits.items() if v is not None})
        .load(args.archive)
    )
    windows = fraud_windows(source, args.window, args.watermark_delay)
    started = time.perf_counter()
    query = (
        windows.writeStream.format("parquet")
        .outputMode("append")
        .option("path", windows_dir)
        .option("checkpointLocation", checkpoint)
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    seconds = time.perf_counter() - started
    progress = query.recentProgress
    rows_in = sum(p["numInputRows"] for p in progress)
    dropped = sum(op.get("numRowsDroppedByWatermark", 0) for p in progress for op in p.get("stateOperators", []))

    result = spark.read.parquet(windows_dir)
    busiest = result.orderBy(F.desc("payments"), F.desc("spend"), "window_start", "user").limit(args.top).collect()
    store = open_storage(args.archive)
    manifest = compacted.load_manifest(store)
    out_store.write("handoff.csv", handoff.consumer_groups_csv(manifest).encode())
    csv_path = args.out.rstrip("/") + "/handoff.csv"
    return {
        "records": rows_in,
        "batches": sum(1 for p in progress if p["numInputRows"]),
        "seconds": seconds,
        "windows": result.count(),
        "dropped_late": dropped,
        "busiest": busiest,
        "starting_offsets": handoff.spark_starting_offsets(manifest),
        "handoff_csv": csv_path,
        "topic": manifest.topic,
        "slices": manifest.slices,
        "windows_dir": windows_dir,
    }


def report(r: dict, args: argparse.Namespace) -> None:
    print(
        f"fraud backfill: {r['records']:,} records from {r['slices']} slices in {r['batches']} micro-batches, "
        f"{r['seconds']:.1f} s; {r['windows']:,} user windows in {r['windows_dir']}; "
        f"{r['dropped_late']} records dropped as late (watermark delay {args.watermark_delay})"
    )
    print(f"busiest {args.window} windows:")
    print(f"  {'window start (UTC)':<20} {'user':<12} {'payments':>8} {'spend':>10} {'largest':>9} {'merchants':>9}")
    for w in r["busiest"]:
        print(
            f"  {w['window_start']:%Y-%m-%d %H:%M:%S}  {w['user']:<12} {w['payments']:>8} {w['spend']:>10.2f} "
            f"{w['largest']:>9.2f} {w['merchants']:>9}"
        )
    print(f"hand-off to live Kafka topic {r['topic']!r}:")
    print(f"  spark.readStream.format('kafka').option('startingOffsets', '{r['starting_offsets']}')")
    print(
        f"  kafka-consumer-groups --bootstrap-server HOST:9092 --group GROUP --topic {r['topic']} "
        f"--reset-offsets --from-file {r['handoff_csv']} --execute"
    )


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    from jobs.shipping import ship_to_executors

    spark = (
        SparkSession.builder.appName("keyfill fraud backfill").config("spark.sql.session.timeZone", "UTC").getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    ship_to_executors(spark)
    try:
        report(run(spark, args), args)
    finally:
        spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())

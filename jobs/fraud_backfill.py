"""Worked example: backfill a fraud-style streaming job from a compacted payments archive,
then hand off to live Kafka, or with --kafka go on live in the same query.

    spark-submit jobs/fraud_backfill.py s3://compacted/payments --out s3a://... \\
        --window "1 minute" --watermark-delay "10 seconds"
    # the archive, then the topic from the archive's hand-off offsets on, one query and state:
    spark-submit jobs/fraud_backfill.py s3://compacted/payments --out s3a://... \\
        --kafka broker1:9092,broker2:9092 --kafka-option security.protocol=SSL
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

With --kafka the source goes on from the archive's end to the topic (docs/kafka-live.md):
the query runs on a processing-time trigger until stopped (Ctrl-C, or --live-seconds), or
with --until-now reads the topic up to its end offsets at the start and stops.
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import TYPE_CHECKING, Any

from keygroups import spark_kind

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.streaming.query import StreamingQuery

PAYMENT = "user string, amount double, merchant string, currency string, ts long"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="jobs/fraud_backfill.py", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("archive", help="compacted payments archive (local path, s3://, gs:// or az://)")
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
    p.add_argument(
        "--max-bytes-per-trigger",
        metavar="SIZE",
        help="compacted bytes per micro-batch, as Spark writes sizes: 1g, 512m, 536870912 (default: 512m)",
    )
    p.add_argument("--top", type=int, default=5, help="busiest windows to print")
    live = p.add_argument_group("going live (needs keyfill[kafka])")
    live.add_argument("--kafka", metavar="SERVERS", help="bootstrap servers: after the archive, read its topic live")
    live.add_argument(
        "--kafka-option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a client setting (librdkafka's names), e.g. security.protocol=SSL; repeatable",
    )
    live.add_argument("--topic", help="the live topic, if not the archive's own")
    live.add_argument("--max-offsets-per-trigger", type=int, help="live records per micro-batch (default: all)")
    live.add_argument("--trigger", default="10 seconds", help="processing-time trigger of the live phase")
    live.add_argument("--live-seconds", type=float, help="stop after this long (default: run until stopped)")
    live.add_argument(
        "--until-now", action="store_true", help="read the topic up to its end offsets at the start, then stop"
    )
    p.add_argument("--overwrite", action="store_true", help="start over: remove earlier output and checkpoint")
    args = p.parse_args(argv)
    for opt in args.kafka_option:
        if "=" not in opt:
            p.error(f"--kafka-option {opt!r}: expected KEY=VALUE")
    if not args.kafka and (args.kafka_option or args.topic or args.max_offsets_per_trigger or args.until_now):
        p.error("--kafka-option, --topic, --max-offsets-per-trigger and --until-now need --kafka")
    return args


def fraud_windows(source: DataFrame, window: str = "1 minute", watermark_delay: str = "10 seconds") -> DataFrame:
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


def job(spark: SparkSession, args: argparse.Namespace) -> dict[str, Any]:
    from pyspark.sql import functions as F

    import reader.spark
    from keygroups import compacted, handoff
    from keygroups.storage import StorageError, open_storage, overlapping
    from reader import available_now

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
    kafka = getattr(args, "kafka", None)
    limits = {"maxSlicesPerTrigger": args.max_slices_per_trigger, "maxBytesPerTrigger": args.max_bytes_per_trigger}
    if kafka:
        limits |= {"kafka.bootstrap.servers": kafka, "subscribe": args.topic}
        limits |= {"maxOffsetsPerTrigger": args.max_offsets_per_trigger}
        limits |= {f"kafka.{k}": v for k, v in (o.split("=", 1) for o in args.kafka_option)}
    source = (
        spark.readStream.format("keyfill")
        .options(**{k: str(v) for k, v in limits.items() if v is not None})
        .load(args.archive)
    )
    windows = fraud_windows(source, args.window, args.watermark_delay)
    started = time.perf_counter()
    writer = (
        windows.writeStream.format("parquet")
        .outputMode("append")
        .option("path", windows_dir)
        .option("checkpointLocation", checkpoint)
    )
    if kafka and not args.until_now:
        queries = [writer.trigger(processingTime=args.trigger).start()]
        follow_live(queries[0], args.live_seconds)
    else:  # runs again from the checkpoint where Spark runs one micro-batch a run (Spark 4.0 and 4.1)
        queries = available_now.available_now_to_end(spark, writer)
    seconds = time.perf_counter() - started
    progress = available_now.progress(queries)
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


def follow_live(query: StreamingQuery, seconds: float | None) -> None:
    """Wait while the query runs (until `seconds` have passed, or Ctrl-C), saying once when
    it has moved from the archive to the topic."""
    import json

    deadline = None if seconds is None else time.monotonic() + seconds
    live = False
    try:
        while query.isActive and (deadline is None or time.monotonic() < deadline):
            query.awaitTermination(2)
            progress = spark_kind.last_progress(query)
            for source in progress.get("sources", []):
                end = source.get("endOffset")
                end = json.loads(end) if isinstance(end, str) else end
                if not live and isinstance(end, dict) and "kafka" in end:
                    live = True
                    print(f"the archive is done: live on the topic from offsets {end['kafka']}", flush=True)
    except KeyboardInterrupt:
        pass
    query.stop()


def report(r: dict[str, Any], args: argparse.Namespace) -> None:
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
    if getattr(args, "kafka", None):
        print(f"went on live from the archive's end on topic {args.topic or r['topic']!r}, in the same query")
        return
    print(f"hand-off to live Kafka topic {r['topic']!r}:")
    print(f"  spark.readStream.format('kafka').option('startingOffsets', '{r['starting_offsets']}')")
    print(
        f"  kafka-consumer-groups --bootstrap-server HOST:9092 --group GROUP --topic {r['topic']} "
        f"--reset-offsets --from-file {r['handoff_csv']} --execute"
    )


def main(argv: list[str] | None = None) -> int:
    from jobs.example_session import example

    return example("keyfill fraud backfill", job, report, parse_args(argv))


if __name__ == "__main__":
    from jobs.exit import one_line_errors

    sys.exit(one_line_errors(main, "jobs/fraud_backfill.py"))

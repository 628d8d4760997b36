"""Worked example: backfill a streaming join of two topics, payments and logins, keyed by
user, with both keyfill sources paced in event time (`maxEventTimePerTrigger`).

    spark-submit jobs/fraud_join.py gs://archive/compacted/payments gs://archive/compacted/logins \\
        --out gs://jobs/fraud-join --stride "10 minutes" --watermark-delay "1 minute"
    # on one machine, with the archives of `make example`:
    PYSPARK_PYTHON=.venv/bin/python .venv/bin/spark-submit --master 'local[*]' jobs/fraud_join.py \\
        example/compacted example/logins-compacted --out example/fraud-join --stride "1 minute" --overwrite

The job is the one a team runs live: the payments whose user logged in within `--within`
before them (a payment with no login shortly before it is a fraud signal),
both sides under a watermark, appended to Parquet with a checkpoint. Without pacing the two
sources would drift apart in event time (the logins topic is a tenth of the payments and
starts later), and the join would keep the faster side's rows in state until the slower
caught up. Paced, every micro-batch reads the same stride of event time from both; the
first stride holds `--start` (default: the earlier archive's first slice), given to both.

Paced, the query takes Spark's `max` watermark policy (the greatest of the inputs'): pacing
makes it drop nothing on time in its partition, and it keeps the state at about a stride.
Under the default `min`, Spark counts an input that has had no rows yet at watermark 0, so
every payment of the week before the first login would stay in state (bench/bench_join.py).
A query that goes live in the same query (kafka.* options) keeps `min`: a source whose
topic goes live first would carry a `max` watermark past the other's archive.
Trigger.AvailableNow runs both archives and stops; it prints rows in and out, micro-batches,
rows dropped as late and the join state's peak (rows, bytes).
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

PAYMENT = "user string, amount double, merchant string"
LOGIN = "user string, device string"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="jobs/fraud_join.py", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("payments", help="compacted payments archive (local path, s3://, gs:// or az://)")
    p.add_argument("logins", help="compacted logins archive")
    p.add_argument("--out", required=True, help="output folder: joined/ (Parquet) and _checkpoint/")
    p.add_argument("--within", default="10 minutes", help="a login counts this long before a payment (Spark interval)")
    p.add_argument("--watermark-delay", default="1 minute", help="both sides' watermark delay")
    p.add_argument(
        "--stride", default="10 minutes", help="event time per micro-batch: a whole number of both archives' slices"
    )
    p.add_argument(
        "--start", help="event time of the first stride, epoch ms or ISO 8601 (default: the earlier archive's)"
    )
    p.add_argument(
        "--max-slices-per-trigger",
        type=int,
        help="pace by slice counts instead (each source on its own: what pacing replaces; for comparison)",
    )
    p.add_argument(
        "--watermark-policy",
        choices=("min", "max"),
        help="Spark's multipleWatermarkPolicy (default: max when paced, min otherwise; see the module's docstring)",
    )
    p.add_argument("--overwrite", action="store_true", help="start over: remove earlier output and checkpoint")
    return p.parse_args(argv)


def fraud_join(
    payments: DataFrame, logins: DataFrame, within: str = "10 minutes", watermark_delay: str = "1 minute"
) -> DataFrame:
    """The payments whose user logged in within `within` before them, both sides under a
    watermark (the join's state is evicted by it). Kept apart from the I/O for tests."""
    from pyspark.sql import functions as F

    p = (
        payments.select(
            F.col("timestamp").alias("paid_at"), F.from_json(F.col("value").cast("string"), PAYMENT).alias("v")
        )
        .where(F.col("v.user").isNotNull())
        .select("paid_at", F.col("v.user").alias("user"), "v.amount", "v.merchant")
        .withWatermark("paid_at", watermark_delay)
    )
    lg = (
        logins.select(
            F.col("timestamp").alias("login_at"), F.from_json(F.col("value").cast("string"), LOGIN).alias("v")
        )
        .select("login_at", F.col("v.user").alias("login_user"), "v.device")
        .withWatermark("login_at", watermark_delay)
    )
    condition = F.expr(f"user = login_user AND login_at BETWEEN paid_at - INTERVAL {within} AND paid_at")
    # a left semi join: each payment once if the user logged in shortly before it, however
    # many logins there were (a hot user's pairs would otherwise multiply)
    return p.join(lg, condition, "left_semi")


def first_time(urls: list[str]) -> int:
    """The earliest first slice's start of the archives, in ms."""
    from keygroups import compacted
    from keygroups.storage import open_storage

    return min(compacted.load_manifest(open_storage(u)).bounds(0)[0] for u in urls)


def job(spark: SparkSession, args: argparse.Namespace) -> dict[str, Any]:
    import reader.spark
    from keyfill.cli.args import time_ms
    from keygroups.storage import StorageError, open_storage, overlapping
    from reader import available_now

    joined_dir = args.out.rstrip("/") + "/joined"
    checkpoint = args.out.rstrip("/") + "/_checkpoint"
    out_store = open_storage(args.out)
    for url in (args.payments, args.logins):
        if overlapping(out_store, open_storage(url)):
            raise StorageError(f"--out {args.out} overlaps the archive {url}: choose an output folder outside it")
    if args.overwrite:
        for prefix in ("joined/", "_checkpoint/"):
            out_store.delete_prefix(prefix)

    reader.spark.register(spark)
    start = time_ms(args.start) if args.start else first_time([args.payments, args.logins])
    if args.max_slices_per_trigger:
        options = {"maxSlicesPerTrigger": str(args.max_slices_per_trigger)}
    else:
        options = {"maxEventTimePerTrigger": args.stride, "startingTimestamp": str(start)}
    payments, logins = (
        spark.readStream.format("keyfill").options(**options).load(u) for u in (args.payments, args.logins)
    )
    joined = fraud_join(payments, logins, within=args.within, watermark_delay=args.watermark_delay)
    policy = getattr(args, "watermark_policy", None) or ("min" if args.max_slices_per_trigger else "max")
    # the policy is the query's from its first batch on (Spark keeps it in the checkpoint); every
    # progress is kept, so the figures cover more than Spark's default 100 batches
    conf = {
        "spark.sql.streaming.multipleWatermarkPolicy": policy,
        "spark.sql.streaming.numRecentProgressUpdates": "100000",
    }
    before = {k: spark.conf.get(k, None) for k in conf}
    for k, v in conf.items():
        spark.conf.set(k, v)
    try:
        started = time.perf_counter()
        writer = (
            joined.writeStream.format("parquet")
            .outputMode("append")
            .option("path", joined_dir)
            .option("checkpointLocation", checkpoint)
        )
        queries = available_now.available_now_to_end(spark, writer)  # several runs on Spark 4.0 and 4.1
        seconds = time.perf_counter() - started
        progress = available_now.progress(queries)
    finally:
        for k, v in before.items():
            spark.conf.unset(k) if v is None else spark.conf.set(k, v)
    operators = [op for p in progress for op in p.get("stateOperators", [])]
    return {
        "payments": sum(p["sources"][0]["numInputRows"] for p in progress),
        "logins": sum(p["sources"][1]["numInputRows"] for p in progress),
        "batches": len(progress),
        "seconds": seconds,
        "joined": spark.read.parquet(joined_dir).count(),
        "dropped_late": sum(op.get("numRowsDroppedByWatermark", 0) for op in operators),
        "peak_state_rows": max((op.get("numRowsTotal", 0) for op in operators), default=0),
        "peak_state_bytes": max((op.get("memoryUsedBytes", 0) for op in operators), default=0),
        "progress": progress,
        "joined_dir": joined_dir,
        "start": start,
        "policy": policy,
    }


def report(r: dict[str, Any], args: argparse.Namespace) -> None:
    pacing = (
        f"{args.max_slices_per_trigger} slices a source a batch (unpaced)"
        if args.max_slices_per_trigger
        else f"paced at {args.stride} of event time a batch"
    )
    print(
        f"fraud join: {r['payments']:,} payments and {r['logins']:,} logins in {r['batches']} micro-batches, "
        f"{pacing}, watermark policy {r['policy']}, {r['seconds']:.1f} s; "
        f"{r['joined']:,} payments with a login in the {args.within} before them "
        f"in {r['joined_dir']}; {r['dropped_late']} rows dropped as late (watermark delay {args.watermark_delay}); "
        f"join state at most {r['peak_state_rows']:,} rows, {r['peak_state_bytes'] / 1e6:.1f} MB"
    )


def main(argv: list[str] | None = None) -> int:
    from jobs.example_session import example

    return example("keyfill fraud join", job, report, parse_args(argv))


if __name__ == "__main__":
    from jobs.exit import one_line_errors

    sys.exit(one_line_errors(main, "jobs/fraud_join.py"))

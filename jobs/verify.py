"""spark-submit entry point of the audit; same arguments as `keyfill verify`, its tasks
run by Spark (`compactor.verify.spark`: the same checks and report as in one process).

    spark-submit --py-files keyfill-0.1.0-py3-none-any.whl jobs/verify.py s3://archive/payments s3://compacted/payments
"""

from __future__ import annotations

import argparse
import sys
from functools import partial


def main(argv: list[str] | None = None) -> int:
    from jobs import spark_log
    from keyfill.cli import add_source_options, print_verify_report, source_from_args

    parser = argparse.ArgumentParser(
        prog="jobs/verify.py", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("source", help="the source archive")
    parser.add_argument("dest", help="the compacted archive")
    add_source_options(parser)
    parser.add_argument("--json", action="store_true", help="machine-readable report")
    args = parser.parse_args(argv)
    held = spark_log.hold()

    from pyspark.sql import SparkSession

    from compactor.spark_session import from_builder, running_or_started
    from compactor.verify.spark import verify_spark
    from keygroups.storage import open_storage

    try:
        source = source_from_args(args, args.source)  # its checks before Spark starts
    except BaseException:
        spark_log.release(held)
        raise
    start = partial(from_builder, SparkSession.builder.appName("keyfill verify"))
    with running_or_started(start, "jobs/verify.py") as spark:
        spark_log.to_spark(spark, held)
        report = verify_spark(source, open_storage(args.dest), spark)
    print_verify_report(report, args.json)
    return 0 if report.ok else 1


def entry() -> int:
    """What spark-submit runs: `main` with its errors in one line."""
    from jobs.exit import one_line_errors

    return one_line_errors(main, "jobs/verify.py")


if __name__ == "__main__":
    sys.exit(entry())

"""spark-submit entry point of the audit; same arguments as `keyfill verify`, records
checked by Spark (source and archive joined on partition and offset).

    spark-submit --py-files keyfill.zip jobs/verify.py s3://archive/payments s3://compacted/payments
"""

from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    from keyfill.cli import add_source_options, print_verify_report, source_from_args

    parser = argparse.ArgumentParser(
        prog="jobs/verify.py", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("source", help="the source archive")
    parser.add_argument("dest", help="the compacted archive")
    add_source_options(parser)
    parser.add_argument("--json", action="store_true", help="machine-readable report")
    args = parser.parse_args(argv)

    from pyspark.sql import SparkSession

    from compactor.verify_spark import verify_spark
    from keygroups.storage import open_storage

    spark = SparkSession.builder.appName("keyfill verify").getOrCreate()
    try:
        source = source_from_args(args, args.source)
        report = verify_spark(source, open_storage(args.dest), spark)
    finally:
        spark.stop()
    print_verify_report(report, args.json)
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())

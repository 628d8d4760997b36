"""spark-submit entry point of the compaction job; same options as `keyfill compact`.

    spark-submit --py-files keyfill.zip jobs/compact.py s3://archive/payments s3://compacted/payments \\
        --groups 256 --slice-duration 10m
"""

from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    from keyfill.cli import add_compact_arguments, compact_config, print_compact_result
    from keyfill.cli.compact import log_to_terminal

    parser = argparse.ArgumentParser(
        prog="jobs/compact.py", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add_compact_arguments(parser)
    args = parser.parse_args(argv)
    log_to_terminal()

    from pyspark.sql import SparkSession

    from compactor.job import compact, prepare

    cfg = compact_config(args)
    prepared = prepare(cfg)  # every check that needs no Spark, before its start-up
    with prepared.abandoned_on_error():
        spark = SparkSession.builder.appName("keyfill compact").getOrCreate()
    try:
        print_compact_result(compact(cfg, spark, prepared), args.json)
    finally:
        spark.stop()
    return 0


def run() -> int:
    """main(), with keyfill's errors as one line on stderr and exit status 2 (as `keyfill compact`)."""
    from keygroups.errors import KeyfillError

    try:
        return main()
    except KeyfillError as exc:
        print(f"jobs/compact.py: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(run())

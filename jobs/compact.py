"""spark-submit entry point of the compaction job; same options as `keyfill compact`.

    spark-submit --py-files keyfill-0.1.0-py3-none-any.whl jobs/compact.py \\
        s3://archive/payments s3://compacted/payments \\
        --groups 256 --slice-duration 10m
"""

from __future__ import annotations

import argparse
import sys
from contextlib import ExitStack
from functools import partial


def main(argv: list[str] | None = None) -> int:
    from jobs import spark_log
    from keyfill.cli import add_compact_arguments, compact_config, print_compact_result

    parser = argparse.ArgumentParser(
        prog="jobs/compact.py", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add_compact_arguments(parser)
    args = parser.parse_args(argv)
    held = spark_log.hold()

    from pyspark.sql import SparkSession

    from compactor.job import compact, prepare
    from compactor.spark_session import from_builder, running_or_started

    with ExitStack() as session:
        try:
            cfg = compact_config(args)
            prepared = prepare(cfg)  # every check that needs no Spark, before its start-up
            with prepared.abandoned_on_error():
                start = partial(from_builder, SparkSession.builder.appName("keyfill compact"))
                spark = session.enter_context(running_or_started(start, "jobs/compact.py"))
        except BaseException:
            spark_log.release(held)
            raise
        spark_log.to_spark(spark, held)
        print_compact_result(compact(cfg, spark, prepared), args.json)
    return 0


def entry() -> int:
    """What spark-submit runs: `main` with its errors in one line."""
    from jobs.exit import one_line_errors

    return one_line_errors(main, "jobs/compact.py")


if __name__ == "__main__":
    sys.exit(entry())

"""The Spark session the worked examples run in: UTC times and quiet logs. A classic session
or a Spark Connect one (`SPARK_REMOTE`): the examples use the DataFrame API only, and
`reader.spark.register` makes keyfill importable in the executors
(`keygroups.executor_code`)."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from argparse import Namespace

    from pyspark.sql import SparkSession

Result = dict[str, Any]  # what a worked example's run found, for its report


def example(
    app: str,
    job: Callable[[SparkSession, Namespace], Result],
    report: Callable[[Result, Namespace], None],
    args: Namespace,
) -> int:
    """`report(job(spark, args), args)` in a session named `app`, stopped afterwards."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    from compactor.spark_session import from_builder
    from keygroups.connect_watch import watching
    from keygroups.spark_kind import set_log_level

    spark = from_builder(SparkSession.builder.appName(app).config("spark.sql.session.timeZone", "UTC"))
    set_log_level(spark, "ERROR")
    try:
        with watching(spark, os.environ.get("SPARK_REMOTE")):
            result = job(spark, args)
        report(result, args)
    finally:
        spark.stop()
    return 0

"""An embedded Spark for `keyfill compact` on one machine (spark-submit brings its own)."""

from __future__ import annotations

import os
import sys

from keygroups.errors import KeyfillError


def local_spark(
    master: str = "local[*]",
    *,
    app: str = "keyfill",
    driver_memory: str = "4g",
    progress: bool = True,
    conf: dict[str, str] | None = None,
):
    """A local SparkSession whose Python workers run this interpreter (else they may start
    another Python that lacks keyfill and fail to connect back). `conf`: more settings (a
    benchmark's event log)."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    try:
        from pyspark.sql import SparkSession
    except ImportError:
        raise KeyfillError(
            "this command runs Spark on this machine: pip install 'keyfill[spark]' (or run the job with "
            "spark-submit on a cluster that has Spark, see docs/deploy.md)"
        ) from None

    builder = SparkSession.builder
    for k, v in (conf or {}).items():
        builder = builder.config(k, v)
    return (
        builder.master(master)
        .appName(app)
        .config("spark.driver.memory", driver_memory)
        .config("spark.sql.execution.arrow.pyspark.enabled", "true")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", str(progress).lower())
        .config("spark.sql.shuffle.partitions", "16")
        .getOrCreate()
    )

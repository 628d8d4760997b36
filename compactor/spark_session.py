"""The Spark session a command or job runs on: the one this process runs, else an embedded
one for `keyfill compact` on one machine (spark-submit brings its own)."""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import Any

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


def embedded_spark(
    master: str, *, app: str, driver_memory: str = "4g", progress: bool = True, log_level: str = "WARN"
) -> AbstractContextManager:
    """The session a command runs on: this process's (see `running_or_started`), else a
    local one."""

    def start():
        spark = local_spark(master, app=app, driver_memory=driver_memory, progress=progress)
        spark.sparkContext.setLogLevel(log_level)
        return spark

    return running_or_started(start, app)


@contextmanager
def running_or_started(start: Callable[[], Any], app: str) -> Iterator:
    """The Spark session this process already runs (a notebook, a pyspark shell, a driver
    program calling `keyfill.cli.main` or a job's `main()`), left running as it was:
    stopping it would end the caller's work. Else the one `start()` makes, stopped after."""
    active = _active_session()
    if active is not None:
        log = logging.getLogger("keyfill")
        log.info("%s runs on this process's Spark session (%s)", app, active.sparkContext.master)
        yield active
        return
    spark = start()
    try:
        yield spark
    finally:
        spark.stop()


def _active_session():
    try:
        from pyspark.sql import SparkSession
    except ImportError:
        return None  # local_spark says what to install
    return SparkSession.getActiveSession()

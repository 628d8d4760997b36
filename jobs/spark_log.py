"""keyfill's log lines into the Spark driver's log, where a spark-submit job's lines belong.

Under spark-submit the driver's Python runs as a child of the JVM, which merges the child's
stderr into its own stdout: a Python log line on stderr lands between the lines of `--json`
output. Log4j writes to the JVM's stderr (or the cluster's driver log), so the job forwards
its records there, and stdout carries only what the job prints. Lines logged before Spark
starts (the checks that run first, so a typo costs no JVM start) are held and forwarded once
it has; if the job fails before that, they go to stderr with the error.
"""

from __future__ import annotations

import logging
import logging.handlers
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

LOGGER = "keyfill"


class SparkLog(logging.Handler):
    def __init__(self, spark: SparkSession) -> None:
        super().__init__()
        jvm = spark._jvm
        if jvm is None:  # a Spark Connect session, whose records `to_spark` sends to stderr instead
            raise TypeError("SparkLog forwards to the JVM of a classic Spark session, and this one has none")
        self._log = jvm.org.apache.logging.log4j.LogManager.getLogger(LOGGER)
        self.setFormatter(logging.Formatter("%(name)s: %(message)s"))

    def emit(self, record: logging.LogRecord) -> None:
        try:
            line = self.format(record)
            if record.levelno >= logging.ERROR:
                self._log.error(line)
            elif record.levelno >= logging.WARNING:
                self._log.warn(line)
            elif record.levelno >= logging.INFO:
                self._log.info(line)
            else:
                self._log.debug(line)
        except Exception:  # the JVM has gone (the session stopped): keep the line on stderr
            sys.stderr.write(self.format(record) + "\n")


def hold() -> logging.handlers.MemoryHandler:
    """Hold keyfill's records until Spark is up (`to_spark`) or the job fails (`release`)."""
    log = logging.getLogger(LOGGER)
    log.setLevel(logging.INFO)
    log.propagate = False
    held = logging.handlers.MemoryHandler(capacity=10_000, flushLevel=logging.CRITICAL + 1, flushOnClose=False)
    log.addHandler(held)
    for name in ("py4j", "botocore", "boto3", "urllib3", "numba"):
        logging.getLogger(name).setLevel(logging.WARNING)
    return held


def to_spark(spark: SparkSession, held: logging.handlers.MemoryHandler) -> None:
    """From now on keyfill's records go to the driver's log4j; the held ones first."""
    from keygroups.spark_kind import is_connect

    if is_connect(spark):  # no JVM in this process: the server's log is the server's
        release(held)
        return
    target = SparkLog(spark)
    held.setTarget(target)
    held.flush()
    log = logging.getLogger(LOGGER)
    log.removeHandler(held)
    log.addHandler(target)


def release(held: logging.handlers.MemoryHandler) -> None:
    """The held records, and every later one, to stderr."""
    target = logging.StreamHandler(sys.stderr)
    target.setFormatter(logging.Formatter("%(asctime)s %(name)s: %(message)s"))
    held.setTarget(target)
    held.flush()
    log = logging.getLogger(LOGGER)
    log.removeHandler(held)
    log.addHandler(target)

"""`keyfill verify --spark` and `spark-submit jobs/verify.py`: the audit of `compactor.verify`
with its tasks on a Spark session (classic or Spark Connect): the files checked and the
records compared in Spark tasks, so no process holds the archive's records."""

from __future__ import annotations

from typing import TYPE_CHECKING

from compactor.execution import for_session
from compactor.sources import SourceArchive
from compactor.verify.checks import VerifyReport, audit
from keygroups.storage import Storage

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


def verify_spark(source: SourceArchive, dest: Storage, spark: SparkSession) -> VerifyReport:
    return audit(source, dest, for_session(spark, description="keyfill verify"))

"""Trigger.AvailableNow to the end of what is available, on every Spark that has the source.

Spark 4.2 and later run a Trigger.AvailableNow query over `format("keyfill")` in as many
micro-batches as its limits make, up to the end of the archive (and of the topic) at the
query's start, and stop. Spark 4.0 and 4.1 have no `SupportsTriggerAvailableNow` for Python
sources: they run such a query as ONE micro-batch and stop ("Falling back to single batch
execution"), and the source cannot tell that trigger from another. One run then reads one
batch of the limits (`maxBytesPerTrigger`'s 512 MiB by default), never a whole 3-month archive
at once, and the rest waits in the archive. `available_now_to_end` starts the query again from its
checkpoint until a start reads nothing: each start goes on exactly where the last one committed,
with its watermark, so no record is read twice nor dropped as late, as in one query of many
batches. Databricks serverless, which allows only Trigger.AvailableNow, needs this on its
Spark 4.0 and 4.1 environments.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import reader.spark.api as spark_api
from keygroups import spark_kind

if TYPE_CHECKING:
    from pyspark.sql.streaming.query import StreamingQuery
    from pyspark.sql.streaming.readwriter import DataStreamWriter


def ends_in_one_query(spark: Any) -> bool:
    """One Trigger.AvailableNow run reads everything available: a classic session whose
    PySpark has admission control for Python sources. A Connect session's server may run
    another PySpark than this client's, so there the runs go on until one reads nothing."""
    return spark_api.ADMISSION_CONTROL and not spark_kind.is_connect(spark)


def available_now_to_end(
    spark: Any, writer: DataStreamWriter, queries: list[StreamingQuery] | None = None
) -> list[StreamingQuery]:
    """Run `writer` (a query with a checkpoint location) with Trigger.AvailableNow until it
    has read everything available: one run where Spark does it in one (`ends_in_one_query`),
    else runs from the checkpoint until one reads no record (the module's docstring). The
    queries, each ended, appended to `queries` as they start; a failed run raises as
    `awaitTermination` does, its query the last in `queries`."""
    writer = writer.trigger(availableNow=True)
    queries = [] if queries is None else queries
    while True:
        query = writer.start()
        queries.append(query)
        query.awaitTermination()
        if ends_in_one_query(spark) or not sum(p["numInputRows"] for p in spark_kind.progress(query)):
            return queries


def progress(queries: list[StreamingQuery]) -> list[dict[str, Any]]:
    """The progress reports of several starts of a query, in order."""
    return [p for q in queries for p in spark_kind.progress(q)]

"""`keyfill verify --spark` and `spark-submit jobs/verify.py`: the audit of `compactor.verify`
with the record-level checks done by Spark, for archives too large for one process."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import ExitStack
from enum import IntEnum
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa

from compactor.execution import OnSpark, Task
from compactor.sources import SourceArchive, SourceChunk
from compactor.verify import (
    MAX_REPORTED,
    VerifyReport,
    handoff_checks,
    late_check,
    metadata_checks,
    plan_audit,
)
from compactor.verify_file import FileChecker
from keygroups import envelope
from keygroups.compacted import PartitionRange, Piece
from keygroups.storage import Storage

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession

_SOURCE_ROWS = pa.schema([("partition", pa.int32()), ("offset", pa.int64()), ("ts", pa.int64()), ("fp", pa.int64())])


class Archived(IntEnum):
    """What a row of an archive file's check holds (its `output`)."""

    RECORD = 0  # a record: partition, offset, the start of its slice and its fingerprint
    PROBLEM = 1  # a failed check of the file: check, message


_ARCHIVED_ROWS = pa.schema(
    [("output", pa.int32()), ("partition", pa.int32()), ("offset", pa.int64()), ("slice_start", pa.int64()),
     ("fp", pa.int64()), ("check", pa.string()), ("message", pa.string())]
)  # fmt: skip


def _source_task(source: SourceArchive, chunks: list[SourceChunk]) -> Task:
    def task(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for rows in batches:
            for i in rows.column("idx").to_pylist():
                b = source.read(chunks[i])
                yield pa.RecordBatch.from_arrays(
                    [
                        b.column("partition"),
                        b.column("offset"),
                        b.column("timestamp").cast(pa.int64()),
                        pa.array(envelope.record_fingerprints(b).view(np.int64)),
                    ],
                    names=["partition", "offset", "ts", "fp"],
                )

    return task


def _archive_task(
    checker: FileChecker, files: list[tuple[str, list[Piece]]], ranges: dict[int, list[PartitionRange]]
) -> Task:
    def task(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for rows in batches:
            for i in rows.column("idx").to_pylist():
                key, pieces = files[i]
                b, starts, problems = checker(key, pieces, ranges)
                n = b.num_rows
                yield pa.RecordBatch.from_pydict(
                    {
                        "output": pa.repeat(int(Archived.RECORD), n).cast(pa.int32()),
                        "partition": b.column("partition"),
                        "offset": b.column("offset"),
                        "slice_start": pa.array(starts),
                        "fp": pa.array(envelope.record_fingerprints(b).view(np.int64)),
                        "check": pa.nulls(n, pa.string()),
                        "message": pa.nulls(n, pa.string()),
                    }
                )
                if problems:
                    k = len(problems)
                    yield pa.RecordBatch.from_pydict(
                        {
                            "output": pa.repeat(int(Archived.PROBLEM), k).cast(pa.int32()),
                            "partition": pa.nulls(k, pa.int32()),
                            "offset": pa.nulls(k, pa.int64()),
                            "slice_start": pa.nulls(k, pa.int64()),
                            "fp": pa.nulls(k, pa.int64()),
                            "check": [c for c, _ in problems],
                            "message": [m for _, m in problems],
                        }
                    )

    return task


def verify_spark(source: SourceArchive, dest: Storage, spark: SparkSession) -> VerifyReport:
    """`verify` with the record-level checks done by Spark: files are checked in tasks, and
    source and archive are joined on (partition, offset), so no process holds the archive."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    report, plan = plan_audit(source, dest)
    if plan is None:
        return report
    manifest, chunks, metas, files = plan.manifest, plan.chunks, plan.metas, plan.files
    execution = OnSpark(spark, description="keyfill verify")

    def indices(n: int) -> pa.Table:
        return pa.table({"idx": pa.array(range(n), pa.int32())})

    src = execution.map(indices(len(chunks)), _source_task(source, chunks), _SOURCE_ROWS)
    dst = execution.map(
        indices(len(files)), _archive_task(FileChecker(dest, manifest), files, plan.ranges), _ARCHIVED_ROWS
    )
    with ExitStack() as kept:
        dst = kept.enter_context(execution.persisted(dst, serialized=True))
        problems = execution.where(dst, "output", [Archived.PROBLEM], ["check", "message"])
        for r in execution.collect("file checks", problems).to_pylist():
            report.fail(r["check"], r["message"])
        records = execution.where(dst, "output", [Archived.RECORD], ["partition", "offset", "slice_start", "fp"])
        records = records.withColumnRenamed("fp", "afp")
        # The source below each partition's hand-off is what the archive must hold (sealing).
        handoffs = spark.createDataFrame(
            [(int(p), int(o)) for p, o in manifest.handoff.items()], "partition int, handoff long"
        )
        d = manifest.slice_duration_ms
        w = Window.partitionBy("partition").orderBy("offset").rowsBetween(Window.unboundedPreceding, 0)
        src = kept.enter_context(execution.persisted(src.withColumn("runmax", F.max("ts").over(w)), serialized=True))
        expected = (
            src.groupBy("partition")
            .agg(
                F.min(F.when(F.floor(F.col("runmax") / d) - manifest.base >= manifest.slices, F.col("offset"))).alias(
                    "unpublished"
                ),
                (F.max("offset") + 1).alias("after"),
            )
            .toArrow()
            .to_pylist()
        )
        below = src.join(F.broadcast(handoffs), on="partition", how="left").filter(
            F.col("handoff").isNull() | (F.col("offset") < F.col("handoff"))
        )
        joined = below.drop("handoff", "runmax").join(records, on=["partition", "offset"], how="full_outer")
        joined = kept.enter_context(execution.persisted(joined, serialized=True))
        runmax = joined.filter("ts IS NOT NULL AND slice_start IS NOT NULL").withColumn("runmax", F.max("ts").over(w))
        own = F.floor(F.col("runmax") / d) * d
        # Each check's violations counted in one job per frame; the rows that name them are
        # fetched only for a check that failed: a sound archive takes three jobs here, not eleven.
        times = records.groupBy("partition", "offset").count()
        found = _counts(times, records=F.col("count"), repeated=F.col("count") > 1)
        found |= _counts(
            joined,
            missing=F.col("slice_start").isNull(),
            extra=F.col("ts").isNull(),
            differ=F.col("fp") != F.col("afp"),
        )
        found |= _counts(runmax, early=own > F.col("slice_start"), made_late=own < F.col("slice_start"))
        report.records = found["records"]
        checks: list[tuple[str, str, DataFrame, Callable[[dict[str, Any]], str]]] = [
            ("missing", "exactly_once", joined.filter("slice_start IS NULL"),
             lambda r: f"partition {r['partition']} offset {r['offset']}: in the source, not in the archive"),
            ("extra", "exactly_once", joined.filter("ts IS NULL"),
             lambda r: f"partition {r['partition']} offset {r['offset']}: in the archive, not in the source"),
            ("repeated", "exactly_once", times.filter("count > 1"),
             lambda r: f"partition {r['partition']} offset {r['offset']}: {r['count']} times in the archive"),
            ("differ", "exactly_once", joined.filter("fp != afp"),
             lambda r: f"partition {r['partition']} offset {r['offset']}: record contents differ from the source"),
            ("early", "slice_bounds", runmax.filter(own > F.col("slice_start")),
             lambda r: f"partition {r['partition']}: offset {r['offset']} is in the slice starting at "
             f"{r['slice_start']}, before the slice of its running maximum timestamp"),
        ]  # fmt: skip
        for name, check, frame, message in checks:
            count = found[name]
            if count:
                for r in frame.limit(MAX_REPORTED).toArrow().to_pylist():
                    report.fail(check, message(r))
                report.counts[check] += count - min(count, MAX_REPORTED)
        made_late = found["made_late"]
    late_check(report, manifest, made_late)
    metadata_checks(report, manifest, metas)
    firsts = {r["partition"]: r["after"] if r["unpublished"] is None else r["unpublished"] for r in expected}
    handoff_checks(report, manifest, firsts)
    return report


def _counts(frame: DataFrame, **conditions: Column) -> dict[str, int]:
    """Each column summed over `frame` (a condition counts the rows meeting it), in one job."""
    from pyspark.sql import functions as F

    sums = [F.coalesce(F.sum(c.cast("long")), F.lit(0)).alias(n) for n, c in conditions.items()]
    row = frame.agg(*sums).collect()[0]
    return {n: int(row[n]) for n in conditions}

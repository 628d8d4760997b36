"""Phase 1 of the compaction: bytes and records per key, and per chunk the summaries slicing
needs, computed in Spark tasks; the driver receives per-key totals, never records."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from functools import partial

import numpy as np
import pyarrow as pa

from compactor.chunks import chunk_batches, chunk_frame, read_checked, spark_ddl
from compactor.history import batch_digests
from compactor.slicing import ChunkStats, Run, chunk_runs
from compactor.sources import SourceArchive, SourceChunk
from compactor.task_errors import TaskErrors
from keygroups import envelope

_STATS_ARROW = pa.schema(
    [("kind", pa.int32()), ("key", pa.binary()), ("null_part", pa.int32()), ("bytes", pa.int64()),
     ("records", pa.int64()), ("chunk", pa.string())]
)  # fmt: skip
STATS_SCHEMA = spark_ddl(_STATS_ARROW)


@dataclass
class Statistics:
    totals: pa.Table  # key, null_part, bytes, records: one row per key (null keys: per partition)
    chunks: list[ChunkStats]


def _stats_task(source: SourceArchive, chunks: list[SourceChunk], duration_ms: int):
    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for rows in batches:
            for row in rows.to_pylist():
                chunk = chunks[row["idx"]]
                batch = read_checked(source, chunk, row["from_offset"])
                if not batch.num_rows:
                    continue  # straddles an append's hand-off: nothing new
                offsets = batch.column("offset").to_numpy()
                ts = batch.column("timestamp").cast(pa.int64()).to_numpy()
                weights = envelope.record_bytes(batch)
                t = pa.table({"key": batch.column("key"), "bytes": weights})
                agg = t.group_by("key", use_threads=False).aggregate([("bytes", "sum"), ("bytes", "count")])
                n = agg.num_rows
                keys = agg.column("key")
                null_part = pa.array(
                    np.where(keys.is_null().to_numpy(zero_copy_only=False), chunk.partition, -1), pa.int32()
                )
                stats = ChunkStats(
                    key=chunk.key,
                    topic=chunk.topic,
                    partition=chunk.partition,
                    first_offset=int(offsets[0]),
                    last_offset=int(offsets[-1]),
                    records=batch.num_rows,
                    min_timestamp=int(ts.min()),
                    max_timestamp=int(ts.max()),
                    runs=chunk_runs(offsets, ts, duration_ms, partial(batch_digests, batch)),
                )
                # n key rows (kind 0), then one row with the chunk summary (kind 1)
                yield pa.RecordBatch.from_arrays(
                    [
                        pa.array(np.r_[np.zeros(n), [1]].astype(np.int32)),
                        pa.concat_arrays([keys.combine_chunks(), pa.nulls(1, pa.binary())]),
                        pa.concat_arrays([null_part, pa.array([-1], pa.int32())]),
                        pa.concat_arrays([agg.column("bytes_sum").combine_chunks(), pa.array([0], pa.int64())]),
                        pa.concat_arrays([agg.column("bytes_count").combine_chunks(), pa.array([0], pa.int64())]),
                        pa.array([None] * n + [json.dumps(asdict(stats))], pa.string()),
                    ],
                    names=["kind", "key", "null_part", "bytes", "records", "chunk"],
                )

    return run


def run_statistics(
    spark,
    source: SourceArchive,
    chunks: list[SourceChunk],
    duration_ms: int,
    handoff: dict[int, int] | None = None,
    errors: TaskErrors | None = None,
) -> Statistics:
    """`handoff`: for an append, each partition's first offset to count (the archive holds the
    rest); `errors`: the run's channel for bad input found in a task (raised here, at once).
    `spark=None`: the same task runs in this process (`compactor.job.compact`)."""
    if spark is None:
        return _statistics_in_process(source, chunks, duration_ms, handoff)
    from pyspark.sql import functions as F

    sc = spark.sparkContext
    task = _stats_task(source, chunks, duration_ms)
    stats = (
        chunk_frame(spark, chunks, handoff=handoff)
        .mapInArrow(errors.guard(task) if errors else task, STATS_SCHEMA)
        .persist()
    )

    def run(name: str, action):
        return errors.run(sc, name, action) if errors else action()

    try:
        totals = run(
            "statistics",
            stats.filter("kind = 0")
            .groupBy("key", "null_part")
            .agg(F.sum("bytes").alias("bytes"), F.sum("records").alias("records"))
            .toArrow,
        )
        summaries = run("chunk summaries", stats.filter("kind = 1").select("chunk").toArrow).column("chunk")
    finally:
        stats.unpersist()
    return Statistics(totals, _chunk_stats(summaries.to_pylist()))


def _chunk_stats(rows: list[str]) -> list[ChunkStats]:
    out = []
    for row in rows:
        d = json.loads(row)
        d["runs"] = [Run(**r) for r in d["runs"]]
        out.append(ChunkStats(**d))
    return out


def _statistics_in_process(
    source: SourceArchive, chunks: list[SourceChunk], duration_ms: int, handoff: dict[int, int] | None
) -> Statistics:
    """The pass without Spark: one task over every chunk, the sums by pyarrow."""
    rows = pa.Table.from_batches(
        _stats_task(source, chunks, duration_ms)(iter(chunk_batches(chunks, handoff=handoff))), _STATS_ARROW
    )
    kind = rows.column("kind").to_numpy()
    sums = (
        rows.filter(pa.array(kind == 0))
        .group_by(["key", "null_part"], use_threads=False)
        .aggregate([("bytes", "sum"), ("records", "sum")])
    )
    totals = pa.table(
        {
            "key": sums.column("key"),
            "null_part": sums.column("null_part"),
            "bytes": sums.column("bytes_sum"),
            "records": sums.column("records_sum"),
        }
    )
    return Statistics(totals, _chunk_stats(rows.filter(pa.array(kind == 1)).column("chunk").to_pylist()))

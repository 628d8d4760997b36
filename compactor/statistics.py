"""Phase 1 of the compaction: bytes and records per key, and per chunk the summaries slicing
needs, computed in Spark tasks; the driver receives per-key totals, never records."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from functools import partial

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from compactor.chunks import chunk_batches, chunk_frame, read_checked, spark_ddl
from compactor.history import batch_digests
from compactor.slicing import ChunkStats, Stretch, chunk_stretches
from compactor.sources import SourceArchive, SourceChunk
from compactor.task_errors import TaskErrors
from keygroups import envelope
from keygroups.key_hash import hash_keys

_STATS_ARROW = pa.schema(
    [("kind", pa.int32()), ("key", pa.binary()), ("null_part", pa.int32()), ("bytes", pa.int64()),
     ("records", pa.int64()), ("hash", pa.int64()), ("chunk", pa.string())]
)  # fmt: skip
STATS_SCHEMA = spark_ddl(_STATS_ARROW)
_BUCKETS_ARROW = pa.schema(
    [("bucket", pa.int32()), ("bytes", pa.int64()), ("records", pa.int64()), ("keys", pa.int64())]
)


@dataclass(frozen=True)
class KeySplit:
    """Which keys the driver receives one by one. `buckets` None: every key, while there are
    no more than `limit` (None: however many). Else the null-key pseudo-keys, keys above
    `threshold` bytes (None: none by size) and the keys in `known` (an append's: the archive's
    exact entries) come one by one, and the rest as one row per bucket of their hash."""

    buckets: int | None = None
    threshold: int | None = None
    known: pa.Array | None = None
    limit: int | None = None


@dataclass
class Statistics:
    totals: pa.Table  # key, null_part, bytes, records: a row per key the split keeps exact (null keys: per partition)
    chunks: list[ChunkStats]
    keys: int = 0  # distinct keys, null-key pseudo-keys included
    payload: int = 0  # bytes of every record
    buckets: pa.Table | None = None  # bucket, bytes, records, keys: every bucket, in order; None: no buckets


_INT_MAX = (1 << 31) - 1
Split = Callable[[int, int], KeySplit]  # (distinct keys, or fewer, payload bytes) -> the split


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
                hashes = hash_keys(keys).view(np.int64)
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
                    stretches=chunk_stretches(offsets, ts, duration_ms, partial(batch_digests, batch)),
                )
                # n key rows (kind 0), then one row with the chunk summary, its payload and
                # its distinct keys (kind 1)
                yield pa.RecordBatch.from_arrays(
                    [
                        pa.array(np.r_[np.zeros(n), [1]].astype(np.int32)),
                        pa.concat_arrays([keys.combine_chunks(), pa.nulls(1, pa.binary())]),
                        pa.concat_arrays([null_part, pa.array([-1], pa.int32())]),
                        pa.concat_arrays(
                            [agg.column("bytes_sum").combine_chunks(), pa.array([int(weights.sum())], pa.int64())]
                        ),
                        pa.concat_arrays([agg.column("bytes_count").combine_chunks(), pa.array([n], pa.int64())]),
                        pa.array(np.r_[hashes, [0]], pa.int64()),
                        pa.array([None] * n + [json.dumps(asdict(stats))], pa.string()),
                    ],
                    names=_STATS_ARROW.names,
                )

    return run


def run_statistics(
    spark,
    source: SourceArchive,
    chunks: list[SourceChunk],
    duration_ms: int,
    handoff: dict[int, int] | None = None,
    errors: TaskErrors | None = None,
    split: Split = lambda keys, payload: KeySplit(),
) -> Statistics:
    """`handoff`: for an append, each partition's first offset to count (the archive holds the
    rest); `errors`: the run's channel for bad input found in a task (raised here, at once);
    `split`: given the distinct keys (or a lower bound) and the payload, which keys come one
    by one.
    `spark=None`: the same task runs in this process (`compactor.job.compact`)."""
    if spark is None:
        return _statistics_in_process(source, chunks, duration_ms, handoff, split)
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
        # The chunk summaries first: they give the payload, and a lower bound on the distinct
        # keys (the most in one chunk) that most often settles exact against bucketed at once,
        # without a pass that counts the keys.
        chunk_rows = run("chunk summaries", stats.filter("kind = 1").select("chunk", "bytes", "records").toArrow)
        payload = int(pc.sum(chunk_rows.column("bytes")).as_py() or 0)
        at_least = int(pc.max(chunk_rows.column("records")).as_py() or 0)
        per_key = (
            stats.filter("kind = 0")
            .groupBy("key", "null_part")
            .agg(F.sum("bytes").alias("bytes"), F.sum("records").alias("records"), F.first("hash").alias("hash"))
        )
        how = split(at_least, payload)
        totals = None
        while how.buckets is None:
            capped = how.limit is not None and how.limit < _INT_MAX  # Spark's limit takes an int
            exact = per_key.drop("hash")
            totals = run("key totals", (exact.limit(how.limit + 1) if capped else exact).toArrow)
            if not capped or totals.num_rows <= how.limit:
                break
            how, totals = split(totals.num_rows, payload), None  # more keys than any chunk showed
        if totals is not None:
            keys, buckets = totals.num_rows, None
        else:
            totals, buckets = _bucketed(spark, per_key, how, run)
            keys = totals.num_rows + int(pc.sum(buckets.column("keys")).as_py() or 0)
        summaries = chunk_rows.column("chunk")
    finally:
        stats.unpersist()
    return Statistics(totals, _chunk_stats(summaries.to_pylist()), keys, payload, buckets)


def _bucketed(spark, per_key, how: KeySplit, run) -> tuple[pa.Table, pa.Table]:
    """Exact keys one by one and every bucket's sums, in one aggregation of the per-key sums."""
    from pyspark.sql import functions as F

    exact = F.col("null_part") >= 0
    if how.threshold is not None:
        exact = exact | (F.col("bytes") > F.lit(how.threshold))
    if how.known is not None and len(how.known):
        known = spark.createDataFrame(pa.table({"key": how.known, "_known": pa.repeat(True, len(how.known))}))
        per_key = per_key.join(F.broadcast(known), "key", "left")
        exact = exact | F.coalesce(F.col("_known"), F.lit(False))
    light = ~exact
    rows = run(
        "key and bucket totals",
        per_key.groupBy(
            F.when(exact, F.col("key")).alias("key"),
            F.when(exact, F.col("null_part")).alias("null_part"),
            F.when(light, F.col("hash").bitwiseAND(F.lit(how.buckets - 1)).cast("int")).alias("bucket"),
        )
        .agg(F.sum("bytes").alias("bytes"), F.sum("records").alias("records"), F.count("*").alias("keys"))
        .toArrow,
    )
    in_bucket = rows.column("bucket").is_valid()
    totals = rows.filter(pc.invert(in_bucket)).select(["key", "null_part", "bytes", "records"])
    return totals, _every_bucket(rows.filter(in_bucket).select(["bucket", "bytes", "records", "keys"]), how.buckets)


def _every_bucket(sums: pa.Table, buckets: int) -> pa.Table:
    """One row per bucket, in bucket order, empty buckets with zeros: the assignment lists
    every bucket, so a key never met still has a group."""
    out = {name: np.zeros(buckets, np.int64) for name in ("bytes", "records", "keys")}
    at = sums.column("bucket").to_numpy()
    for name in out:
        out[name][at] = sums.column(name).to_numpy()
    return pa.table({"bucket": pa.array(np.arange(buckets, dtype=np.int32)), **out}, schema=_BUCKETS_ARROW)


def _chunk_stats(rows: list[str]) -> list[ChunkStats]:
    out = []
    for row in rows:
        d = json.loads(row)
        d["stretches"] = [Stretch(**r) for r in d["stretches"]]
        out.append(ChunkStats(**d))
    return out


def _statistics_in_process(
    source: SourceArchive, chunks: list[SourceChunk], duration_ms: int, handoff: dict[int, int] | None, split: Split
) -> Statistics:
    """The pass without Spark: one task over every chunk, the sums by pyarrow."""
    rows = pa.Table.from_batches(
        _stats_task(source, chunks, duration_ms)(iter(chunk_batches(chunks, handoff=handoff))), _STATS_ARROW
    )
    kind = rows.column("kind").to_numpy()
    sums = (
        rows.filter(pa.array(kind == 0))
        .group_by(["key", "null_part"], use_threads=False)
        .aggregate([("bytes", "sum"), ("records", "sum"), ("hash", "first")])
    )
    per_key = pa.table(
        {
            "key": sums.column("key"),
            "null_part": sums.column("null_part"),
            "bytes": sums.column("bytes_sum"),
            "records": sums.column("records_sum"),
        }
    )
    payload = int(pc.sum(per_key.column("bytes")).as_py() or 0)
    how = split(per_key.num_rows, payload)
    buckets = None
    if how.buckets is not None:
        exact = per_key.column("null_part").to_numpy() >= 0
        if how.threshold is not None:
            exact |= per_key.column("bytes").to_numpy() > how.threshold
        if how.known is not None and len(how.known):
            exact |= pc.is_in(per_key.column("key"), value_set=how.known).to_numpy(zero_copy_only=False)
        light = per_key.filter(pa.array(~exact))
        light = light.append_column(
            "bucket", pa.array(sums.column("hash_first").to_numpy()[~exact] & (how.buckets - 1), pa.int32())
        )
        by_bucket = light.group_by("bucket", use_threads=False).aggregate(
            [("bytes", "sum"), ("records", "sum"), ("key", "count")]
        )
        by_bucket = by_bucket.rename_columns({"bytes_sum": "bytes", "records_sum": "records", "key_count": "keys"})
        buckets = _every_bucket(by_bucket, how.buckets)
        per_key = per_key.filter(pa.array(exact))
    chunk_rows = rows.filter(pa.array(kind == 1)).column("chunk").to_pylist()
    return Statistics(per_key, _chunk_stats(chunk_rows), sums.num_rows, payload, buckets)

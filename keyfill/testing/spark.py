"""The differential check for a Spark Structured Streaming query (`build(df) -> df`).

Per example: compact the drawn topic (in this process), then run the user's query twice
on a real Spark session and compare the rows it appends, per key:

- **backfill**: `readStream.format("keyfill")` over the compacted archive, with the
  example's slices per trigger, input partitions and batch rows, crashing once after a drawn
  number of micro-batches (an error in the sink after it has written the batch, so the batch
  is run again) and restarting from the checkpoint;
- **reference**: the same query fed every on-time record in one micro-batch (a Parquet file
  in the topic's live order, read by Spark's file source): nothing can be late, and it ends
  at the same watermark (the greatest event time less the query's delay), so both append
  the same finished windows.

Records late in their own partition by more than the settings' bound are taken out of both
inputs first (a left-anti join on the stream): whether they count depends on how partitions
interleave, live as much as in the backfill. The query's watermark delay must be at least
that bound (`backfill_settings(watermark_bound_ms=st.just(delay_ms))`). Then no row may be
dropped as late by the backfill's query (Spark's `numRowsDroppedByWatermark`), and each
key's rows must be the same multiset.

Several archives (a query that joins topics): `build` takes one DataFrame per archive; the
reference reads every topic's on-time records in its one micro-batch, and the backfill's
sources are paced in event time alike (`maxEventTimePerTrigger`: a stride of the example's
slices per trigger, from the earliest record of all), as a join of backfills should be run.

Append mode only: rows the query appends are final, so a key's rows can be compared as a
multiset whatever the micro-batches. (In update mode a row's last version counts, and the
check would need to know which columns name a row.)
"""

from __future__ import annotations

import os
import pickle
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from keyfill.synth.topic import Record, TopicArchive
from keyfill.testing.differential import DifferentialError, compact_example, compare_outputs, scratch
from keyfill.testing.reference import late_in_partition, live_order
from keyfill.testing.strategies import BackfillSettings
from keygroups.durations import parse_duration

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

# a DataFrame of the keyfill source's schema (one per archive) -> the output DataFrame
Build = Callable[..., "DataFrame"]
OutputRow = dict[str, Any]  # a row the query appended, its nested rows dicts too


class _Crash(RuntimeError):
    """Raised in the sink to stop a run part-way, as a failed executor or driver would."""


MARKER = "keyfill.testing: planned crash"


@dataclass(frozen=True)
class SparkCheckResult:
    records: int  # published
    late: int  # late in their partition, taken out of both inputs
    keys: int  # keys with rows
    rows: int  # rows appended (the reference's)
    batches: int  # the backfill's micro-batches with input, over all runs
    restarts: int  # runs that crashed and were resumed from the checkpoint


def spark_options(settings: BackfillSettings, start_ms: int | None = None) -> dict[str, str]:
    """The keyfill source's options for an example; with `start_ms`, paced in event time from
    there (several archives: a stride of the example's slices per trigger, from the earliest record)."""
    options: dict[str, int | str] = {"numPartitions": settings.threads, "batchSize": settings.batch_size}
    if start_ms is not None:
        stride_ms = parse_duration(settings.slice_duration) * (settings.slices_per_trigger or 1)
        options |= {"maxEventTimePerTrigger": f"{stride_ms}ms", "startingTimestamp": start_ms}
    elif settings.slices_per_trigger is not None:
        options["maxSlicesPerTrigger"] = settings.slices_per_trigger
    return {k: str(v) for k, v in options.items()}


def check_spark_query(
    spark: SparkSession,
    build: Build,
    archive: TopicArchive | Sequence[TopicArchive],
    settings: BackfillSettings,
    *,
    key: str,
    url: str | None = None,
    shuffle_partitions: int = 2,
) -> SparkCheckResult:
    """Run `build` over keyfill's backfill of `archive` and over the topic's on-time records
    in one batch, and check that no row is dropped as late and that each `key`'s rows are
    the same (see the module's docstring). Needs `format("keyfill")` registered
    (`reader.spark.register(spark)`; the `keyfill_spark` fixture does it).

    Args:
        spark: the session the query runs in.
        build: the query, from the source's DataFrame (one per archive, in their order).
        archive: the topic, or several (a join of topics: the backfill's sources are then
            paced in event time alike, `maxEventTimePerTrigger`).
        settings: how it is compacted and replayed (`backfill_settings()`).
        key: the output column whose rows are compared group by group.
        url: where the archives go (a folder, or an s3://, gs:// or az:// prefix; a
            temporary folder by default).
        shuffle_partitions: the session's spark.sql.shuffle.partitions while the check runs
            (each is a state store per micro-batch: a handful keeps a tiny example fast).

    Returns a SparkCheckResult; raises DifferentialError naming the first key whose rows differ.
    """
    archives = [archive] if isinstance(archive, TopicArchive) else list(archive)
    with scratch(url) as where, tempfile.TemporaryDirectory(prefix="keyfill-spark-check-") as work:
        done = [compact_example(a, settings, where) for a in archives]
        dests = [d.dest for d in done if d.dest is not None]
        if len(dests) < len(done):  # an empty topic: nothing to replay
            return SparkCheckResult(0, 0, 0, 0, 0, 0)
        late = [late_in_partition(d.records, settings.watermark_bound_ms) for d in done]
        shuffle = spark.conf.get("spark.sql.shuffle.partitions")
        spark.conf.set("spark.sql.shuffle.partitions", str(shuffle_partitions))
        start = min(r.timestamp for d in done for r in d.records) if len(done) > 1 else None
        try:
            inputs = [
                _reference_input(
                    spark, dest, [r for r in d.records if (r.partition, r.offset) not in gone], work + f"/{i}"
                )
                for i, (d, dest, gone) in enumerate(zip(done, dests, late))
            ]
            reference = _collect(spark, build(*inputs), work + "/ref-ck")
            if reference.dropped:
                raise DifferentialError(f"the reference query dropped {reference.dropped} row(s) in one micro-batch")
            streams = []
            for dest, gone in zip(dests, late):
                stream = spark.readStream.format("keyfill").options(**spark_options(settings, start)).load(dest)
                if gone:
                    late_df = spark.createDataFrame(sorted(gone), "partition int, offset long")
                    stream = stream.join(late_df, ["partition", "offset"], "left_anti").select(*stream.columns)
                streams.append(stream)
            stops = [1 + n % 3 for n in settings.restarts[:1]]  # micro-batches before the crash
            backfill = _collect(spark, build(*streams), work + "/ck", stops)
        finally:
            if shuffle is None:  # not set: Spark's default again
                spark.conf.unset("spark.sql.shuffle.partitions")
            else:
                spark.conf.set("spark.sql.shuffle.partitions", shuffle)
    if backfill.dropped:
        raise DifferentialError(
            f"the backfill's query dropped {backfill.dropped} row(s) as late (numRowsDroppedByWatermark) though "
            f"every record it read is on time in its partition (bound {settings.watermark_bound_ms} ms): is the "
            "query's watermark delay at least the bound?"
        )
    want, got = _by_key(reference.rows, key), _by_key(backfill.rows, key)
    compare_outputs(want, got)
    return SparkCheckResult(
        sum(len(d.records) for d in done),
        sum(len(g) for g in late),
        len(want),
        len(reference.rows),
        backfill.batches,
        backfill.restarts,
    )


def _reference_input(spark: SparkSession, dest: str, on_time: list[Record], work: str) -> DataFrame:
    """The on-time records as keyfill's source reads them (same schema and values), in the
    topic's live order, as one Parquet file streamed by Spark's file source."""
    batch = spark.read.format("keyfill").load(dest)
    order = [(r.partition, r.offset, i) for i, r in enumerate(live_order(on_time))]
    ranks = spark.createDataFrame(order, "partition int, offset long, _live long")
    path = work + "/reference-input"
    (
        batch.join(ranks, ["partition", "offset"])
        .repartition(1)
        .sortWithinPartitions("_live")
        .select(*batch.columns)
        .write.parquet(path)
    )
    return spark.readStream.schema(batch.schema).parquet(path)


@dataclass
class _Collected:
    rows: list[OutputRow]  # every appended row, each micro-batch counted once
    dropped: int
    batches: int
    restarts: int


def _collect(spark: SparkSession, df: DataFrame, checkpoint: str, stops: Sequence[int] = ()) -> _Collected:
    """Run `df` with AvailableNow into a sink keyed by batch id (a replayed batch replaces
    its first writing, as an idempotent sink does), crashing after `stops[i]` micro-batches
    of attempt i and resuming from `checkpoint`. An attempt is `available_now_to_end`'s runs:
    several where Spark runs one micro-batch a run (Spark 4.0 and 4.1).

    The sink keeps each batch's rows in a file of its own beside the checkpoint, and counts
    the batches an attempt wrote in files too: a Spark Connect session runs a `foreachBatch`
    function on the server, in a process of its own, where nothing it keeps in memory
    reaches this one (the check then needs a server that shares this machine's files: a
    local one)."""
    from pyspark.errors import StreamingQueryException

    from reader.available_now import available_now_to_end, progress

    folder = checkpoint + "-batches"
    os.makedirs(folder, exist_ok=True)
    dropped = batches = restarts = 0
    for attempt, stop in enumerate([*stops, None]):

        def sink(
            batch: DataFrame, batch_id: int, stop: int | None = stop, attempt: int = attempt, folder: str = folder
        ) -> None:
            rows = [r.asDict(recursive=True) for r in batch.collect()]
            name = os.path.join(folder, f"{batch_id:010d}.pickle")
            with open(name + ".part", "wb") as f:
                pickle.dump(rows, f)
            os.replace(name + ".part", name)
            open(os.path.join(folder, f"attempt-{attempt}-{batch_id}"), "w").close()
            ran = sum(n.startswith(f"attempt-{attempt}-") for n in os.listdir(folder))
            if stop is not None and ran >= stop:
                raise _Crash(MARKER)

        writer = df.writeStream.outputMode("append").foreachBatch(sink).option("checkpointLocation", checkpoint)
        queries: list[Any] = []
        crashed = False
        try:
            available_now_to_end(spark, writer, queries)
        except StreamingQueryException as e:
            if MARKER not in str(e):
                raise
            crashed = True
        for p in progress(queries):
            batches += p["numInputRows"] > 0
            dropped += sum(op.get("numRowsDroppedByWatermark", 0) for op in p.get("stateOperators", []))
        if not crashed:
            break
        restarts += 1
    rows: list[OutputRow] = []
    for name in sorted(n for n in os.listdir(folder) if n.endswith(".pickle")):
        with open(os.path.join(folder, name), "rb") as f:
            rows += pickle.load(f)
    return _Collected(rows, dropped, batches, restarts)


def _by_key(rows: list[OutputRow], key: str) -> dict[Any, list[OutputRow]]:
    """Each key's rows, sorted (appended rows are final: their order across micro-batches is not
    the query's result)."""
    out: dict[Any, list[OutputRow]] = {}
    for row in rows:
        if key not in row:
            raise KeyError(f"the query's output has no column {key!r}; it has {', '.join(row)}")
        out.setdefault(row[key], []).append(row)
    return {k: sorted(v, key=lambda r: repr(sorted(r.items()))) for k, v in out.items()}

"""A Spark source over compacted archives, through PySpark's Python Data Source API
(`reader.spark.register(spark)`, then `spark.readStream.format("keyfill").load(url)`).

A streaming offset is a slice position, `{"slice": n, "archive": <id>, "version": v}`:
every micro-batch holds whole slices and never part of one, so the micro-batch boundary is the reader's barrier made
cluster-wide. Spark's watermark (the largest event time seen, minus the delay) then moves
once per batch, at a slice end, and a record is late in the replay only if it was late in
its own Kafka partition with the same delay (docs/design.md, invariant 3).

A micro-batch's input partitions are key groups (or bundles of groups balanced by bytes,
with the `numPartitions` option). Each reads its groups' pieces of the batch's slices, a
group at a time in slice order, through the replay's group reader (`reader.fetch`), so a key's
records stay in order within its Spark partition and across batches. Spark's watermark
moves between micro-batches only, so the order of groups inside a batch changes nothing.

A streaming query follows the archive as it grows: each trigger looks for a newer version
(one LIST of `_versions/`), and appended slices come in later micro-batches. Offsets stay
valid across appends (an append keeps the archive id and only adds slices after the last);
a recompacted or overwritten archive has another id, which fails the query with
ArchiveChanged instead of mixing two archives' slices.

Planning (`latestOffset`, `partitions`) runs in one long-lived driver-side Python process
and reads only the index rows of the slices it plans; `read()` runs on a pickled copy in
the executors and only fetches and decodes pieces. `__init__` runs several times and only
parses options.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator, MutableMapping
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

import pyarrow as pa

import reader.spark.admission as spark_admission
import reader.spark.api as spark_api
from keygroups import spark_kind, worker_gc
from keygroups.executor_code import ship_to_executors
from reader.errors import ArchiveChanged, DataSourceOptionError, DataSourceUnavailable
from reader.kafka_live import KafkaRange, partition_marks
from reader.spark.admission import Admission
from reader.spark.api import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    Filter,
    InputPartition,
    ReadLimit,
    SupportsTriggerAvailableNow,
)
from reader.spark.enumerator import NAME, ArchivePlanner, GroupsPartition, Limits
from reader.spark.live import LivePlanner
from reader.spark.options import DEFAULT_MAX_BYTES_PER_TRIGGER, Options
from reader.spark.planning_process import keep_pandas_out
from reader.spark.pushdown import Pushdown, push
from reader.spark.rows import schema_ddl
from reader.strides import Strides

if TYPE_CHECKING:
    from pyspark.sql.types import StructType

__all__ = [  # what a user's code takes from here: the source, its options and its errors
    "DEFAULT_MAX_BYTES_PER_TRIGGER",
    "NAME",
    "ArchiveChanged",
    "KeyfillDataSource",
    "Options",
    "DataSourceOptionError",
    "register",
]


PUSHDOWN_CONF = "spark.sql.python.filterPushdown.enabled"


def register(spark: Any, *, filter_pushdown: bool = False) -> None:
    """Make `format("keyfill")` available in this Spark session. The session's default
    parallelism now (its cores) sizes the input partitions when `numPartitions` is not set.

    Args:
        spark: a classic or a Spark Connect session, PySpark 4.0 or later (3.5: see
            docs/deploy.md).
        filter_pushdown: batch reads take the filters Spark pushes (needs
            `spark.sql.python.filterPushdown.enabled` true, PySpark 4.1 or later). Opt-in,
            because PySpark 4.3 keeps a pushdown's read plan on the loaded DataFrame: a
            DataFrame scanned twice with different filters reads the last ones both times
            (docs/spark-source.md, "Filters").

    Raises DataSourceUnavailable on a Spark without Python data sources or without filter
    pushdown when it is asked for; DataSourceOptionError when the pushdown's setting is off.
    """
    spark_api.require_data_sources(spark)  # one line on a Spark without Python data sources (open-source 3.5)
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # holds reader/
    if filter_pushdown and not spark_api.FILTER_PUSHDOWN:
        raise DataSourceUnavailable(
            f"register(spark, filter_pushdown=True): this PySpark ({_pyspark_version()}) has no filter pushdown for "
            "Python data sources (Spark 4.1 or later has): leave filter_pushdown out, and filter the DataFrame"
        )
    if filter_pushdown and not _filter_pushdown(spark):
        raise DataSourceOptionError(
            f"register(spark, filter_pushdown=True) needs spark.conf.set({PUSHDOWN_CONF!r}, 'true') first: "
            "PySpark refuses a Python reader that takes filters while it is false"
        )
    if not spark_api.ADMISSION_CONTROL:
        logging.getLogger("keyfill").warning(
            "PySpark %s runs Trigger.AvailableNow over format('keyfill') as one micro-batch a run (Spark 4.2 runs "
            "it to the end): reader.available_now.available_now_to_end(spark, writer) runs it again until it has read "
            "everything (docs/spark-source.md)",
            _pyspark_version(),
        )
    ship_to_executors(spark)  # a Connect server may lack keyfill: its workers read the archive
    spark.dataSource.register(_portable(root, spark_kind.cores(spark), filter_pushdown))


def _pyspark_version() -> str:
    import pyspark

    return str(pyspark.__version__)


def _filter_pushdown(spark: Any) -> bool:
    try:
        return str(spark.conf.get(PUSHDOWN_CONF, "false")).strip().lower() == "true"
    except Exception:  # a Spark without the setting (before 4.1) has no pushdown
        return False


def _portable(root: str, cores: int | None = None, pushdown: bool = False) -> type[DataSource]:
    """KeyfillDataSource behind a stand-in that Spark pickles by value (a class made in a
    function), for the driver-side Python worker that plans a streaming query: Spark does not
    give that worker `--py-files`, so when it cannot import keyfill, the stand-in puts `root`
    (the folder this module was loaded from, on the driver's own machine: the install, or
    the copy extracted from the shipped wheel) on its path first. The stand-in uses nothing
    from this module's globals: everything it needs comes by value."""

    data_source_name = NAME

    def load(options: MutableMapping[str, str]) -> DataSource:
        import sys

        try:
            import reader.spark.source
        except ModuleNotFoundError:
            sys.path.append(root)
            import reader.spark.source
        source = reader.spark.source.KeyfillDataSource(options)
        source.session_cores = cores
        source.filter_pushdown = pushdown
        return source

    class KeyfillStandIn(DataSource):
        __doc__ = KeyfillDataSource.__doc__

        @classmethod
        def name(cls) -> str:
            return data_source_name

        def schema(self) -> StructType | str:
            return load(self.options).schema()

        def reader(self, schema: StructType) -> DataSourceReader:
            return load(self.options).reader(schema)

        def streamReader(self, schema: StructType) -> DataSourceStreamReader:
            return load(self.options).streamReader(schema)

    return KeyfillStandIn


class KeyfillDataSource(DataSource):
    """`format("keyfill")`: batch and streaming reads of a compacted archive."""

    @classmethod
    def name(cls) -> str:
        return NAME

    def schema(self) -> str:
        """Spark's Kafka source's columns (`headers` with includeHeaders=true), then key_group and slice."""
        return schema_ddl(Options.parse(self.options).include_headers)

    session_cores: int | None = None  # set by `register`: Spark's default parallelism
    filter_pushdown: bool = False  # set by `register`: spark.sql.python.filterPushdown.enabled

    def reader(self, schema: StructType | None) -> DataSourceReader:
        kind = KeyfillPushdownReader if self.filter_pushdown else KeyfillBatchReader
        return kind(self._options(schema))

    def streamReader(self, schema: StructType | None) -> DataSourceStreamReader:
        return KeyfillStreamReader(self._options(schema))

    def _options(self, schema: StructType | None) -> Options:
        """The options, for the query's schema: the source's own, or fewer columns a
        `.schema(...)` asked for (`reader.spark.rows.projection`); None, from a caller other
        than Spark: the source's own."""
        opts = Options.parse(self.options, session_cores=self.session_cores)
        if schema is None:
            return opts
        return opts.with_schema([(f.name, f.dataType.simpleString(), f.nullable) for f in schema.fields])


class KeyfillBatchReader(DataSourceReader):
    """`spark.read.format("keyfill")`: the whole archive (from `startingSlice`) at once."""

    pushed = Pushdown()  # the filters the source applies (KeyfillPushdownReader.pushFilters): none

    def __init__(self, opts: Options):
        self.opts = opts
        self.archive = ArchivePlanner(opts)
        self.live = LivePlanner(self.archive)

    def __getstate__(self) -> dict[str, Any]:
        """What a task is sent: the options and the pushed filters, not what planning loaded."""
        return {"opts": self.opts, "pushed": self.pushed}

    def __setstate__(self, state: dict[str, Any]) -> None:
        KeyfillBatchReader.__init__(self, state["opts"])  # the planners start empty: a task never plans
        self.pushed = state["pushed"]

    def partitions(self) -> list[InputPartition]:
        """The archive's slices; with kafka.* options, then the topic from the hand-off to its
        end offsets now. Only the pieces and live ranges the pushed filters let in."""
        archive, live, pushed = self.archive, self.live, self.pushed
        out: list[InputPartition] = []
        if pushed.has_topic(archive.manifest.topic):
            out += archive.plan(
                *pushed.slice_range(archive.first_slice(), archive.end_slice(), archive.manifest), pushed
            )
        if live.goes_live() and pushed.live(archive.topic):
            at = archive.offset(archive.manifest.slices)
            ends = live.ends(partition_marks(live.kafka, archive.topic))
            ranges = live.ranges(at, at | {"kafka": {str(p): o for p, o in ends.items()}})
            out += [r for r in ranges if pushed.has_partition(r.partition)]
        return out

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        worker_gc.settle()
        import reader.spark.split_reader as spark_read  # in the task only: planning never loads the decoder

        if isinstance(partition, KafkaRange):
            rows = self.pushed.rows("key_group")  # live records: the group of their key, or null
            batches = spark_read.read_live(self.opts, partition)
            return batches if rows is None else rows.apply(batches)
        if not isinstance(partition, GroupsPartition):  # PySpark's stand-in when partitions() has none
            return iter(())
        return spark_read.read_archive(self.opts, partition, self.pushed.rows("partition"))


class KeyfillPushdownReader(KeyfillBatchReader):
    """A batch read that takes the filters Spark pushes (`reader.spark.pushdown`): what `register`
    makes when spark.sql.python.filterPushdown.enabled is true (PySpark fails a reader that
    overrides pushFilters while it is false). Streaming reads get none: PySpark 4.3's
    DataSourceStreamReader has no pushFilters. PySpark 4.3 keeps the plan of the last
    pushdown on the loaded DataFrame, so each filtered scan needs its own `load()`
    (docs/spark-source.md, Filters)."""

    def pushFilters(self, filters: list[Filter]) -> Iterator[Filter]:
        self.pushed, rest = push(filters)
        return iter(rest)


class KeyfillStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """`spark.readStream.format("keyfill")`: whole slices per micro-batch.

    Admission control (Spark 4.2 and later, which hands `latestOffset` a start and a read
    limit; `reader.spark.admission`): a batch always takes at least one slice with records,
    however large, and empty slices are free (they ride along). Each trigger first moves to
    the latest version, so a running query picks up appends; Trigger.AvailableNow's target
    is the last slice of the version that was latest when the query started.

    Before 4.2 Spark asks `latestOffset()` with no arguments, once a trigger, and the source
    bounds its batches itself with the same default limit, from where the query is (`self.at`):
    the end of the batch Spark planned or replayed last (a restarted query first calls
    `partitions` with its last logged end), else, in a new query (which asks for the latest
    offset before the initial one), the initial offset. Trigger.AvailableNow is then one
    micro-batch a run, which `reader.available_now.available_now_to_end` repeats to the end."""

    def __init__(self, opts: Options):
        keep_pandas_out()  # in Spark's planning process only (reader.spark.planning_process)
        self.opts = opts
        self.archive = ArchivePlanner(opts)
        self.live = LivePlanner(self.archive)
        self.available_now = False
        self.live_target: dict[int, int] | None = None  # Trigger.AvailableNow: the topic's end offsets at the start
        self.at: dict[str, Any] | None = None  # the end of the batch planned last: where the query is
        paced = opts.max_event_time_per_trigger
        self.strides = Strides(paced) if paced else None

    def __getstate__(self) -> dict[str, Any]:
        """What a task is sent: the options, not what planning loaded."""
        return {"opts": self.opts}

    def __setstate__(self, state: dict[str, Any]) -> None:
        KeyfillStreamReader.__init__(self, state["opts"])  # the planners start empty: a task never plans

    def initialOffset(self) -> dict[str, Any]:
        first = self.archive.offset(self.archive.first_slice())
        if self.strides is None:
            return first
        self.strides.check(self.archive.manifest, self.archive.store.url)
        return first | {"stride": self.strides.of(self.archive.paced_start_ms())}

    def getDefaultReadLimit(self) -> ReadLimit:
        return spark_admission.default_read_limit(self.opts)

    def prepareForTriggerAvailableNow(self) -> None:
        self.available_now = True  # the target: the end of the version latest now (and of the topic)
        self.archive.refresh()
        if self.opts.kafka is not None:
            marks = partition_marks(self.opts.kafka, self.archive.topic)
            self.live_target = {p: high for p, (_, high) in marks.items()}

    def latestOffset(self, start: dict[str, Any] | None = None, limit: ReadLimit | None = None) -> dict[str, Any]:
        """Whole slices while the archive lasts; with kafka.* options, once every slice has
        been read (a trigger later), the topic from the hand-off offsets on. A trigger reads
        the archive or the topic, never both. Its parameters (which make Spark 4.2 and later
        pass them, with admission control) are None from an older Spark: the source's own
        limits from where the query is (the class docstring)."""
        if start is None or limit is None:
            start = self.at if self.at is not None else self.initialOffset()
            limit = self.getDefaultReadLimit()
        self.at = self._latest(start, spark_admission.of_read_limit(self.opts, limit))
        return self.at

    def _latest(self, start: dict[str, Any], admit: Admission) -> dict[str, Any]:
        archive = self.archive
        if "kafka" in start:
            archive.position(start)  # the same archive
            return self.live.latest(start, start, admit.live_rows, self.live_target)
        end = self._archive_latest(start, admit.archive)
        if not self.live.goes_live() or end["slice"] != archive.position(start):
            return end
        if end["slice"] < archive.manifest.slices:
            return end
        # the switch: from the hand-off offsets (a partition the topic gained since: from 0, below)
        switch_at = self.live.switch_offsets(archive.manifest.version)
        switch = end | {"kafka": {str(p): o for p, o in switch_at.items()}}
        return self.live.latest(start, switch, admit.live_rows, self.live_target)

    def _archive_latest(self, start: dict[str, Any], limits: Limits) -> dict[str, Any]:
        archive = self.archive
        if not self.available_now:
            archive.refresh()
        slices = archive.end_slice()
        first = archive.position(start)
        if self.strides is not None:
            return self.strides.latest(archive, start, first, slices)
        return archive.offset(archive.admit(first, slices, limits))

    def reportLatestOffset(self) -> dict[str, Any]:
        """The latest offset, with how far behind it the query is (PySpark gives a Python source
        no metrics of its own; Spark shows this in the source's `latestOffset` of each progress):
        slices behind and the event time reached, then in the live phase the Kafka source's
        offsets behind the latest per partition (max, avg, min)."""
        latest = self.archive.offset(self.archive.end_slice())
        at = self.at
        if at is None:
            return latest
        s = int(at["slice"])
        progress: dict[str, Any] = {"slicesBehind": max(0, latest["slice"] - s)}
        if s > 0:
            end_ms = self.archive.manifest_of(int(at["version"])).bounds(s - 1)[1]
            progress["eventTimeReached"] = datetime.fromtimestamp(end_ms / 1000, timezone.utc).isoformat()
        marks = self.live.marks
        if "kafka" in at and marks:
            behind = [max(0, high - int(at["kafka"].get(str(p), 0))) for p, (_, high) in sorted(marks.items())]
            progress |= {
                "maxOffsetsBehindLatest": max(behind),
                "avgOffsetsBehindLatest": sum(behind) / len(behind),
                "minOffsetsBehindLatest": min(behind),
            }
        return latest | {"progress": progress}

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> list[InputPartition]:
        self.at = end  # before Spark 4.2, how a restarted query says where it is (the class docstring)
        if "kafka" in end:
            self.archive.position(end)
            return list(self.live.ranges(start, end))
        return list(self.archive.plan(self.archive.position(start), self.archive.position(end)))

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        worker_gc.settle()
        import reader.spark.split_reader as spark_read  # in the task only: planning never loads the decoder

        if isinstance(partition, KafkaRange):
            return spark_read.read_live(self.opts, partition)
        assert isinstance(partition, GroupsPartition)
        return spark_read.read_archive(self.opts, partition)

    def commit(self, end: dict[str, Any]) -> None:
        """Nothing to release: offsets are positions in versions that never change (and Spark
        may skip this call for the last batch of an AvailableNow run)."""

    def stop(self) -> None:
        pass

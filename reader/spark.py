"""A Spark source over compacted archives, through PySpark's Python Data Source API.

    import reader.spark
    reader.spark.register(spark)
    stream = spark.readStream.format("keyfill").load("s3://bucket/compacted")
    table = spark.read.format("keyfill").load("s3://bucket/compacted")

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

import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
from pyspark.sql.datasource import DataSource, DataSourceReader, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxBytes,
    ReadMaxFiles,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import StructType

import keygroups
from keygroups import compacted, handoff
from keygroups.assignment import KeyAssignment, load_assignment
from keygroups.errors import KeyfillError, OptionError
from keygroups.piece_index import SLICES_PER_ROW_GROUP, PieceIndex, piece_list
from keygroups.storage import Storage, open_storage
from reader.fetch import bounded_read_ahead, read_groups
from reader.kafka_live import (
    KAFKA_PREFIX,
    KafkaOptions,
    KafkaRange,
    capped,
    check_available,
    plan_ranges,
    read_range,
    topic_partitions,
    watermarks,
)

NAME = "keyfill"
SCHEMA_DDL = (
    "partition int, offset long, timestamp timestamp, key binary, value binary, "
    "headers array<struct<key: string, value: binary>>, key_group int, slice int"
)
# What read() yields, field for field: Spark refuses batches whose Arrow types differ
# (timestamps in microseconds, int32 for int).
ARROW_SCHEMA = pa.schema(
    [
        pa.field("partition", pa.int32()),
        pa.field("offset", pa.int64()),
        pa.field("timestamp", pa.timestamp("us", tz="UTC")),
        pa.field("key", pa.binary()),
        pa.field("value", pa.binary()),
        pa.field("headers", pa.list_(pa.field("element", pa.struct([("key", pa.string()), ("value", pa.binary())])))),
        pa.field("key_group", pa.int32()),
        pa.field("slice", pa.int32()),
    ]
)


class SourceOptionError(OptionError):
    """An option of the keyfill Spark source is missing or malformed; names the option."""


class ArchiveChanged(KeyfillError, ValueError):
    """A query's checkpointed offsets belong to another archive than the one now at its URL."""


OPTION_NAMES = ("path", "maxSlicesPerTrigger", "maxBytesPerTrigger", "numPartitions", "batchRows", "startingSlice")
# The live phase's (with any kafka.* option; docs/kafka-live.md), named as Spark's Kafka source names them.
KAFKA_OPTION_NAMES = (
    "subscribe",
    "maxOffsetsPerTrigger",
    "minPartitions",
    "failOnDataLoss",
    "kafkaConsumer.pollTimeoutMs",
)
_KNOWN = {name.lower() for name in OPTION_NAMES + KAFKA_OPTION_NAMES}
DEFAULT_MAX_BYTES_PER_TRIGGER = compacted.TRIGGER_BYTES  # when neither limit is set
# A task's read-ahead: its groups' runs in flight. Several tasks share an executor's memory,
# so far below the replay's budget; each group still gets two runs of up to GET_BYTES while
# the task has at most 4 groups.
TASK_READ_AHEAD_BYTES = 8 * compacted.GET_BYTES


@dataclass(frozen=True)
class Options:
    """The source's options, parsed from Spark's string map (names are case-insensitive)."""

    path: str
    max_slices_per_trigger: int | None = None
    max_bytes_per_trigger: int | None = None
    num_partitions: int | None = None
    batch_rows: int = 65_536
    starting_slice: int = 0
    kafka: KafkaOptions | None = None  # None: the archive alone

    @classmethod
    def parse(cls, options: dict[str, str]) -> Options:
        opts = {k.lower(): v for k, v in options.items()}
        unknown = sorted(k for k in options if k.lower() not in _KNOWN and not k.lower().startswith(KAFKA_PREFIX))
        if unknown:  # a misspelt limit would otherwise be ignored without a word
            raise SourceOptionError(
                f"unknown option{'s' if len(unknown) > 1 else ''} {', '.join(unknown)}; the keyfill source knows "
                f"{', '.join(sorted(OPTION_NAMES + KAFKA_OPTION_NAMES))} and kafka.* (names are case-insensitive)"
            )
        path = opts.get("path")
        if not path:
            raise SourceOptionError('the keyfill source needs the archive URL: .load("s3://bucket/compacted")')

        def positive(name: str) -> int | None:
            raw = opts.get(name.lower())
            if raw is None:
                return None
            try:
                value = int(raw)
            except ValueError:
                raise SourceOptionError(f"option {name}={raw!r}: expected a whole number") from None
            if value < 1:
                raise SourceOptionError(f"option {name}={raw!r}: must be at least 1")
            return value

        start = opts.get("startingslice", "0")
        if not start.isdigit():
            raise SourceOptionError(f"option startingSlice={start!r}: expected a slice number (0 or more)")
        client = {k[len(KAFKA_PREFIX) :]: v for k, v in options.items() if k.lower().startswith(KAFKA_PREFIX)}
        live = [name for name in KAFKA_OPTION_NAMES if name.lower() in opts]
        if live and not client:
            raise SourceOptionError(
                f"option {live[0]} is for the live phase, which needs kafka.bootstrap.servers (docs/kafka-live.md)"
            )
        kafka = None
        if client:
            if "bootstrap.servers" not in client:
                raise SourceOptionError("the live phase needs kafka.bootstrap.servers (host:port,...)")
            fail = opts.get("failondataloss", "true").lower()
            if fail not in ("true", "false"):
                raise SourceOptionError(f"option failOnDataLoss={fail!r}: expected true or false")
            kafka = KafkaOptions(
                client=client,
                topic=opts.get("subscribe") or None,
                max_offsets_per_trigger=positive("maxOffsetsPerTrigger"),
                min_partitions=positive("minPartitions"),
                fail_on_data_loss=fail == "true",
                poll_timeout_ms=positive("kafkaConsumer.pollTimeoutMs") or KafkaOptions.poll_timeout_ms,
            )
        return cls(
            path=path,
            max_slices_per_trigger=positive("maxSlicesPerTrigger"),
            max_bytes_per_trigger=positive("maxBytesPerTrigger"),
            num_partitions=positive("numPartitions"),
            batch_rows=positive("batchRows") or 65_536,
            starting_slice=int(start),
            kafka=kafka,
        )


@dataclass(frozen=True)
class GroupsPartition(InputPartition):
    """One Spark input partition: some key groups' pieces over a range of slices, group by
    group, each group's in slice order (the order they are read in)."""

    pieces: tuple[compacted.Piece, ...]


_assignments: dict[tuple[str, str], KeyAssignment] = {}  # (archive URL, assignment file) -> lookup; per process


def register(spark: Any) -> None:
    """Make `format("keyfill")` available in this Spark session."""
    spark.dataSource.register(_portable(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


def _portable(root: str) -> type[DataSource]:
    """KeyfillDataSource behind a stand-in that Spark pickles by value (a class made in a
    function), for the driver-side Python worker that plans a streaming query: Spark does not
    give that worker `--py-files`, so when it cannot import keyfill, the stand-in puts `root`
    (the folder this module was loaded from, on the driver's own machine: the install, or
    the copy extracted from the shipped wheel) on its path first. The stand-in uses nothing
    from this module's globals: everything it needs comes by value."""

    source_name = NAME

    def load() -> type[DataSource]:
        import sys

        try:
            import reader.spark
        except ModuleNotFoundError:
            sys.path.append(root)
            import reader.spark
        return reader.spark.KeyfillDataSource

    class KeyfillSource(DataSource):
        __doc__ = KeyfillDataSource.__doc__

        @classmethod
        def name(cls) -> str:
            return source_name

        def schema(self):
            return load()(self.options).schema()

        def reader(self, schema):
            return load()(self.options).reader(schema)

        def streamReader(self, schema):
            return load()(self.options).streamReader(schema)

    return KeyfillSource


class KeyfillDataSource(DataSource):
    """`format("keyfill")`: batch and streaming reads of a compacted archive."""

    @classmethod
    def name(cls) -> str:
        return NAME

    def schema(self) -> str:
        return SCHEMA_DDL

    def reader(self, schema: StructType) -> DataSourceReader:
        return KeyfillBatchReader(Options.parse(self.options))

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return KeyfillStreamReader(Options.parse(self.options))


class _Planner:
    """Driver-side view of the archive: the manifest of the version being planned, and index
    rows as planning needs them (a version never changes; `refresh` moves to a newer one)."""

    def __init__(self, opts: Options):
        self.opts = opts
        self._store: Storage | None = None
        self._manifest: compacted.Manifest | None = None
        self._index: PieceIndex | None = None

    def __getstate__(self) -> dict:  # read() needs only the options
        return {"opts": self.opts, "_store": None, "_manifest": None, "_index": None}

    @property
    def store(self) -> Storage:
        if self._store is None:
            self._store = open_storage(self.opts.path)
        return self._store

    @property
    def manifest(self) -> compacted.Manifest:
        if self._manifest is None:
            self._manifest = compacted.load_manifest(self.store)
            if self.opts.starting_slice > self._manifest.slices:
                raise SourceOptionError(
                    f"option startingSlice={self.opts.starting_slice}: {self.store.url} has "
                    f"{self._manifest.slices} slices"
                )
        return self._manifest

    def refresh(self) -> compacted.Manifest:
        """Move to the latest version if one was committed since: an append's slices become
        plannable. A newer version of another archive is loaded too; `position` then refuses
        the query's offsets."""
        current = self.manifest
        latest = compacted.versions(self.store)
        if latest and latest[-1] > current.version:
            self._manifest = compacted.load_manifest(self.store, latest[-1])
            self._index = None
        return self._manifest

    @property
    def index(self) -> PieceIndex:
        if self._index is None:
            self._index = PieceIndex.of(self.store, self.manifest)
        return self._index

    @property
    def fingerprint(self) -> str:
        """The archive's id, in every offset, so a checkpoint cannot silently resume against a
        recompacted archive (equal inputs and config give equal ids)."""
        return self.manifest.archive

    def offset(self, s: int) -> dict:
        return {"slice": s, "archive": self.fingerprint, "version": self.manifest.version}

    def position(self, offset: dict) -> int:
        """The slice of an offset of this archive."""
        if offset.get("archive") != self.fingerprint:
            raise ArchiveChanged(
                f"{self.store.url}: the query's checkpoint holds offsets of archive {offset.get('archive')}, but this "
                f"archive is {self.fingerprint} (recompacted since?). Restart the query with a new checkpoint "
                "location, or point it at the archive it started on."
            )
        if int(offset["slice"]) > self.manifest.slices:
            raise ArchiveChanged(
                f"{self.store.url}: the query's checkpoint is at slice {offset['slice']} of version "
                f"{offset.get('version')}, but version {self.manifest.version} has {self.manifest.slices} slices"
            )
        return int(offset["slice"])

    def manifest_of(self, version: int) -> compacted.Manifest:
        """The manifest of `version` (a version never changes)."""
        if version == self.manifest.version:
            return self.manifest
        return compacted.load_manifest(self.store, version)

    @property
    def topic(self) -> str:
        return self.opts.kafka.topic or self.manifest.topic

    def live_start(self, manifest: compacted.Manifest) -> dict[int, int]:
        """Where the live phase begins: each partition's hand-off offset, and offset 0 of a
        partition the topic has gained since the archive was written."""
        start = handoff.offsets(manifest)
        for p in topic_partitions(self.opts.kafka, self.topic):
            start.setdefault(p, 0)
        return start

    def live_positions(self, offset: dict, end: dict | None = None) -> dict[int, int]:
        """The Kafka offsets an offset stands for: its own in the live phase; at the switch,
        the hand-off of the version the first live offset (`end`) was planned on."""
        if "kafka" in offset:
            return {int(p): int(o) for p, o in offset["kafka"].items()}
        start = handoff.offsets(self.manifest_of(int((end or offset)["version"])))
        for p in (end or {}).get("kafka", {}):
            start.setdefault(int(p), 0)
        return start

    def live_ranges(self, start: dict, end: dict) -> list[KafkaRange]:
        """Input partitions for the live offsets between two offsets: one per Kafka partition
        (or more with minPartitions), each checked against what the topic still holds."""
        k = self.opts.kafka
        first = self.live_positions(start, end)
        last = {int(p): int(o) for p, o in end["kafka"].items()}
        marks = watermarks(k, self.topic, sorted(last))
        first = check_available(self.topic, {p: first.get(p, 0) for p in last}, marks, k.fail_on_data_loss)
        return plan_ranges(self.topic, first, last, k.min_partitions, self.opts.path, self.manifest.assignment)

    def group_of(self, assignment: str):
        """The key group of live records, by the assignment the range was planned with (a
        key it lacks: null)."""
        key = (self.opts.path, assignment)
        if key not in _assignments:
            _assignments.clear()
            _assignments[key] = KeyAssignment.from_table(load_assignment(self.store, assignment))
        return _assignments[key].group_of

    def read_live(self, r: KafkaRange) -> Iterator[pa.RecordBatch]:
        return read_range(self.opts.kafka, r, self.opts.batch_rows, ARROW_SCHEMA, self.group_of(r.assignment))

    def slice_sizes(self, first: int, end: int) -> tuple[np.ndarray, np.ndarray]:
        """Records and bytes of slices [first, end), from the slice index alone."""
        rows = self.index.slice_rows(first, end)
        return rows.column("records").to_numpy(), rows.column("bytes").to_numpy()

    def plan(self, first: int, end: int) -> list[GroupsPartition]:
        """Input partitions for slices [first, end): one per non-empty group, or
        `numPartitions` bundles of groups balanced by bytes."""
        by_group: dict[int, list[compacted.Piece]] = {}
        table = self.index.piece_rows(first, end)
        for p in piece_list(table):
            p.check(self.manifest.groups, self.store.url_for)
            by_group.setdefault(p.group, []).append(p)
        groups = sorted(by_group)
        if not groups:
            return []
        bundles = min(self.opts.num_partitions or len(groups), len(groups))
        weights = np.array([sum(p.length for p in by_group[g]) for g in groups], np.int64)
        owner = keygroups.assign_threads(weights, bundles) if bundles < len(groups) else np.arange(len(groups))
        parts = []
        for b in range(bundles):
            mine = tuple(p for i, g in enumerate(groups) if owner[i] == b for p in by_group[g])
            if mine:
                parts.append(GroupsPartition(mine))
        return parts

    def read(self, partition: GroupsPartition) -> Iterator[pa.RecordBatch]:
        """The partition's groups through the replay's group reader (`reader.fetch`)."""
        budget = bounded_read_ahead(TASK_READ_AHEAD_BYTES, os.cpu_count() or 1)  # a task per core at most
        for step, batch in read_groups(
            self.store, partition.pieces, read_ahead_bytes=budget, part_bytes=compacted.GET_BYTES
        ):
            slices = np.repeat(step.slice, step.records)
            yield from to_spark_batches(batch, int(step.group[0]), slices, self.opts.batch_rows)


def to_spark_batches(batch: pa.RecordBatch, group: int, s: int | np.ndarray, rows: int) -> Iterator[pa.RecordBatch]:
    """An envelope batch as the source's schema (`s`: the slice of every record, or one per
    record), in batches of at most `rows` records."""
    n = batch.num_rows
    slices = np.full(n, s, np.int32) if np.ndim(s) == 0 else np.asarray(s, np.int32)
    columns = [
        batch.column("partition"),
        batch.column("offset"),
        batch.column("timestamp").cast(pa.timestamp("us", tz="UTC")),
        batch.column("key"),
        batch.column("value"),
        batch.column("headers").cast(ARROW_SCHEMA.field("headers").type),
        pa.array(np.full(n, group, np.int32)),
        pa.array(slices),
    ]
    out = pa.RecordBatch.from_arrays(columns, schema=ARROW_SCHEMA)
    for start in range(0, n, rows):
        yield out.slice(start, rows)


class KeyfillBatchReader(DataSourceReader):
    """`spark.read.format("keyfill")`: the whole archive (from `startingSlice`) at once."""

    def __init__(self, opts: Options):
        self.planner = _Planner(opts)

    def partitions(self) -> list[InputPartition]:
        """The archive's slices; with kafka.* options, then the topic from the hand-off to its
        end offsets now."""
        planner = self.planner
        out: list[InputPartition] = list(planner.plan(planner.opts.starting_slice, planner.manifest.slices))
        if planner.opts.kafka is not None:
            start = planner.live_start(planner.manifest)
            marks = watermarks(planner.opts.kafka, planner.topic, sorted(start))
            end = planner.offset(planner.manifest.slices) | {"kafka": {str(p): marks[p][1] for p in start}}
            out += planner.live_ranges(planner.offset(planner.manifest.slices), end)
        return out

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        if isinstance(partition, KafkaRange):
            return self.planner.read_live(partition)
        assert isinstance(partition, GroupsPartition)
        return self.planner.read(partition)


class KeyfillStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """`spark.readStream.format("keyfill")`: whole slices per micro-batch.

    Admission control: `maxSlicesPerTrigger` becomes Spark's ReadMaxFiles (a slice counts
    as a file), else `maxBytesPerTrigger` becomes ReadMaxBytes; when both are set both
    apply. A batch always takes at least one slice with records, however large, and empty
    slices are free (they ride along). Each trigger first moves to the latest version, so a
    running query picks up appends; Trigger.AvailableNow's target is the last slice of the
    version that was latest when the query started."""

    def __init__(self, opts: Options):
        self.planner = _Planner(opts)
        self.opts = opts
        self.available_now = False
        self.live_target: dict[int, int] | None = None  # Trigger.AvailableNow: the topic's end offsets at the start

    def initialOffset(self) -> dict:
        return self.planner.offset(self.opts.starting_slice)

    def getDefaultReadLimit(self) -> ReadLimit:
        if self.opts.max_slices_per_trigger:
            return ReadMaxFiles(self.opts.max_slices_per_trigger)
        return ReadMaxBytes(self.opts.max_bytes_per_trigger or DEFAULT_MAX_BYTES_PER_TRIGGER)

    def prepareForTriggerAvailableNow(self) -> None:
        self.available_now = True  # the target: the end of the version latest now (and of the topic)
        manifest = self.planner.refresh()
        if self.opts.kafka is not None:
            start = self.planner.live_start(manifest)
            marks = watermarks(self.opts.kafka, self.planner.topic, sorted(start))
            self.live_target = {p: high for p, (_, high) in marks.items()}

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        """Whole slices while the archive lasts; with kafka.* options, once every slice has
        been read (a trigger later), the topic from the hand-off offsets on. A trigger reads
        the archive or the topic, never both."""
        if "kafka" in start:
            self.planner.position(start)  # the same archive
            return self._live_latest(start, start, limit)
        end = self._archive_latest(start, limit)
        if self.opts.kafka is None or end["slice"] != self.planner.position(start):
            return end
        if end["slice"] < self.planner.manifest.slices:
            return end
        switch = end | {"kafka": {str(p): o for p, o in self.planner.live_start(self.planner.manifest).items()}}
        return self._live_latest(start, switch, limit)

    def _live_latest(self, start: dict, at: dict, limit: ReadLimit) -> dict:
        """The next live offset from `at` (`start` itself when the topic has nothing new)."""
        k = self.opts.kafka
        positions = {int(p): int(o) for p, o in at["kafka"].items()}
        for p in topic_partitions(k, self.planner.topic):
            positions.setdefault(p, 0)  # a partition added while the query runs
        marks = watermarks(k, self.planner.topic, sorted(positions))
        positions = check_available(self.planner.topic, positions, marks, k.fail_on_data_loss)
        latest = {p: marks[p][1] for p in positions}
        if self.live_target is not None:
            latest = {p: max(positions[p], min(latest[p], self.live_target.get(p, 0))) for p in positions}
        most = None
        if isinstance(limit, ReadMaxRows):
            most = limit.max_rows
        elif not isinstance(limit, ReadAllAvailable):
            most = k.max_offsets_per_trigger
        end = capped(positions, latest, most)
        if "kafka" in start and end == {int(p): int(o) for p, o in start["kafka"].items()}:
            return start
        if "kafka" not in start and end == positions:
            return start  # nothing live yet: stay at the archive's end, no empty batch
        return at | {"kafka": {str(p): o for p, o in sorted(end.items())}}

    def _archive_latest(self, start: dict, limit: ReadLimit) -> dict:
        manifest = self.planner.manifest if self.available_now else self.planner.refresh()
        slices = manifest.slices
        first = self.planner.position(start)
        max_slices = max_bytes = max_rows = None
        if not isinstance(limit, ReadAllAvailable):
            max_slices, max_bytes = self.opts.max_slices_per_trigger, self.opts.max_bytes_per_trigger
        if isinstance(limit, ReadMaxFiles):
            max_slices = limit.max_files
        elif isinstance(limit, ReadMaxBytes):
            max_bytes = limit.max_bytes
        elif isinstance(limit, ReadMaxRows):
            max_rows = limit.max_rows
        if max_slices is None and max_bytes is None and max_rows is None:
            return self.planner.offset(slices)
        end, taken, nbytes, rows = first, 0, 0, 0
        while end < slices:
            block = min(slices, end - end % SLICES_PER_ROW_GROUP + SLICES_PER_ROW_GROUP)
            for n, b in zip(*(x.tolist() for x in self.planner.slice_sizes(end, block))):
                if n:
                    over = (
                        (max_slices is not None and taken + 1 > max_slices)
                        or (max_bytes is not None and nbytes + b > max_bytes)
                        or (max_rows is not None and rows + n > max_rows)
                    )
                    if over and taken:
                        return self.planner.offset(end)
                    taken, nbytes, rows = taken + 1, nbytes + b, rows + n
                end += 1
        return self.planner.offset(end)

    def reportLatestOffset(self) -> dict:
        return self.planner.offset(self.planner.manifest.slices)

    def partitions(self, start: dict, end: dict) -> list[InputPartition]:
        if "kafka" in end:
            self.planner.position(end)
            return list(self.planner.live_ranges(start, end))
        return list(self.planner.plan(self.planner.position(start), self.planner.position(end)))

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        if isinstance(partition, KafkaRange):
            return self.planner.read_live(partition)
        assert isinstance(partition, GroupsPartition)
        return self.planner.read(partition)

    def commit(self, end: dict) -> None:
        """Nothing to release: offsets are positions in versions that never change (and Spark
        may skip this call for the last batch of an AvailableNow run)."""

    def stop(self) -> None:
        pass

"""A Spark source over compacted archives, through PySpark's Python Data Source API.

    import reader.spark
    reader.spark.register(spark)
    stream = spark.readStream.format("keyfill").load("s3://bucket/compacted")
    table = spark.read.format("keyfill").load("s3://bucket/compacted")

A streaming offset is a slice position, `{"slice": n, "archive": <manifest fingerprint>}`:
every micro-batch holds whole slices
and never part of one, so the micro-batch boundary is the reader's barrier made
cluster-wide. Spark's watermark (the largest event time seen, minus the delay) then moves
once per batch, at a slice end, and a record is late in the replay only if it was late in
its own Kafka partition with the same delay (DESIGN.md invariant 3).

A micro-batch's input partitions are key groups (or bundles of groups balanced by bytes,
with the `numPartitions` option). Each reads its groups' files slice by slice, in file
order, so a key's records stay in order within its Spark partition and across batches.

Planning (`latestOffset`, `partitions`) runs in one long-lived driver-side Python process
and caches the manifest and slice metadata there; `read()` runs on a pickled copy in the
executors and only fetches and decodes files. `__init__` runs several times and only
parses options.
"""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
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
from keygroups import compacted
from keygroups.errors import KeyfillError, OptionError
from keygroups.storage import Storage, open_storage

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


@dataclass(frozen=True)
class Options:
    """The source's options, parsed from Spark's string map (names are case-insensitive)."""

    path: str
    max_slices_per_trigger: int | None = None
    max_bytes_per_trigger: int | None = None
    num_partitions: int | None = None
    batch_rows: int = 65_536
    starting_slice: int = 0

    @classmethod
    def parse(cls, options: dict[str, str]) -> Options:
        opts = {k.lower(): v for k, v in options.items()}
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
        return cls(
            path=path,
            max_slices_per_trigger=positive("maxSlicesPerTrigger"),
            max_bytes_per_trigger=positive("maxBytesPerTrigger"),
            num_partitions=positive("numPartitions"),
            batch_rows=positive("batchRows") or 65_536,
            starting_slice=int(start),
        )


@dataclass(frozen=True)
class FilePart:
    """One group file of one slice, with the metadata its bytes are checked against."""

    slice: int
    file: compacted.GroupFile

    @property
    def group(self) -> int:
        return self.file.group

    @property
    def key(self) -> str:
        return self.file.key

    @property
    def file_bytes(self) -> int:
        return self.file.file_bytes

    @property
    def records(self) -> int:
        return self.file.records


@dataclass(frozen=True)
class GroupsPartition(InputPartition):
    """One Spark input partition: some key groups' files over a range of slices, in the
    order they are read (slice by slice)."""

    files: tuple[FilePart, ...]


def register(spark: Any) -> None:
    """Make `format("keyfill")` available in this Spark session."""
    spark.dataSource.register(KeyfillDataSource)


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
    """Driver-side view of the archive: manifest and slice metadata, loaded once and kept
    (the archive is immutable once its manifest exists)."""

    def __init__(self, opts: Options):
        self.opts = opts
        self._store: Storage | None = None
        self._manifest: compacted.Manifest | None = None
        self._metas: dict[int, compacted.SliceMeta] = {}
        self._fingerprint: str | None = None

    def __getstate__(self) -> dict:  # read() needs only the options
        return {"opts": self.opts, "_store": None, "_manifest": None, "_metas": {}, "_fingerprint": None}

    @property
    def store(self) -> Storage:
        if self._store is None:
            self._store = open_storage(self.opts.path)
        return self._store

    def load(self) -> compacted.Manifest:
        return self.manifest

    @property
    def manifest(self) -> compacted.Manifest:
        if self._manifest is None:
            self._manifest = compacted.load_manifest(self.store)
            if self.opts.starting_slice > len(self._manifest.slices):
                raise SourceOptionError(
                    f"option startingSlice={self.opts.starting_slice}: {self.store.url} has "
                    f"{len(self._manifest.slices)} slices"
                )
        return self._manifest

    @property
    def fingerprint(self) -> str:
        """Identifies the archive in every offset, so a checkpoint cannot silently resume
        against a recompacted archive (equal inputs and config give equal manifests)."""
        if self._fingerprint is None:
            self._fingerprint = compacted.fingerprint(self.manifest)
        return self._fingerprint

    def offset(self, s: int) -> dict:
        return {"slice": s, "archive": self.fingerprint}

    def position(self, offset: dict) -> int:
        """The slice of an offset of this archive."""
        if offset.get("archive") != self.fingerprint:
            raise ArchiveChanged(
                f"{self.store.url}: the query's checkpoint holds offsets of archive {offset.get('archive')}, but this "
                f"archive is {self.fingerprint} (recompacted since?). Restart the query with a new checkpoint "
                "location, or point it at the archive it started on."
            )
        return int(offset["slice"])

    def slice_meta(self, s: int) -> compacted.SliceMeta:
        if s not in self._metas:
            self._metas[s] = compacted.slice_meta(self.store, self.manifest.slices[s])
        return self._metas[s]

    def plan(self, first: int, end: int) -> list[GroupsPartition]:
        """Input partitions for slices [first, end): one per non-empty group, or
        `numPartitions` bundles of groups balanced by bytes."""
        by_group: dict[int, list[FilePart]] = {}
        for s in range(first, end):
            for gf in self.slice_meta(s).groups:
                by_group.setdefault(gf.group, []).append(FilePart(s, gf))
        groups = sorted(by_group)
        if not groups:
            return []
        bundles = min(self.opts.num_partitions or len(groups), len(groups))
        weights = np.array([sum(f.file_bytes for f in by_group[g]) for g in groups], np.int64)
        owner = keygroups.assign_threads(weights, bundles) if bundles < len(groups) else np.arange(len(groups))
        parts = []
        for b in range(bundles):
            mine = [f for i, g in enumerate(groups) if owner[i] == b for f in by_group[g]]
            mine.sort(key=lambda f: (f.slice, f.group))  # slice by slice: event time moves forward
            if mine:
                parts.append(GroupsPartition(tuple(mine)))
        return parts

    def read(self, partition: GroupsPartition) -> Iterator[pa.RecordBatch]:
        store = self.store
        with ThreadPoolExecutor(max_workers=2, thread_name_prefix="keyfill-spark-read") as io:
            # One file fetched ahead of the one being decoded: hides object-store latency.
            pending = [io.submit(store.read, f.key) for f in partition.files[:1]]
            for i, f in enumerate(partition.files):
                if i + 1 < len(partition.files):
                    pending.append(io.submit(store.read, partition.files[i + 1].key))
                data = pending.pop(0).result()
                # size, CRC-32C and record count checked before anything of the file is yielded
                batch = compacted.decode_group_file(data, f.file, f.slice, store.url_for(f.key))
                yield from to_spark_batches(batch, f.group, f.slice, self.opts.batch_rows)


def to_spark_batches(batch: pa.RecordBatch, group: int, s: int, rows: int) -> Iterator[pa.RecordBatch]:
    """An envelope batch as the source's schema, in pieces of at most `rows` records."""
    n = batch.num_rows
    columns = [
        batch.column("partition"),
        batch.column("offset"),
        batch.column("timestamp").cast(pa.timestamp("us", tz="UTC")),
        batch.column("key"),
        batch.column("value"),
        batch.column("headers").cast(ARROW_SCHEMA.field("headers").type),
        pa.array(np.full(n, group, np.int32)),
        pa.array(np.full(n, s, np.int32)),
    ]
    out = pa.RecordBatch.from_arrays(columns, schema=ARROW_SCHEMA)
    for start in range(0, n, rows):
        yield out.slice(start, rows)


class KeyfillBatchReader(DataSourceReader):
    """`spark.read.format("keyfill")`: the whole archive (from `startingSlice`) at once."""

    def __init__(self, opts: Options):
        self.planner = _Planner(opts)

    def partitions(self) -> list[InputPartition]:
        return list(self.planner.plan(self.planner.opts.starting_slice, len(self.planner.manifest.slices)))

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, GroupsPartition)
        return self.planner.read(partition)


class KeyfillStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """`spark.readStream.format("keyfill")`: whole slices per micro-batch.

    Admission control: `maxSlicesPerTrigger` becomes Spark's ReadMaxFiles (a slice counts
    as a file), else `maxBytesPerTrigger` becomes ReadMaxBytes; when both are set both
    apply. A batch always takes at least one slice with records, however large, and empty
    slices are free (they ride along). The archive never grows, so Trigger.AvailableNow's
    target is simply its last slice."""

    def __init__(self, opts: Options):
        self.planner = _Planner(opts)
        self.opts = opts

    def initialOffset(self) -> dict:
        return self.planner.offset(self.opts.starting_slice)

    def getDefaultReadLimit(self) -> ReadLimit:
        if self.opts.max_slices_per_trigger:
            return ReadMaxFiles(self.opts.max_slices_per_trigger)
        if self.opts.max_bytes_per_trigger:
            return ReadMaxBytes(self.opts.max_bytes_per_trigger)
        return ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        self.planner.load()  # the target is the end of this immutable archive: load it now

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        slices = self.planner.manifest.slices
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
        end, taken, nbytes, rows = first, 0, 0, 0
        while end < len(slices):
            summary = slices[end]
            if summary.records:
                over = (
                    (max_slices is not None and taken + 1 > max_slices)
                    or (max_bytes is not None and nbytes + summary.file_bytes > max_bytes)
                    or (max_rows is not None and rows + summary.records > max_rows)
                )
                if over and taken:
                    break
                taken, nbytes, rows = taken + 1, nbytes + summary.file_bytes, rows + summary.records
            end += 1
        return self.planner.offset(end)

    def reportLatestOffset(self) -> dict:
        return self.planner.offset(len(self.planner.manifest.slices))

    def partitions(self, start: dict, end: dict) -> list[InputPartition]:
        return list(self.planner.plan(self.planner.position(start), self.planner.position(end)))

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, GroupsPartition)
        return self.planner.read(partition)

    def commit(self, end: dict) -> None:
        """Nothing to release: offsets are positions in an immutable archive (and Spark may
        skip this call for the last batch of an AvailableNow run)."""

    def stop(self) -> None:
        pass

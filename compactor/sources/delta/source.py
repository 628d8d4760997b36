"""Kafka topics kept as Delta Lake tables (`--format delta`, docs/delta-source.md): a bronze
table in the columns Spark's Kafka source gives (`key`, `value`, `topic`, `partition`,
`offset`, `timestamp`, `timestampType`, `headers`) or another writer's (`table_layouts`),
read without a JVM with delta-rs (the `deltalake` package).

The table version is pinned when the source is opened, so both compaction passes read the
same data files. As in an Iceberg table, one partition's rows may lie in any data file in
any order, so a chunk is an offset range of one partition (compactor.sources.offset_ranges),
planned from the `add` actions' column statistics (no I/O), or, for a file written without
them, from reading its two columns once at listing time. Data files are read through
keyfill's storage layer, with the credentials it already resolves; delta-rs reads the log.
"""

from __future__ import annotations

import re
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from compactor.errors import ArchiveError
from compactor.sources.base import SourceArchive, SourceChunk, SourceOptions, option
from compactor.sources.delta.table import delta_location, open_table
from compactor.sources.offset_ranges import Bounds, Extent, Planned, cut_chunks, in_range, offset_order
from compactor.sources.table_columns import envelope_batch, without_views
from compactor.sources.table_layouts import COLUMNS_HELP, column, resolve, top_columns, value_columns
from keygroups.envelope import CorruptFile, empty_batch
from keygroups.storage import open_storage

if TYPE_CHECKING:  # deltalake is imported where a table is opened
    from deltalake import DeltaTable

__all__ = ["DeltaSource", "DeltaOptions"]

DEFAULT_CHUNK_RECORDS = 1_000_000  # as the Iceberg source: one task's memory, not a task per tiny chunk
READ_AHEAD_FILES = 4  # data files a chunk read holds at once
LOG_FILE = re.compile(r"(?:^|/)_delta_log/\d{20}\.json$")  # a commit of a table's log, in a listing


@dataclass(frozen=True)
class DeltaOptions(SourceOptions):
    """Which version of the table to read (Delta's time travel), and where it keeps each Kafka field."""

    table_version: int | None = option("read the table as of this version (default: the latest)", metavar="N")
    columns: str | None = option(COLUMNS_HELP, metavar="PRESET|FIELD=COLUMN,...")

    def continued(self, recorded: Any) -> DeltaOptions:
        """An append reads the table as it is now, not at the version the archive was built
        from, in the columns the archive was read in (a key taken from another column stays
        the key)."""
        return replace(self, columns=recorded["columns"]) if "columns" in recorded else self


class DeltaSource(SourceArchive):
    """A Kafka topic kept as a Delta table, read as envelope records. See
    docs/delta-source.md for the layouts and what is refused.

    Picklable: it carries the pinned version and, once listed, the chunk plan (data files by
    path); the delta-rs table is opened on the driver only."""

    contiguous = False  # offsets skip where Kafka's do (transaction markers, compaction)
    storage_url = False  # a table folder, opened with delta-rs
    format = "delta"
    Options = DeltaOptions
    layouts = (LOG_FILE,)

    def __init__(self, url: str, *, threads: int = 16, table_version: int | None = None, columns: str | None = None):
        self.given = url
        self.location = delta_location(url)
        table = open_table(self.location, table_version)
        self.version = table.version()
        self.threads = threads
        self.chunk_records = DEFAULT_CHUNK_RECORDS
        self.store = open_storage(self.location, threads=threads)
        self._check(table, columns)
        self._actions = self._add_actions(table)
        self._files: list[str] = []  # data files, relative to the table; extents name them by index
        self._constants: list[dict[str, Any]] = []  # per file, the needed columns that are partition values
        self._plan: dict[str, Planned] | None = None
        self._bounds: dict[int, Bounds] = {}
        self._sizes: list[int] = []

    def __repr__(self) -> str:
        return f"DeltaSource({self.given!r}, version {self.version})"

    def _check(self, table: DeltaTable, columns: str | None) -> None:
        """The layout of the table's columns (`--columns`, or the writer's found from them);
        what this source cannot read faithfully is refused naming the table."""
        where = f"{self.location} (version {self.version})"
        meta = table.metadata()
        mapping = meta.configuration.get("delta.columnMapping.mode", "none")
        if mapping != "none":
            raise ArchiveError(f"{where}: column mapping mode {mapping!r} is not read; keyfill reads physical names")
        self.schema = pa.schema(table.schema().to_arrow())
        self.partition_columns = list(meta.partition_columns)
        self.layout = resolve(columns, self.schema, where)
        self.columns = top_columns(self.layout, self.schema.names)
        self.value_columns = value_columns(self.layout, self.schema.names) if self.layout.value is None else []

    def _add_actions(self, table: DeltaTable) -> pa.Table:
        """The version's data files with what listing needs of their statistics; the topic
        from the topic column's bounds."""
        if pa.table(table.deletion_vectors()).num_rows:
            raise ArchiveError(
                f"{self.location} (version {self.version}): has deletion vectors; keyfill reads tables without them"
            )
        actions = pa.table(table.get_add_actions(flatten=True))
        self.topic = self.location.rstrip("/").rsplit("/", 1)[-1]
        self._topic_of(actions)
        wanted = [
            "path",
            "size_bytes",
            "num_records",
            *(f"{m}.{c}" for m in ("min", "max") for c in (self.layout.partition, self.layout.offset)),
        ]
        wanted += [f"partition.{c}" for c in self.partition_columns if c in self.columns]
        return actions.select([c for c in wanted if c in actions.column_names])

    # -- listing

    def list_chunks(self) -> list[SourceChunk]:
        """Each partition's offsets cut into ranges of about `chunk_records` rows, each
        covering whole groups of data files whose offset bounds overlap."""
        actions = self._actions
        self._files = [unquote(p) for p in actions.column("path").to_pylist()]
        self._sizes = actions.column("size_bytes").to_pylist()
        self._constants = [
            {c: actions.column(f"partition.{c}")[i].as_py() for c in self.partition_columns if c in self.columns}
            for i in range(actions.num_rows)
        ]
        extents: list[Extent] = []
        missing: list[int] = []
        part, off = self.layout.partition, self.layout.offset
        stats = (f"min.{part}", f"max.{part}", f"min.{off}", f"max.{off}")
        columns = {
            c: actions.column(c).to_pylist() if c in actions.column_names else [None] * actions.num_rows for c in stats
        }
        records, sizes = actions.column("num_records").to_pylist(), self._sizes
        for i in range(actions.num_rows):
            # a partition column's value is the file's constant, not a statistic
            stat: list[Any] = [self._constants[i].get(part, columns[c][i]) for c in stats[:2]]
            stat += [columns[c][i] for c in stats[2:]]
            if records[i] == 0:
                continue
            if records[i] is None or any(v is None for v in stat):
                missing.append(i)
                continue
            plo, phi, olo, ohi = (int(v) for v in stat)
            n = phi - plo + 1
            extents += [Extent(p, olo, ohi, records[i] / n, sizes[i] / n, i) for p in range(plo, phi + 1)]
        if missing:
            with ThreadPoolExecutor(max(1, min(self.threads, len(missing)))) as pool:
                for found in pool.map(self._measure, missing):
                    extents += found
        self._bounds, self._plan, chunks = cut_chunks(extents, self.chunk_records, self.topic)
        return chunks

    def _topic_of(self, actions: pa.Table) -> None:
        """The topic column's one value, from the files' statistics: a table of several topics
        is refused, since their partitions would share numbers."""
        topic = self.layout.topic
        if topic is None or f"min.{topic}" not in actions.column_names:
            return
        topics = set(actions.column(f"min.{topic}").drop_null().to_pylist()) | set(
            actions.column(f"max.{topic}").drop_null().to_pylist()
        )
        if len(topics) > 1:
            raise ArchiveError(
                f"{self.location} (version {self.version}): holds several topics ({', '.join(sorted(topics)[:5])}); "
                "keyfill compacts one topic into an archive"
            )
        if topics:
            self.topic = topics.pop()

    def _measure(self, index: int) -> list[Extent]:
        """A data file without statistics: its partitions and offset ranges from its two columns."""
        layout = self.layout
        t = self._read_file(index, sorted({p.split(".")[0] for p in (layout.partition, layout.offset)}))
        part, off = column(t, layout.partition), column(t, layout.offset)
        if part.null_count or off.null_count:
            raise CorruptFile(f"{self.store.url_for(self._files[index])}: rows without a partition or an offset")
        g = pa.table({"p": part, "o": off}).group_by("p").aggregate([("o", "min"), ("o", "max"), ("o", "count")])
        size = self._sizes[index]
        total = max(t.num_rows, 1)
        return [
            Extent(int(p), int(lo), int(hi), int(n), size * n / total, index)
            for p, lo, hi, n in zip(*(g.column(c).to_pylist() for c in ("p", "o_min", "o_max", "o_count")))
        ]

    # -- reading

    def _read_file(self, index: int, columns: list[str] | None = None) -> pa.Table:
        path = self._files[index]
        wanted = columns or self.columns
        constants = self._constants[index]
        try:
            table = pq.read_table(
                pa.BufferReader(self.store.read(path)), columns=[c for c in wanted if c not in constants]
            )
        except (OSError, ValueError) as exc:  # missing object, not Parquet, a column the file lacks
            raise ArchiveError(f"{self.store.url_for(path)}: cannot read the data file: {exc}") from None
        table = without_views(table)
        for c in wanted:
            if c in constants:
                table = table.append_column(
                    c, pa.array([constants[c]] * table.num_rows).cast(self.schema.field(c).type)
                )
        return table.select(wanted)

    def read(self, chunk: SourceChunk) -> pa.RecordBatch:
        if self._plan is None:
            self.list_chunks()
        assert self._plan is not None
        try:
            p, lo, hi, files = self._plan[chunk.key]
        except KeyError:
            raise ArchiveError(f"{self.store.url_for(chunk.key)}: no such chunk in version {self.version}") from None
        parts: list[pa.Table] = []
        origin: list[np.ndarray] = []
        window = max(1, min(self.threads, READ_AHEAD_FILES))
        with ThreadPoolExecutor(window) as pool:
            for at in range(0, len(files), window):
                some = files[at : at + window]
                for index, table in zip(some, pool.map(self._read_file, some)):
                    if table.num_rows:
                        part, off = column(table, self.layout.partition), column(table, self.layout.offset)
                        mask = in_range(
                            self.store.url_for(self._files[index]), part, off, self._bounds[index], p, lo, hi
                        )
                        table = table.filter(mask)
                    parts.append(table)
                    origin.append(np.full(table.num_rows, index, np.int64))
        table = pa.concat_tables(parts, promote_options="permissive") if parts else None
        if table is None or table.num_rows == 0:
            return empty_batch()
        offsets = column(table, self.layout.offset).to_numpy()
        order = offset_order(offsets, np.concatenate(origin), lambda i: self.store.url_for(self._files[i]), p, lo, hi)
        where = ", ".join(self.store.url_for(self._files[i]) for i in files)
        return envelope_batch(table.take(pa.array(order)), self.layout, self.value_columns, p, where)

"""Kafka topics materialised as Iceberg tables (`--format iceberg`, docs/iceberg-source.md),
in the columns each writer gives them (Redpanda's `redpanda` struct, Tableflow's system
columns, the Iceberg Kafka Connect sink's metadata struct, ...: `table_layouts`), read with
pyiceberg.

The table is named by its metadata file, its folder (`metadata/version-hint.text`), an SQL
catalog URL with the table identifier as fragment (`sqlite:////path/catalog.db#ns.topic`), or
a catalog pyiceberg is configured with (`catalog://NAME#ns.topic`: REST, Glue, Hive, ...).
The current snapshot is pinned when the source is opened, so both compaction passes read the
same data files.

Rows of a partition may lie in any data file in any order, so a chunk is not a file: it is
an offset range of one partition, read from every data file whose (partition, offset)
bounds overlap it, filtered to the range and sorted by offset. The bounds come from the
manifests' column bounds (no I/O) or, for files without them (pyiceberg's own writer keeps
none for nested columns), from the Parquet footers' row-group statistics, or, without those,
from reading those files' two columns once at listing time.
"""

from __future__ import annotations

import re
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from compactor.errors import ArchiveError
from compactor.sources.base import SourceArchive, SourceChunk, SourceOptions, option
from compactor.sources.iceberg.columns import parquet_paths, slim
from compactor.sources.iceberg.ranges import DataFileBounds, int_bound
from compactor.sources.iceberg.table import io_properties, named_catalog_table, sql_catalog_table, static_table
from compactor.sources.offset_ranges import Bounds, Extent, Planned, cut_chunks, in_range, offset_order
from compactor.sources.table_columns import envelope_batch
from compactor.sources.table_layouts import COLUMNS_HELP, column, resolve, top_columns, value_columns
from keygroups.envelope import CorruptFile, empty_batch
from keygroups.storage import open_storage

if TYPE_CHECKING:  # pyiceberg is imported where a table is opened
    from pyiceberg.io import FileIO
    from pyiceberg.schema import Schema
    from pyiceberg.table import FileScanTask, Table

__all__ = ["IcebergSource", "IcebergOptions", "DEFAULT_CHUNK_RECORDS"]

# About this many rows per chunk (estimated from the manifests): a chunk is read into one
# task's memory, and many tiny chunks cost a task each.
DEFAULT_CHUNK_RECORDS = 1_000_000

METADATA_FILE = re.compile(r"(?:^|/)metadata/[^/]*\.metadata\.json$")  # a table's metadata file, in a listing
SQL_SCHEMES = ("sqlite",)  # SQLAlchemy URLs of catalogs pyiceberg's SqlCatalog reads (the driver keyfill installs)
READ_AHEAD_FILES = 4  # data files a chunk read fetches at once (each held whole until filtered)


@dataclass(frozen=True)
class IcebergOptions(SourceOptions):
    """Where the table keeps each Kafka field."""

    columns: str | None = option(COLUMNS_HELP, metavar="PRESET|FIELD=COLUMN,...")


class IcebergSource(SourceArchive):
    """A Kafka topic materialised as an Iceberg table, read as envelope records. See
    docs/iceberg-source.md for the layouts and what is refused.

    Picklable: it carries the pinned table metadata and, once listed, the chunk plan (data
    files by reference); the FileIO is rebuilt in each process."""

    contiguous = False  # offsets skip where Kafka's do (transaction markers, aborted data, compaction)
    storage_url = False  # a metadata file, a table folder or a catalog URL: opened with pyiceberg
    format = "iceberg"
    Options = IcebergOptions
    layouts = (METADATA_FILE,)

    def __init__(self, url: str, *, threads: int = 16, chunk_records: int | None = None, columns: str | None = None):
        scheme = url.partition("://")[0].lower() if "://" in url else ""
        if scheme == "catalog":
            table = named_catalog_table(url)
        elif scheme.split("+")[0] in SQL_SCHEMES:
            table = sql_catalog_table(url)
        else:
            table = static_table(url)
        self.given = url
        self.metadata = table.metadata
        self.metadata_location = table.metadata_location
        self.snapshot_id = self.metadata.current_snapshot_id
        self.threads = threads
        self.chunk_records = chunk_records or DEFAULT_CHUNK_RECORDS
        # Redpanda names the table after the topic; a table folder is named after the table.
        self.topic = table.name()[-1] if "#" in url else self.metadata.location.rstrip("/").rsplit("/", 1)[-1]
        self.store = open_storage(self.metadata.location, threads=threads)
        self._check_schema(columns)
        self._io: FileIO | None = None
        self._tasks: list[FileScanTask] = []  # the data files, once listed; extents name them by index
        self._plan: dict[str, Planned] | None = None  # None until listed
        self._bounds: dict[int, Bounds] = {}  # file -> partitions and offsets its rows may hold

    def __getstate__(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if k != "_io"} | {"_io": None}

    def __repr__(self) -> str:
        return f"IcebergSource({self.given!r}, snapshot {self.snapshot_id})"

    # -- the table

    @property
    def io(self) -> FileIO:
        if self._io is None:
            from compactor.sources.iceberg.file_io import StoreFileIO

            self._io = StoreFileIO({**self.metadata.properties, **io_properties()})
        return self._io

    def _check_schema(self, columns: str | None) -> None:
        """The layout of the table's columns (`--columns`, or the writer's found from them);
        a table that does not fit it is refused naming the metadata file and the column."""
        arrow = self.metadata.schema().as_arrow()
        self.layout = resolve(columns, arrow, self.metadata_location)
        self.value_columns = value_columns(self.layout, arrow.names) if self.layout.value is None else []
        self._read_ids = {self.metadata.schema().find_field(c).field_id for c in top_columns(self.layout, arrow.names)}

    def _table(self) -> Table:
        from pyiceberg.catalog.noop import NoopCatalog
        from pyiceberg.table import Table

        return Table(
            identifier=("keyfill", self.topic),
            metadata=self.metadata,
            metadata_location=self.metadata_location,
            io=self.io,
            catalog=NoopCatalog("keyfill"),
        )

    # -- listing

    def list_chunks(self) -> list[SourceChunk]:
        """Each partition's offsets cut into ranges of about `chunk_records` rows, each
        range covering whole groups of data files whose offset bounds overlap (a range is
        split further when overlapping files hold more than that)."""
        if self.snapshot_id is None:
            self._tasks, self._plan, self._bounds = [], {}, {}
            return []
        tasks = list(self._table().scan(snapshot_id=self.snapshot_id).plan_files())
        for t in tasks:
            if t.delete_files:
                raise ArchiveError(
                    f"{t.file.file_path}: has row-level deletes ({len(t.delete_files)} delete file(s)); "
                    "keyfill reads append-only tables such as Redpanda's"
                )
        self._tasks = tasks
        extents = self._extents(tasks)
        self._tasks = [slim(t) for t in tasks]  # what a read needs: the source travels to every task
        self._bounds, self._plan, chunks = cut_chunks(extents, self.chunk_records, self.topic)
        return chunks

    def _field_ids(self) -> tuple[int, int]:
        schema = self.metadata.schema()
        return schema.find_field(self.layout.partition).field_id, schema.find_field(self.layout.offset).field_id

    def _extents(self, tasks: list[FileScanTask]) -> list[Extent]:
        schema = self.metadata.schema()
        pid, oid = self._field_ids()
        ptype, otype = schema.find_type(pid), schema.find_type(oid)
        bounds: list[DataFileBounds | None] = []
        for i, t in enumerate(tasks):
            f = t.file
            lo, hi = f.lower_bounds or {}, f.upper_bounds or {}
            if all(k in lo and k in hi for k in (pid, oid)):
                bounds.append(
                    DataFileBounds(
                        i,
                        int_bound(ptype, lo[pid]),
                        int_bound(ptype, hi[pid]),
                        int_bound(otype, lo[oid]),
                        int_bound(otype, hi[oid]),
                        f.record_count,
                        f.file_size_in_bytes,
                    )
                )
            else:
                bounds.append(None)
        extents: list[Extent] = []
        for b in bounds:
            if b is None or b.records == 0:
                continue
            n = b.phi - b.plo + 1
            extents += [Extent(p, b.olo, b.ohi, b.records / n, b.size / n, b.index) for p in range(b.plo, b.phi + 1)]
        missing = [i for i, b in enumerate(bounds) if b is None and tasks[i].file.record_count]
        if missing:
            with ThreadPoolExecutor(max(1, min(self.threads, len(missing)))) as pool:
                for found in pool.map(self._measure, missing):
                    extents += found
        return extents

    def _measure(self, index: int) -> list[Extent]:
        """A data file without manifest bounds: its row groups' Parquet statistics (a footer
        read), else its two columns read (a file written without statistics)."""
        return self._footer_extents(index) or self._column_extents(index)

    def _footer_extents(self, index: int) -> list[Extent] | None:
        """One extent per row group and partition, from the Parquet footer's min/max of the
        partition and offset columns (found by field id, else by name)."""
        import pyarrow.parquet as pq
        from pyiceberg.manifest import FileFormat

        f = self._tasks[index].file
        if f.file_format != FileFormat.PARQUET:
            return None
        try:
            with self.io.new_input(f.file_path).open() as stream:
                meta = pq.ParquetFile(stream).metadata
        except (OSError, ValueError) as exc:  # missing file, not Parquet
            raise ArchiveError(f"{f.file_path}: cannot read the data file's Parquet footer: {exc}") from None
        paths = parquet_paths(meta.schema.to_arrow_schema(), self.metadata.schema(), self.layout)
        extents: list[Extent] = []
        for g in range(meta.num_row_groups):
            group = meta.row_group(g)
            found: dict[str, tuple[int, int]] = {}
            for c in range(group.num_columns):
                col = group.column(c)
                if col.path_in_schema in paths and col.statistics is not None and col.statistics.has_min_max:
                    found[paths[col.path_in_schema]] = (int(col.statistics.min), int(col.statistics.max))
            if len(found) < 2:
                return None
            (plo, phi), (olo, ohi) = found["partition"], found["offset"]
            n = phi - plo + 1
            size = f.file_size_in_bytes * group.num_rows / max(meta.num_rows, 1)
            extents += [Extent(p, olo, ohi, group.num_rows / n, size / n, index) for p in range(plo, phi + 1)]
        return extents

    def _column_extents(self, index: int) -> list[Extent]:
        """A data file's partitions and offset ranges, from reading only those two columns."""
        from pyiceberg.schema import prune_columns

        f = self._tasks[index].file
        schema = prune_columns(self.metadata.schema(), set(self._field_ids()), select_full_types=False)
        read = self._read_file(index, schema)
        part, off = column(read, self.layout.partition), column(read, self.layout.offset)
        self._no_nulls(f.file_path, part, off)
        t = pa.table({"p": part, "o": off}).group_by("p").aggregate([("o", "min"), ("o", "max"), ("o", "count")])
        records = max(t.num_rows and int(pc.sum(t.column("o_count")).as_py()), 1)
        return [
            Extent(int(p), int(lo), int(hi), int(n), f.file_size_in_bytes * n / records, index)
            for p, lo, hi, n in zip(*(t.column(c).to_pylist() for c in ("p", "o_min", "o_max", "o_count")))
        ]

    # -- reading

    def _read_file(self, index: int, schema: Schema | None = None) -> pa.Table:
        """The data file's rows, in the columns a read needs (or `schema`'s)."""
        from pyiceberg.expressions import AlwaysTrue
        from pyiceberg.io.pyarrow import ArrowScan
        from pyiceberg.schema import prune_columns

        task = self._tasks[index]
        if schema is None:
            schema = prune_columns(self.metadata.schema(), self._read_ids, select_full_types=True)
        scan = ArrowScan(self.metadata, self.io, schema, AlwaysTrue())
        try:
            return scan.to_table([task])
        except (OSError, ValueError) as exc:  # missing or unreadable data file, a schema the file does not fit
            raise ArchiveError(f"{task.file.file_path}: cannot read the data file: {exc}") from None

    def _no_nulls(self, name: str, part: pa.Array, off: pa.Array) -> None:
        if part.null_count or off.null_count:
            raise CorruptFile(
                f"{name}: {part.null_count + off.null_count} rows without "
                f"{self.layout.partition} or {self.layout.offset}"
            )

    def read(self, chunk: SourceChunk) -> pa.RecordBatch:
        if self._plan is None:
            self.list_chunks()
        assert self._plan is not None  # list_chunks plans every chunk
        try:
            p, lo, hi, files = self._plan[chunk.key]
        except KeyError:
            raise ArchiveError(
                f"{self.store.url_for(chunk.key)}: no such chunk in snapshot {self.snapshot_id}"
            ) from None
        parts: list[pa.Table] = []
        origin: list[np.ndarray] = []  # per row of parts, the index of its data file
        window = max(1, min(self.threads, READ_AHEAD_FILES))  # whole files in memory at once, at most
        with ThreadPoolExecutor(window) as pool:
            for at in range(0, len(files), window):
                some = files[at : at + window]
                for index, table in zip(some, pool.map(self._read_file, some)):
                    rows = self._rows_of(index, table, p, lo, hi)
                    parts.append(rows)
                    origin.append(np.full(rows.num_rows, index, np.int64))
        table = pa.concat_tables(parts, promote_options="permissive") if parts else None
        if table is None or table.num_rows == 0:
            return empty_batch()
        offsets = column(table, self.layout.offset).to_numpy()
        name_of = lambda i: self._tasks[i].file.file_path  # noqa: E731
        order = offset_order(offsets, np.concatenate(origin), name_of, p, lo, hi)
        return envelope_batch(table.take(pa.array(order)), self.layout, self.value_columns, p, self._names(files))

    def _rows_of(self, index: int, table: pa.Table, p: int, lo: int, hi: int) -> pa.Table:
        """The file's rows of partition p in lo..hi, after checking every row lies inside the
        bounds the listing planned with (else a row could be missed by every chunk)."""
        name = self._tasks[index].file.file_path
        if not table.num_rows:
            return table
        part, off = column(table, self.layout.partition), column(table, self.layout.offset)
        mask = in_range(name, part, off, self._bounds[index], p, lo, hi)
        return table.filter(mask)

    def _names(self, files: tuple[int, ...]) -> str:
        return ", ".join(self._tasks[i].file.file_path for i in files)

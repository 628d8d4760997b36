"""The piece index of the compacted archive (docs/compacted-archive.md, "The index").

A group's records of one slice (a *piece*) are consecutive whole Avro blocks inside a segment
file that holds many consecutive slices of that group. Readers find pieces here, in
two kinds of index file (named by `keygroups.layout.index_key`): "slices", one row per
slice (bounds, records, bytes, per-partition offset ranges), and "pieces", one row per piece
(file, byte range, records, timestamps, CRC-32C).

Each pair covers `SLICES_PER_FILE` consecutive slices, so a file's name follows from a slice
number and the run that wrote it; the manifest lists only where the writing run changes
(`index_runs`: an append rewrites the last file and adds new ones), so it stays a few KB
however long the archive. Inside a file, row groups hold `SLICES_PER_ROW_GROUP` slices, so planning a
micro-batch or resuming reads the row groups of the slices it needs, not the archive's
whole index (at 10^6 slices x 1,024 groups the index has up to 10^9 piece rows).

Parquet because pyarrow writes and reads it fast, column-compressed (file names repeat, so
dictionary encoding makes them nearly free), and any engine can query it.
"""

from __future__ import annotations

import io
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, overload

import google_crc32c
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from keygroups.errors import FormatError, IntegrityError, KeyfillError
from keygroups.layout import INDEX_KINDS, index_key
from keygroups.manifest import Manifest, index_run
from keygroups.pieces import PartitionRange, Piece, SliceMeta
from keygroups.storage import ObjectNotFound, Storage

SLICES_PER_FILE = 4096
SLICES_PER_ROW_GROUP = 64


@overload
def row_group_of(s: int) -> int: ...
@overload
def row_group_of(s: np.ndarray) -> np.ndarray: ...
def row_group_of(s: int | np.ndarray) -> int | np.ndarray:
    """The index row group that holds slice s (or each of an array of slices), counted from
    the archive's first slice: readers load, cache and cut the index by it."""
    return s // SLICES_PER_ROW_GROUP


def row_group_start(rg: int) -> int:
    """The first slice of index row group rg."""
    return rg * SLICES_PER_ROW_GROUP


PARTITION_RANGE = pa.struct(
    [
        ("partition", pa.int32()),
        ("first_offset", pa.int64()),
        ("last_offset", pa.int64()),
        ("records", pa.int64()),
        ("min_timestamp", pa.int64()),
        ("max_timestamp", pa.int64()),
    ]
)
SLICE_SCHEMA = pa.schema(
    [
        pa.field("slice", pa.int64(), nullable=False),
        pa.field("start_ms", pa.int64(), nullable=False),  # inclusive
        pa.field("end_ms", pa.int64(), nullable=False),  # exclusive
        pa.field("records", pa.int64(), nullable=False),
        pa.field("bytes", pa.int64(), nullable=False),  # of its pieces
        pa.field("partitions", pa.list_(PARTITION_RANGE), nullable=False),
    ]
)
PIECE_SCHEMA = pa.schema(
    [
        pa.field("slice", pa.int64(), nullable=False),
        pa.field("group", pa.int32(), nullable=False),
        pa.field("file", pa.string(), nullable=False),  # key of the segment file, relative to the root
        pa.field("offset", pa.int64(), nullable=False),  # first byte of the piece's blocks in the file
        pa.field("length", pa.int64(), nullable=False),
        pa.field("records", pa.int64(), nullable=False),
        pa.field("min_timestamp", pa.int64(), nullable=False),
        pa.field("max_timestamp", pa.int64(), nullable=False),
        pa.field("crc32c", pa.uint32(), nullable=False),  # of bytes [offset, offset + length)
        pa.field("file_header", pa.int32(), nullable=False),  # bytes of the file's Avro header
        pa.field("file_bytes", pa.int64(), nullable=False),  # size of the whole file
    ]
)


def piece_table(pieces: list[Piece]) -> pa.Table:
    columns = [[getattr(p, f.name) for p in pieces] for f in PIECE_SCHEMA]
    return pa.Table.from_arrays(columns, schema=PIECE_SCHEMA)


def slice_table(metas: list[SliceMeta]) -> pa.Table:
    rows = [
        {
            "slice": m.slice,
            "start_ms": m.start_ms,
            "end_ms": m.end_ms,
            "records": m.records,
            "bytes": m.bytes,
            "partitions": [r.__dict__ for r in m.partitions],
        }
        for m in metas
    ]
    return pa.Table.from_pylist(rows, schema=SLICE_SCHEMA)


def _columns(table: pa.Table) -> list[list[Any]]:
    """A table's columns as Python lists: column by column, several times faster than
    row dicts (`to_pylist`), which made loading a short-slice index cost more than reading it."""
    return [
        col.to_pylist() if pa.types.is_string(col.type) or pa.types.is_list(col.type) else col.to_numpy().tolist()
        for col in table.columns
    ]


def slice_metas(slices: pa.Table, pieces: pa.Table) -> list[SliceMeta]:
    """Index rows as readers use them: one SliceMeta per slice row, with its pieces."""
    number, start, end, records, size, partitions = _columns(slices.select([f.name for f in SLICE_SCHEMA]))
    metas = [
        SliceMeta(
            slice=s,
            start_ms=a,
            end_ms=b,
            records=n,
            bytes=z,
            partitions=[PartitionRange(**r) for r in ranges],
        )
        for s, a, b, n, z, ranges in zip(number, start, end, records, size, partitions)
    ]
    at = {m.slice: m for m in metas}
    for p in piece_list(pieces):
        meta = at.get(p.slice)
        if meta is None:
            raise FormatError(f"index: a piece of slice {p.slice}, which the slice index does not list")
        meta.pieces.append(p)
    return metas


def piece_list(pieces: pa.Table) -> list[Piece]:
    """PIECE_SCHEMA rows as Pieces, in table order."""
    return list(map(Piece._make, zip(*_columns(pieces.select([f.name for f in PIECE_SCHEMA])))))


def file_start(s: int) -> int:
    """The first slice of the index file that covers slice s."""
    return s - s % SLICES_PER_FILE


def _sort_by(table: pa.Table, keys: list[str]) -> pa.Table:
    return table.sort_by([(k, "ascending") for k in keys])


def _write(store: Storage, key: str, table: pa.Table) -> dict[str, int]:
    """One Parquet file whose row groups each hold SLICES_PER_ROW_GROUP slices, with page
    checksums; returns its check (`footer_check`)."""
    sink = pa.BufferOutputStream()
    with pq.ParquetWriter(
        sink, table.schema, compression="zstd", write_statistics=["slice"], write_page_checksum=True
    ) as writer:
        bucket = row_group_of(table.column("slice").to_numpy())
        bounds = (np.flatnonzero(np.diff(bucket)) + 1).tolist() + [table.num_rows] if table.num_rows else []
        start = 0
        for end in bounds:
            writer.write_table(table.slice(start, end - start), row_group_size=end - start)
            start = end
        if not table.num_rows:
            writer.write_table(table)
    data = sink.getvalue().to_pybytes()
    store.write(key, data)
    return footer_check(data)


def _footer_length(tail: bytes) -> int:
    """Bytes of a Parquet file's footer region (Thrift metadata, its length, the magic) from
    the file's last bytes; 0 if they do not end like a Parquet file."""
    if len(tail) < 8 or tail[-4:] != _MAGIC:
        return 0
    return int.from_bytes(tail[-8:-4], "little") + 8


def footer_check(data: bytes) -> dict[str, int]:
    """What the manifest keeps of an index file: its size and the CRC-32C of its footer. Page
    checksums (Parquet's own) cover the rows; the footer holds the row groups' places and
    slice statistics, whose damage would otherwise pass unseen (a row group skipped)."""
    n = _footer_length(data)
    return {"bytes": len(data), "footer_crc32c": google_crc32c.value(data[len(data) - n :])}


_MAGIC = b"PAR1"
_TAIL_BYTES = 64 << 10  # one GET fetches the footer of any index file up to this size of footer


def write_index(store: Storage, slices: pa.Table, pieces: pa.Table, run: str) -> dict[str, dict[str, int]]:
    """Write the index files for these slices and pieces, named by `run` (slice numbers must
    cover whole index files except the last); returns each written file's key and check
    (`footer_check`), which the manifest keeps (`index_files`)."""
    slices = _sort_by(slices.cast(SLICE_SCHEMA), ["slice"])
    pieces = _sort_by(pieces.cast(PIECE_SCHEMA), ["slice", "group"])
    if not slices.num_rows:
        return {}
    written: dict[str, dict[str, int]] = {}
    first = file_start(int(pc.min(slices.column("slice")).as_py()))
    last = int(pc.max(slices.column("slice")).as_py())
    for start in range(first, last + 1, SLICES_PER_FILE):
        end = start + SLICES_PER_FILE
        for kind, table in zip(INDEX_KINDS, (slices, pieces)):
            s = table.column("slice")
            part = table.filter(pc.and_(pc.greater_equal(s, start), pc.less(s, end)))
            written[index_key(kind, start, run)] = _write(store, index_key(kind, start, run), part)
    return written


def _concat(tables: list[pa.Table], empty: pa.Table) -> pa.Table:
    """The row groups read, as one table of `empty`'s schema (a replay's read is one table
    per index file, and concatenating it with the empty table cost a fifth of the read)."""
    if len(tables) == 1 and tables[0].schema == empty.schema:
        return tables[0]
    return pa.concat_tables([*tables, empty])


class _RangedObject(io.RawIOBase):
    """An object read through ranged GETs as pyarrow asks for bytes: the Parquet footer,
    then only the row groups wanted. Written by hand because it must go through keyfill's
    storage layer (its S3 limits, errors and credentials); pyarrow's own S3 filesystem and
    fsspec would each bring a second configuration of the same bucket."""

    def __init__(self, store: Storage, key: str, length: int | None = None) -> None:
        self.store, self.key = store, key
        self.length = store.size(key) if length is None else length
        self.pos = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self.pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self.pos, io.SEEK_END: self.length}[whence]
        self.pos = base + offset
        return self.pos

    def readinto(self, buffer: Any) -> int:  # a writable buffer (memoryview, bytearray), as io.RawIOBase passes it
        n = max(0, min(len(buffer), self.length - self.pos))
        data = self.store.read_range(self.key, self.pos, n) if n else b""
        buffer[: len(data)] = data
        self.pos += len(data)
        return len(data)


@dataclass
class PieceIndex:
    """Reads the index of an archive of `slices` slices, only the row groups asked for,
    keeping the files it opened (the index of a committed version never changes). `runs`: the
    manifest's `index_runs`. Safe to share between threads, and threads read row groups at once: each
    read opens its own view of the file (a ParquetFile and the object under it keep a
    position) with the footer read once, so a replay loading several row groups of the index
    from S3 waits for one GET's latency, not one per row group."""

    store: Storage
    slices: int
    runs: list[list[Any]]
    # the manifest's `index_files` (None: an archive written before them)
    checks: dict[str, dict[str, Any]] | None = None

    def __post_init__(self) -> None:
        self._files: dict[str, tuple[int, pq.FileMetaData]] = {}  # key -> (size, footer)
        self._lock = threading.Lock()

    @classmethod
    def of(cls, store: Storage, manifest: Manifest) -> PieceIndex:
        """The index of the version `manifest` describes."""
        return cls(store, manifest.slices, manifest.index_runs, manifest.index_files or None)

    def _key(self, kind: str, start: int) -> str:
        return index_key(kind, start, index_run(self.runs, start))

    def _file(self, kind: str, start: int) -> tuple[str, int, pq.FileMetaData]:
        """The index file's key, size and footer (read on first use)."""
        key = self._key(kind, start)
        with self._lock:
            known = self._files.get(key)
        if known is None:
            try:
                source = _RangedObject(self.store, key)
            except ObjectNotFound:
                raise FormatError(f"{self.store.url_for(key)}: index file missing") from None
            check = (self.checks or {}).get(key)
            meta = self._checked_footer(key, source.length, check) if check is not None else None
            known = (source.length, self._open(key, source, meta).metadata)
            with self._lock:
                known = self._files.setdefault(key, known)
        return key, *known

    def _checked_footer(self, key: str, size: int, check: dict[str, Any]) -> pq.FileMetaData:
        """The file's footer, read in one GET and checked against the manifest before pyarrow
        trusts it: damage is named as the index file's, not blamed on a segment it misplaces."""
        url = self.store.url_for(key)
        if size != check["bytes"]:
            raise IntegrityError(f"{url}: index file of {size} bytes, the manifest records {check['bytes']}")
        tail = self.store.read_range(key, max(0, size - _TAIL_BYTES), min(size, _TAIL_BYTES))
        n = _footer_length(tail)
        if n > len(tail) and n <= size:
            tail = self.store.read_range(key, size - n, n)
        if not 8 < n <= len(tail) or google_crc32c.value(tail[len(tail) - n :]) != check["footer_crc32c"]:
            raise IntegrityError(f"{url}: index file footer damaged (CRC-32C differs from the manifest)")
        try:
            return pq.read_metadata(pa.BufferReader(_MAGIC + tail[len(tail) - n :]))
        except (pa.ArrowInvalid, OSError) as exc:
            raise IntegrityError(f"{url}: unreadable index file footer ({exc})") from None

    def _open(self, key: str, source: _RangedObject, meta: pq.FileMetaData | None = None) -> pq.ParquetFile:
        try:
            # page checksums where the file has them (index files written since they carry them)
            return pq.ParquetFile(source, metadata=meta, page_checksum_verification=True)
        except (pa.ArrowInvalid, OSError) as exc:
            raise FormatError(f"{self.store.url_for(key)}: unreadable index file ({exc})") from None

    def _rows(self, kind: str, first: int, end: int, columns: list[str] | None = None) -> Iterator[pa.Table]:
        if not 0 <= first <= end <= self.slices:
            raise FormatError(f"{self.store.url}: slices {first}..{end} outside 0..{self.slices}")
        if first == end:
            return
        for start in range(file_start(first), end, SLICES_PER_FILE):
            key, size, meta = self._file(kind, start)
            wanted, whole = [], True
            for rg in range(meta.num_row_groups):
                stats = meta.row_group(rg).column(0).statistics
                known = stats is not None and stats.has_min_max
                if known and (stats.max < first or stats.min >= end):
                    continue  # the row group holds none of the slices asked for
                wanted.append(rg)
                whole = whole and known and first <= stats.min and stats.max < end
            if not wanted:
                continue
            # one read for all of them: on S3 adjacent row groups are one GET, and a read per
            # row group was mostly per-read overhead (docs/performance.md#index-row-groups-read-together)
            try:
                table = self._open(key, _RangedObject(self.store, key, size), meta).read_row_groups(
                    wanted, columns=columns
                )
            except (pa.ArrowInvalid, OSError) as exc:
                if isinstance(exc, KeyfillError):
                    raise  # the storage layer's own error, naming the object
                raise IntegrityError(f"{self.store.url_for(key)}: damaged index file ({exc})") from None
            if whole:
                yield table  # all of it (what a replay asks for): filtering cost as much as the read
                continue
            s = table.column("slice")
            yield table.filter(pc.and_(pc.greater_equal(s, first), pc.less(s, end)))

    def slice_rows(self, first: int, end: int, columns: list[str] | None = None) -> pa.Table:
        """Slices [first, end) as SLICE_SCHEMA rows (only `columns`, "slice" first, if given),
        in slice order."""
        empty = SLICE_SCHEMA.empty_table()
        return _concat([*self._rows("slices", first, end, columns)], empty.select(columns or empty.column_names))

    def piece_rows(self, first: int, end: int) -> pa.Table:
        """Pieces of slices [first, end) as PIECE_SCHEMA rows, by (slice, group)."""
        return _concat([*self._rows("pieces", first, end)], PIECE_SCHEMA.empty_table())

    def metas(self, first: int, end: int) -> list[SliceMeta]:
        """Slices [first, end) with their pieces; every slice must have its index row."""
        metas = slice_metas(self.slice_rows(first, end), self.piece_rows(first, end))
        self._all_listed([m.slice for m in metas], first, end)
        return metas

    def slice_starts(self, first: int, end: int) -> np.ndarray:
        """start_ms of slices [first, end), without the rest of their rows (a replay needs
        only these and the pieces); every slice must have its index row."""
        # not the per-partition lists: faster (docs/performance.md#index-row-groups-read-together)
        rows = self.slice_rows(first, end, ["slice", "start_ms"])
        self._all_listed(rows.column("slice").to_pylist(), first, end)
        starts: np.ndarray = rows.column("start_ms").to_numpy()
        return starts

    def _all_listed(self, slices: list[int], first: int, end: int) -> None:
        if slices != list(range(first, end)):
            raise FormatError(
                f"{self.store.url_for(self._key('slices', file_start(first)))}: slices {first}..{end - 1} "
                "are not all in the slice index"
            )

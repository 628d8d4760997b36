"""The compacted archive format, version 3: where files live and what the metadata says.

Written by the compactor, read by the reader, so it lives here, in the package both
depend on. The on-disk layout is documented in docs/compacted-archive.md:

    <root>/_versions/<version:020d>.json                  one per commit, created once: the
                                                          latest makes that version visible
    <root>/assignments/<run>.parquet                      key -> group (keygroups.assignment)
    <root>/index/<first slice:010d>-<run>.slices.parquet  per slice: bounds, partition ranges
    <root>/index/<first slice:010d>-<run>.pieces.parquet  per piece: file, byte range, checksum
    <root>/groups/<group:05d>/<first slice:010d>-<run>.avro
                                                          a segment: one group, consecutive slices

The storage unit (a segment file, tens of MiB) is decoupled from the sync unit (a slice):
a group's records of one slice, a *piece*, are a run of whole Avro blocks inside a segment,
decodable from its byte range plus the file's header (`keygroups.segments` writes them,
`keygroups.piece_index` finds them).

Every file a compaction writes carries its *run* id, so runs never write over each other's
files (two racing writers, or a failed run and its re-run); only a version object makes
them visible, and a version object is never replaced (`Storage.create`). A reader that
opened version n reads only files version n names, whatever is committed after.
"""

from __future__ import annotations

import hashlib
import json
import re
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any, NamedTuple

import google_crc32c
import numpy as np
import pyarrow as pa

from keygroups import envelope
from keygroups.crc32c_combine import combine as crc32c_combine
from keygroups.errors import FormatError, IntegrityError, KeyfillError, ObjectExists
from keygroups.storage import ObjectNotFound, Storage

if TYPE_CHECKING:
    from keygroups.piece_columns import PieceColumns

FORMAT = "keyfill.compacted"
FORMAT_VERSION = 3
VERSIONS = "_versions"
RUNS = "_runs"  # a running compaction's lease (compactor.lease): vacuum leaves its files alone
LEGACY_MANIFEST = "_manifest.json"  # format versions 1 and 2: one unversioned manifest
ASSIGNMENTS = "assignments"
INDEX = "index"
GROUPS = "groups"
# The largest ranged GET readers make by default: AWS's guidance for S3 throughput is 8-16 MB
# per request; shuffle through object storage pays off from 8 MiB (BlobShuffle). 16 MiB keeps
# a replay under 128 GETs per GB once the index's own reads are counted.
GET_BYTES = 16 << 20
# A streaming micro-batch without a limit set: whole slices up to this many compacted bytes
# (at least one slice), as Spark's Kafka source sizes batches by maxOffsetsPerTrigger. Without
# a default a long archive is one micro-batch holding every window at once; with a fixed slice
# count, a three-month archive of short slices was 33,000 micro-batches.
TRIGGER_BYTES = 512 << 20


def replay_gets(file_sizes: list[int], get_bytes: int = GET_BYTES) -> int:
    """GETs a replay makes to read files of these sizes once, each as consecutive ranges of
    at most `get_bytes` (its read-ahead budget permitting)."""
    return sum(-(-size // get_bytes) for size in file_sizes)


_RUN = "[0-9a-f]{16}"
# Every object this layout writes, and nothing else: what vacuum may delete.
_ARCHIVE_KEY = re.compile(
    rf"{VERSIONS}/[0-9]{{20}}\.json|{ASSIGNMENTS}/{_RUN}\.parquet|{RUNS}/{_RUN}(?:\.error)?\.json"
    rf"|{INDEX}/[0-9]{{10}}-{_RUN}\.(?:slices|pieces)\.parquet|{GROUPS}/[0-9]{{5,}}/[0-9]{{10}}-{_RUN}\.avro"
)
# The run id in the name of a run's file (assignment, index, segment, lease), and a segment's group.
_RUN_OF_KEY = re.compile(
    rf"(?:{ASSIGNMENTS}/|{RUNS}/|{INDEX}/[0-9]{{10}}-|{GROUPS}/(?P<group>[0-9]{{5,}})/[0-9]{{10}}-)"
    rf"(?P<run>{_RUN})\.(?:parquet|json|error\.json|slices\.parquet|pieces\.parquet|avro)"
)
# What archives of format versions 1 and 2 (unversioned) left: replaced by --overwrite.
_LEGACY_KEY = re.compile(
    rf"{re.escape(LEGACY_MANIFEST)}|assignment\.parquet|{INDEX}/[0-9]{{10}}\.(?:slices|pieces)\.parquet"
    rf"|{GROUPS}/[0-9]{{5,}}/[0-9]{{10}}\.avro|slices/[0-9]{{6,}}/(?:_slice\.json|group-[0-9]{{5,}}\.avro)"
)


def is_archive_key(key: str) -> bool:
    """Whether `key` (relative to the archive root) is one of the archive's own objects."""
    return _ARCHIVE_KEY.fullmatch(key) is not None


def is_legacy_key(key: str) -> bool:
    """Whether `key` is an object of an unversioned archive (format versions 1 and 2)."""
    return _LEGACY_KEY.fullmatch(key) is not None


def run_of(key: str) -> tuple[str, int | None] | None:
    """(run, group) of a file a run writes: its run id, and its group for a segment file
    (None for the others); None for version objects and names that are not the layout's."""
    m = _RUN_OF_KEY.fullmatch(key) if is_archive_key(key) else None
    if m is None:
        return None
    return m["run"], None if m["group"] is None else int(m["group"])


def lease_key(run: str) -> str:
    return f"{RUNS}/{run}.json"


def run_error_key(run: str) -> str:
    """Where a Spark task of the run reports a deterministic input error (compactor.task_errors)."""
    return f"{RUNS}/{run}.error.json"


def run_of_lease(key: str) -> str | None:
    found = run_of(key)
    return found[0] if found and key == lease_key(found[0]) else None


def new_run() -> str:
    """A compaction run's id: 16 hex digits, random, in every file name the run writes."""
    return uuid.uuid4().hex[:16]


def segment_key(group: int, first_slice: int, run: str) -> str:
    """A segment file, named by its group, first slice and run: listings sort by group,
    then slice."""
    return f"{GROUPS}/{group:05d}/{first_slice:010d}-{run}.avro"


def segment_first_slice(key: str) -> int:
    """The first slice of a segment file, from its name (`segment_key`)."""
    return int(key.rpartition("/")[2][:10])


def assignment_key(run: str) -> str:
    return f"{ASSIGNMENTS}/{run}.parquet"


def version_key(version: int) -> str:
    """Zero-padded: listings sort versions in order."""
    return f"{VERSIONS}/{version:020d}.json"


def dumps(obj: Any) -> bytes:
    """Stable JSON: sorted keys, fixed separators, so equal metadata is equal bytes."""
    return (json.dumps(obj, sort_keys=True, indent=1, separators=(",", ": ")) + "\n").encode()


@dataclass(frozen=True)
class PartitionRange:
    """A partition's records in one slice: a contiguous offset range (gaps only where the
    source had them)."""

    partition: int
    first_offset: int
    last_offset: int
    records: int
    min_timestamp: int
    max_timestamp: int


class Piece(NamedTuple):
    """One group's records of one slice: bytes [offset, offset + length) of a segment file,
    whole Avro blocks. A row of the piece index. A named tuple, not a dataclass: a reader
    builds one per piece of every index block it loads (12,852 for a 2M-record archive of
    10 s slices), and tuples of plain values leave the garbage collector's tracking, where
    dataclass instances made every collection walk them (a block's Pieces took 6x as long
    to build inside a replay as alone)."""

    slice: int
    group: int
    file: str  # the segment's key, relative to the archive root
    offset: int
    length: int
    records: int
    min_timestamp: int
    max_timestamp: int
    crc32c: int  # CRC-32C of the piece's bytes: checked by every reader before it emits
    file_header: int  # bytes of the segment's Avro header (the offset of its first piece)
    file_bytes: int  # size of the whole segment file

    @property
    def end(self) -> int:
        return self.offset + self.length

    def check(self, groups: int, url_for: Callable[[str], str]) -> None:
        """An index row that cannot be right is named before any GET is made (`groups`: the
        manifest's group count; a piece of another group would belong to no reader and be
        skipped without a word). `url_for` names the file, called only for a bad row: this
        runs for every piece a reader loads."""
        if not 0 <= self.group < groups:
            raise FormatError(
                f"{url_for(self.file)} (slice {self.slice}): group {self.group} is not one of the manifest's "
                f"{groups} groups"
            )
        if not (0 < self.file_header <= self.offset and self.length > 0 and self.end <= self.file_bytes):
            raise FormatError(
                f"{self.where(url_for(self.file))}: index row outside its file (header {self.file_header} bytes, "
                f"file {self.file_bytes} bytes)"
            )
        if self.records < 1:
            raise FormatError(f"{self.where(url_for(self.file))}: a piece of {self.records} records")

    def where(self, url: str) -> str:
        """How errors name a piece: its file, byte range, slice and group."""
        return f"{url} bytes {self.offset}..{self.end} (slice {self.slice}, group {self.group})"


def rows_fine(col: PieceColumns, groups: int) -> np.ndarray:
    """`Piece.check` column-wise, for a reader loading thousands of rows at once: which rows
    pass. Keep the two in step; `Piece.check` names what is wrong with a row that does not."""
    return (
        (col.group >= 0)
        & (col.group < groups)
        & (col.file_header > 0)
        & (col.file_header <= col.offset)
        & (col.length > 0)
        & (col.offset + col.length <= col.file_bytes)
        & (col.records >= 1)
    )


@dataclass
class SliceMeta:
    """One slice as readers need it: bounds, partition ranges, and its pieces by group."""

    slice: int
    start_ms: int  # inclusive; records' running-max timestamps fall in [start_ms, end_ms)
    end_ms: int
    records: int = 0
    bytes: int = 0  # of its pieces
    partitions: list[PartitionRange] = field(default_factory=list)
    pieces: list[Piece] = field(default_factory=list)  # non-empty groups only, by group id


def crc32c_value(data: bytes) -> int:
    return google_crc32c.value(data)


def crc32c(data: bytes) -> str:
    """The CRC-32C as messages spell it: 8 lowercase hex digits."""
    return f"{crc32c_value(data):08x}"


def read_piece(header: bytes, data: bytes, piece: Piece, url: str) -> pa.RecordBatch:
    """One piece's records from its file's header and its bytes: `read_run` of that piece."""
    return read_run(header, data, piece.offset, [piece], url)


def read_run(header: bytes, data: bytes, start: int, pieces: Sequence[Piece], url: str) -> pa.RecordBatch:
    """The records of consecutive pieces of one file, piece after piece, from the file's
    header and `data` (its bytes from offset `start` to the last piece's end), decoded in one
    pass: a short slice costs a CRC and a zero-copy slice, not a decode of its own.

    Every piece's length and CRC-32C are checked before anything is decoded, and the run's
    record count after: damage is named (file, byte range, slice, group), never delivered.

    CRC-32C, not SHA-256: SHA-256 took 7-17% of replay throughput at 4 threads on 2 cores
    (bench/bench_integrity.py), CRC-32C runs at 14+ GB/s in hardware. With length and record
    count also checked it catches corruption and misplaced bytes; it is not a defence
    against deliberate tampering."""
    if not len(pieces):
        return envelope.empty_batch()
    from keygroups.piece_columns import PieceColumns  # it builds on Piece: imported here, not above

    cols = PieceColumns.of(pieces)
    first, last = pieces[0], pieces[-1]
    body = data[first.offset - start : last.end - start]
    if not _whole(body, cols):
        for p in pieces:  # which piece: named
            chunk = data[p.offset - start : p.offset - start + p.length]
            if len(chunk) != p.length:
                raise IntegrityError(f"{p.where(url)}: {len(chunk)} bytes, the index records {p.length}")
            if google_crc32c.value(chunk) != p.crc32c:
                raise IntegrityError(f"{p.where(url)}: CRC-32C differs from the index (file corrupted or replaced)")
        raise FormatError(f"{first.where(url)}: a run's pieces are not back to back (up to slice {last.slice})")
    try:
        _, batch = envelope.decode_avro(body, name=url, verified=True, header=header)
    except envelope.CorruptFile as exc:
        raise IntegrityError(f"{first.where(url)}: {exc}") from None
    expected = int(cols.records.sum())
    if batch.num_rows != expected:
        where = (
            first.where(url)
            if first is last
            else f"{url} bytes {first.offset}..{last.end} (slices {first.slice}..{last.slice}, group {first.group})"
        )
        raise IntegrityError(f"{where}: {batch.num_rows} records, the index records {expected}")
    return batch


def _whole(body: bytes, pieces: PieceColumns) -> bool:
    """The pieces lie back to back and `body` is exactly their bytes, as the index says: one
    CRC-32C over all of it, against the pieces' CRCs combined (a call per piece cost more
    than the check with 10 s slices)."""
    offsets, lengths = pieces.offset, pieces.length
    if len(body) != lengths.sum() or (offsets[1:] != offsets[:-1] + lengths[:-1]).any():
        return False
    return google_crc32c.value(body) == crc32c_combine(pieces.crc32c, lengths)


def split_run(batch: pa.RecordBatch, pieces: Sequence[Piece]) -> list[pa.RecordBatch]:
    """A run's records (`read_run`) as one zero-copy batch per piece."""
    out, at = [], 0
    for p in pieces:
        out.append(batch.slice(at, p.records))
        at += p.records
    return out


@dataclass
class Manifest:
    """One version of the archive (`_versions/<n>.json`): a few KB whatever the archive's
    length (slices are in the index)."""

    source: dict  # url, format, options
    config: dict  # groups, slice_duration_ms, codec, block_bytes, target_file_bytes, null_keys, allow_gaps
    topic: str
    groups: int
    slice_duration_ms: int
    base: int  # absolute slice number of slice 0: slice s covers [(base+s)*d, (base+s+1)*d)
    slices: int
    group_records: list[int]
    group_payload_bytes: list[int]  # packing weights: the statistics pass's, an unsealed tail included
    group_file_bytes: list[int]  # bytes of each group's pieces
    totals: dict  # records, payload_bytes, file_bytes, files, pieces, keys, partitions, slices, end_ms
    handoff: dict[str, int]  # partition (as a JSON string key) -> first offset not in the archive
    # partition -> the largest timestamp below its hand-off: the running maximum an append continues from
    running_max: dict[str, int] = field(default_factory=dict)
    # partition -> {offset, timestamp, digest} of the last record archived: what an append
    # checks the source still holds (compactor.history)
    last_records: dict[str, dict] = field(default_factory=dict)
    # index file key -> {bytes, footer_crc32c} of every index file the version names (keygroups.piece_index)
    index_files: dict[str, dict] = field(default_factory=dict)
    # partition -> records of slices not sealed yet when this version was committed (left for
    # a later append; `keyfill report` draws them). Not part of the content id: it says what
    # the source holds beyond the archive, not what the archive holds.
    held_back: dict[str, int] = field(default_factory=dict)
    gaps: list[str] = field(default_factory=list)
    # The version: which archive it is, where its files are, how it came to be.
    archive: str = ""  # the archive's identity: kept by appends, new for each full compaction
    version: int = 0
    parent: int | None = None  # the version this commit followed (None: the first)
    kind: str = "compact"  # compact | append
    created_ms: int = 0
    run: str = ""  # the run that wrote this version's new files
    assignment: str = ""  # key of the key assignment
    index_runs: list[list] = field(default_factory=list)  # [first slice, run]: who wrote the index from there on
    runs: list[str] = field(default_factory=list)  # the runs whose segment files this version reads
    # segment files of those runs that this version stops reading (and no later one reads):
    # tails an append continued in a file of its own (keygroups.segments); vacuum deletes them
    # once no older version is retained. This version's only, so the manifest stays small.
    dropped: list[str] = field(default_factory=list)
    format: str = FORMAT
    format_version: int = FORMAT_VERSION

    def bounds(self, s: int) -> tuple[int, int]:
        d = self.slice_duration_ms
        return (self.base + s) * d, (self.base + s + 1) * d

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, d: dict, *, name: str = "manifest") -> Manifest:
        if d.get("format") != FORMAT:
            raise FormatError(f"{name}: not a keyfill compacted archive manifest")
        if d.get("format_version") != FORMAT_VERSION:
            raise FormatError(
                f"{name}: format version {d.get('format_version')}; this keyfill reads version {FORMAT_VERSION} "
                "(compact the source again, with --overwrite)"
            )
        m = cls(**d)
        numbers = [*m.group_records, *m.group_payload_bytes, *m.group_file_bytes, *m.handoff.values()]
        numbers += list(m.running_max.values()) + list(m.held_back.values())
        numbers += [m.groups, m.slice_duration_ms, m.base, m.slices, m.version, m.created_ms]
        numbers += [start for start, _ in m.index_runs]
        numbers += [f.get(k) for f in m.last_records.values() for k in ("offset", "timestamp")]
        lists = (m.group_records, m.group_payload_bytes, m.group_file_bytes)
        if not all(type(v) is int for v in numbers) or any(len(x) != m.groups for x in lists) or m.slices < 0:
            raise FormatError(
                f"{name}: a count, offset or time that is not a whole number, or group lists that do "
                "not match the group count"
            )
        if not m.archive or not m.assignment or (m.slices and not (m.index_runs and m.runs)):
            raise FormatError(f"{name}: no archive id, assignment, index or runs")
        return m


def index_run(index_runs: list[list], first_slice: int) -> str:
    """The run whose index files cover the slices from `first_slice` (an index file's first
    slice): the last entry of a manifest's `index_runs` starting at or before it."""
    run = ""
    for start, r in index_runs:
        if start > first_slice:
            break
        run = r
    return run


class CommitConflict(KeyfillError, RuntimeError):
    """Another compaction committed the version this one was about to."""


def content_id(manifest: Manifest) -> str:
    """16 hex digits of the SHA-256 of what the archive holds (source, configuration,
    slices, groups, totals, hand-off), not of where its files are: a full compaction's
    archive id. Equal input and configuration give equal ids, so a replay checkpoint or a
    Spark offset resumes against an identical recompaction and refuses any other."""
    content = {k: v for k, v in manifest.to_json().items() if k not in _VERSION_FIELDS}
    return hashlib.sha256(dumps(content)).hexdigest()[:16]


_VERSION_FIELDS = {
    *(
        "archive",
        "version",
        "parent",
        "kind",
        "created_ms",
        "run",
        "assignment",
        "index_runs",
        "runs",
        "index_files",
        "held_back",
    )
}


_VERSION_KEY = re.compile(rf"{VERSIONS}/([0-9]{{20}})\.json")


def version_numbers(keys) -> list[int]:
    """The version numbers among these keys (a listing's), ascending."""
    return sorted(int(m[1]) for m in map(_VERSION_KEY.fullmatch, keys) if m)


def versions(store: Storage) -> list[int]:
    """The committed version numbers, ascending."""
    return version_numbers(o.key for o in store.list(VERSIONS + "/"))


def load_manifest(store: Storage, version: int | None = None) -> Manifest:
    """The manifest of `version` (default: the latest), or FormatError: without a version
    there is no archive."""
    if version is None:
        committed = versions(store)
        if not committed:
            if store.exists(LEGACY_MANIFEST):
                return _legacy(store)
            raise FormatError(
                f"{store.url_for(VERSIONS)}/: no committed version; not a compacted archive, or a compaction "
                "that did not finish"
            )
        version = committed[-1]
    key = version_key(version)
    try:
        data = store.read(key)
    except ObjectNotFound:
        raise FormatError(f"{store.url_for(key)}: no version {version} in this archive") from None
    try:
        m = Manifest.from_json(json.loads(data), name=store.url_for(key))
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        if isinstance(exc, FormatError):
            raise
        raise FormatError(f"{store.url_for(key)}: unreadable manifest ({exc})") from None
    if m.version != version:
        raise FormatError(f"{store.url_for(key)}: says it is version {m.version}")
    return m


def _legacy(store: Storage) -> Manifest:
    """An unversioned archive: refused, naming its format version."""
    url = store.url_for(LEGACY_MANIFEST)
    try:
        found = json.loads(store.read(LEGACY_MANIFEST)).get("format_version")
    except (ValueError, AttributeError):
        found = "unknown"
    raise FormatError(
        f"{url}: format version {found}; this keyfill reads version {FORMAT_VERSION} "
        "(compact the source again, with --overwrite)"
    )


def commit(store: Storage, manifest: Manifest) -> None:
    """Publish `manifest` as its version, atomically and once: if another writer committed
    that version first, CommitConflict, and nothing of this run is visible."""
    manifest.created_ms = manifest.created_ms or int(time.time() * 1000)
    key = version_key(manifest.version)
    try:
        store.create(key, dumps(manifest.to_json()))
    except ObjectExists:
        raise CommitConflict(
            f"{store.url_for(key)}: another compaction committed version {manifest.version} while this one ran; "
            "nothing of this run is visible (its files are left for `keyfill vacuum`); run it again"
        ) from None

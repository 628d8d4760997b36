"""The compacted archive format, version 2: where files live and what the metadata says.

Written by the compactor, read by the reader, so it lives here, in the package both
depend on. The on-disk layout is documented in docs/compacted-archive.md:

    <root>/_manifest.json                                written last: makes the archive visible
    <root>/assignment.parquet                            key -> group (keygroups.assignment)
    <root>/index/<first slice:010d>.slices.parquet       per slice: bounds, partition ranges
    <root>/index/<first slice:010d>.pieces.parquet       per piece: file, byte range, checksum
    <root>/groups/<group:05d>/<first slice:010d>.avro    a segment: one group, consecutive slices

The storage unit (a segment file, tens of MiB) is decoupled from the sync unit (a slice):
a group's records of one slice, a *piece*, are a run of whole Avro blocks inside a segment,
decodable from its byte range plus the file's header (`keygroups.segments` writes them,
`keygroups.piece_index` finds them).
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import google_crc32c
import pyarrow as pa

from keygroups import envelope
from keygroups.errors import FormatError, IntegrityError
from keygroups.storage import ObjectNotFound, Storage

FORMAT = "keyfill.compacted"
FORMAT_VERSION = 2
MANIFEST = "_manifest.json"
ASSIGNMENT = "assignment.parquet"
INDEX = "index"
GROUPS = "groups"
# The largest ranged GET readers make by default: AWS's guidance for S3 throughput is 8-16 MB
# per request; shuffle through object storage pays off from 8 MiB (BlobShuffle). 16 MiB keeps
# a replay under 128 GETs per GB once the index's own reads are counted.
GET_BYTES = 16 << 20


def replay_gets(file_sizes: list[int], get_bytes: int = GET_BYTES) -> int:
    """GETs a replay makes to read files of these sizes once, each as consecutive ranges of
    at most `get_bytes` (its read-ahead budget permitting)."""
    return sum(-(-size // get_bytes) for size in file_sizes)


# Every object this layout writes, and nothing else: what --overwrite may delete.
_ARCHIVE_KEY = re.compile(
    rf"{re.escape(MANIFEST)}|{re.escape(ASSIGNMENT)}|{INDEX}/[0-9]{{10}}\.(?:slices|pieces)\.parquet"
    rf"|{GROUPS}/[0-9]{{5,}}/[0-9]{{10}}\.avro"
)
# What a version-1 archive (one file per slice and group) left: refused by name.
_V1_KEY = re.compile(r"slices/[0-9]{6,}/(?:_slice\.json|group-[0-9]{5,}\.avro)")


def is_archive_key(key: str) -> bool:
    """Whether `key` (relative to the archive root) is one of the archive's own objects
    (of this version or of version 1, which an --overwrite replaces)."""
    return _ARCHIVE_KEY.fullmatch(key) is not None or _V1_KEY.fullmatch(key) is not None


def segment_key(group: int, first_slice: int) -> str:
    """A segment file, named by its group and first slice: unique, and the same for the
    same input (invariant 6); listings sort by group, then slice."""
    return f"{GROUPS}/{group:05d}/{first_slice:010d}.avro"


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


@dataclass(slots=True, unsafe_hash=True)
class Piece:
    """One group's records of one slice: bytes [offset, offset + length) of a segment file,
    whole Avro blocks. A row of the piece index; never changed once read (not frozen only
    because a frozen dataclass takes 7x longer to build, and a reader builds one per piece
    of every index block it loads)."""

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


def read_run(header: bytes, data: bytes, start: int, pieces: list[Piece], url: str) -> pa.RecordBatch:
    """The records of consecutive pieces of one file, piece after piece, from the file's
    header and `data` (its bytes from offset `start` to the last piece's end), decoded in one
    pass: a short slice costs a CRC and a zero-copy slice, not a decode of its own.

    Every piece's length and CRC-32C are checked before anything is decoded, and the run's
    record count after: damage is named (file, byte range, slice, group), never delivered.

    CRC-32C, not SHA-256: SHA-256 took 7-17% of replay throughput at 4 threads on 2 cores
    (bench/bench_integrity.py), CRC-32C runs at 14+ GB/s in hardware. With length and record
    count also checked it catches corruption and misplaced bytes; it is not a defence
    against deliberate tampering."""
    if not pieces:
        return envelope.empty_batch()
    crc = google_crc32c.value  # bytes only (no memoryview): each piece is copied out, cheaply
    for p in pieces:
        chunk = data[p.offset - start : p.offset - start + p.length]
        if len(chunk) != p.length:
            raise IntegrityError(f"{p.where(url)}: {len(chunk)} bytes, the index records {p.length}")
        if crc(chunk) != p.crc32c:
            raise IntegrityError(f"{p.where(url)}: CRC-32C differs from the index (file corrupted or replaced)")
    first, last = pieces[0], pieces[-1]
    try:
        _, batch = envelope.decode_avro(header + data[first.offset - start : last.end - start], name=url, verified=True)
    except envelope.CorruptFile as exc:
        raise IntegrityError(f"{first.where(url)}: {exc}") from None
    expected = sum(p.records for p in pieces)
    if batch.num_rows != expected:
        where = (
            first.where(url)
            if first is last
            else f"{url} bytes {first.offset}..{last.end} (slices {first.slice}..{last.slice}, group {first.group})"
        )
        raise IntegrityError(f"{where}: {batch.num_rows} records, the index records {expected}")
    return batch


def split_run(batch: pa.RecordBatch, pieces: list[Piece]) -> list[pa.RecordBatch]:
    """A run's records (`read_run`) as one zero-copy batch per piece."""
    out, at = [], 0
    for p in pieces:
        out.append(batch.slice(at, p.records))
        at += p.records
    return out


@dataclass
class Manifest:
    """`_manifest.json`: a few KB whatever the archive's length (slices are in the index)."""

    source: dict  # url, format, options
    config: dict  # groups, slice_duration_ms, codec, block_bytes, target_file_bytes, null_keys, allow_gaps
    topic: str
    groups: int
    slice_duration_ms: int
    base: int  # absolute slice number of slice 0: slice s covers [(base+s)*d, (base+s+1)*d)
    slices: int
    group_records: list[int]
    group_payload_bytes: list[int]
    group_file_bytes: list[int]  # bytes of each group's pieces
    totals: dict  # records, payload_bytes, file_bytes, files, pieces, keys, partitions, slices, end_ms
    handoff: dict[str, int]  # partition (as a JSON string key) -> next offset after the archive
    gaps: list[str] = field(default_factory=list)
    format: str = FORMAT
    format_version: int = FORMAT_VERSION

    def bounds(self, s: int) -> tuple[int, int]:
        d = self.slice_duration_ms
        return (self.base + s) * d, (self.base + s + 1) * d

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, d: dict, *, name: str = MANIFEST) -> Manifest:
        if d.get("format") != FORMAT:
            raise FormatError(f"{name}: not a keyfill compacted archive manifest")
        if d.get("format_version") != FORMAT_VERSION:
            raise FormatError(
                f"{name}: format version {d.get('format_version')}; this keyfill reads version {FORMAT_VERSION} "
                "(compact the source again)"
            )
        m = cls(**d)
        numbers = [*m.group_records, *m.group_payload_bytes, *m.group_file_bytes, *m.handoff.values()]
        numbers += [m.groups, m.slice_duration_ms, m.base, m.slices]
        lists = (m.group_records, m.group_payload_bytes, m.group_file_bytes)
        if not all(type(v) is int for v in numbers) or any(len(x) != m.groups for x in lists) or m.slices < 0:
            raise FormatError(
                f"{name}: a count, offset or time that is not a whole number, or group lists that do "
                "not match the group count"
            )
        return m


def write_json(store: Storage, key: str, obj: Any) -> None:
    store.write(key, dumps(obj))


def fingerprint(manifest: Manifest) -> str:
    """Identifies one compacted archive: 16 hex digits of the SHA-256 of its manifest's
    canonical JSON. Equal input and configuration give equal fingerprints; a recompaction
    with other groups or slices gives another, so a replay checkpoint or a Spark offset can
    refuse to resume against the wrong archive."""
    return hashlib.sha256(dumps(manifest.to_json())).hexdigest()[:16]


def load_manifest(store: Storage) -> Manifest:
    """The manifest, or FormatError: without a manifest there is no archive."""
    try:
        data = store.read(MANIFEST)
    except ObjectNotFound:
        raise FormatError(
            f"{store.url_for(MANIFEST)}: no manifest; not a compacted archive, or a compaction that did not finish"
        ) from None
    try:
        return Manifest.from_json(json.loads(data), name=store.url_for(MANIFEST))
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        if isinstance(exc, FormatError):
            raise
        raise FormatError(f"{store.url_for(MANIFEST)}: unreadable manifest ({exc})") from None

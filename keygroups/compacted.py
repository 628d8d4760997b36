"""The compacted archive format: where files live and what the metadata says.

Written by the compactor, read by the reader, so it lives here, in the package both
depend on. The on-disk layout is documented in docs/compacted-archive.md:

    <root>/_manifest.json                         written last: makes the archive visible
    <root>/assignment.parquet                     key -> group (keygroups.assignment)
    <root>/slices/<slice:06d>/_slice.json         per-slice metadata
    <root>/slices/<slice:06d>/group-<g:05d>.avro  one group's records of one slice
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import asdict, dataclass, field
from typing import Any

import google_crc32c
import pyarrow as pa

from keygroups import envelope
from keygroups.errors import FormatError, IntegrityError
from keygroups.storage import ObjectNotFound, Storage

FORMAT = "keyfill.compacted"
GROUP_FILE_FORMAT = "keyfill.group-file/1"
FORMAT_VERSION = 1
MANIFEST = "_manifest.json"
ASSIGNMENT = "assignment.parquet"
SLICES = "slices"

# Every object this layout writes, and nothing else: what --overwrite may delete.
_ARCHIVE_KEY = re.compile(
    rf"^(?:{re.escape(MANIFEST)}|{re.escape(ASSIGNMENT)}|{SLICES}/[0-9]{{6,}}/(?:_slice\.json|group-[0-9]{{5,}}\.avro))"
)


def is_archive_key(key: str) -> bool:
    """Whether `key` (relative to the archive root) is one of the archive's own objects."""
    return _ARCHIVE_KEY.fullmatch(key) is not None


def slice_prefix(s: int) -> str:
    return f"{SLICES}/{s:06d}"


def slice_meta_key(s: int) -> str:
    return f"{slice_prefix(s)}/_slice.json"


def group_file_key(s: int, g: int) -> str:
    return f"{slice_prefix(s)}/group-{g:05d}.avro"


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


@dataclass(frozen=True)
class GroupFile:
    group: int
    key: str
    records: int
    file_bytes: int
    payload_bytes: int
    sha256: str  # checked by `keyfill verify`
    crc32c: str  # 8 hex digits (CRC-32C, Castagnoli): checked by every reader before it emits
    min_timestamp: int
    max_timestamp: int


def encode_group_file(batch: pa.RecordBatch, s: int, g: int, codec: str, block_bytes: int) -> tuple[str, bytes]:
    """(key, bytes) of group g's file for slice s: an envelope Avro file whose header names
    its slice and group, with a sync marker derived from its key, so equal input gives
    byte-identical files (invariant 6)."""
    key = group_file_key(s, g)
    meta = {
        "keyfill.format": GROUP_FILE_FORMAT,
        "keyfill.slice": str(s),
        "keyfill.group": str(g),
        "keyfill.records": str(batch.num_rows),
    }
    marker = hashlib.blake2b(key.encode(), digest_size=16).digest()
    return key, envelope.encode_avro(batch, codec=codec, metadata=meta, sync_marker=marker, block_bytes=block_bytes)


def crc32c_value(data: bytes) -> int:
    return google_crc32c.value(data)


def crc32c(data: bytes) -> str:
    """The CRC-32C as the metadata spells it: 8 lowercase hex digits."""
    return f"{crc32c_value(data):08x}"


def checked_records(
    data: bytes, *, header: bytes = b"", length: int, crc: str, records: int, where: str, recorded_in: str, name: str
) -> pa.RecordBatch:
    """Records of `data` (whole blocks; after `header` when it is not a whole file), once
    its length and CRC-32C match what `recorded_in` says; the record count after decoding.
    Raises IntegrityError naming `where`."""
    if len(data) != length:
        raise IntegrityError(f"{where}: {len(data)} bytes, {recorded_in} records {length}")
    if crc32c(data) != crc:
        raise IntegrityError(f"{where}: CRC-32C differs from {recorded_in} (file corrupted or replaced)")
    _, batch = envelope.decode_avro(header + data if header else data, name=name)
    if batch.num_rows != records:
        raise IntegrityError(f"{where}: {batch.num_rows} records, {recorded_in} records {records}")
    return batch


def decode_group_file(data: bytes, gf: GroupFile, s: int, name: str) -> pa.RecordBatch:
    """A group file's records, after proving its bytes are the ones the compactor wrote:
    size and CRC-32C before decoding, the record count after. Readers call this before
    emitting anything of the file, so damage is named instead of delivered.

    CRC-32C, not the SHA-256 that verify checks: SHA-256 took 7-17% of replay throughput at
    4 threads on 2 cores (bench/bench_integrity.py), CRC-32C runs at 14+ GB/s in hardware. With
    size and record count also checked, it catches corruption and misplaced files; it does
    not defend against deliberate tampering (that is what verify's SHA-256 is for)."""
    return checked_records(
        data,
        length=gf.file_bytes,
        crc=gf.crc32c,
        records=gf.records,
        where=f"{name} (slice {s}, group {gf.group})",
        recorded_in="the slice metadata",
        name=name,
    )


@dataclass
class SliceMeta:
    """`_slice.json`: everything about one slice."""

    slice: int
    start_ms: int  # inclusive; records' running-max timestamps fall in [start_ms, end_ms)
    end_ms: int
    partitions: list[PartitionRange] = field(default_factory=list)
    groups: list[GroupFile] = field(default_factory=list)  # non-empty groups only, by group id

    @property
    def records(self) -> int:
        return sum(g.records for g in self.groups)

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, d: dict) -> SliceMeta:
        return cls(
            slice=d["slice"],
            start_ms=d["start_ms"],
            end_ms=d["end_ms"],
            partitions=[PartitionRange(**p) for p in d["partitions"]],
            groups=[GroupFile(**g) for g in d["groups"]],
        )


@dataclass(frozen=True)
class SliceSummary:
    """A slice as the manifest lists it; details in its `_slice.json`."""

    slice: int
    start_ms: int
    end_ms: int
    records: int
    file_bytes: int
    files: int


@dataclass
class Manifest:
    source: dict  # url, format, options
    config: dict  # groups, slice_duration_ms, codec, block_bytes, null_keys, allow_gaps
    topic: str
    groups: int
    slice_duration_ms: int
    slices: list[SliceSummary]
    group_records: list[int]
    group_payload_bytes: list[int]
    totals: dict  # records, payload_bytes, file_bytes, files, keys, partitions
    handoff: dict[str, int]  # partition (as a JSON string key) -> next offset after the archive
    gaps: list[str] = field(default_factory=list)
    format: str = FORMAT
    format_version: int = FORMAT_VERSION

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, d: dict, *, name: str = MANIFEST) -> Manifest:
        if d.get("format") != FORMAT:
            raise FormatError(f"{name}: not a keyfill compacted archive manifest")
        if d.get("format_version") != FORMAT_VERSION:
            raise FormatError(
                f"{name}: format version {d.get('format_version')}; this keyfill reads version {FORMAT_VERSION}"
            )
        d = dict(d)
        d["slices"] = [SliceSummary(**s) for s in d["slices"]]
        m = cls(**d)
        numbers = [*m.group_records, *m.group_payload_bytes, *m.handoff.values(), m.groups, m.slice_duration_ms]
        numbers += [v for s in m.slices for v in (s.slice, s.start_ms, s.end_ms, s.records, s.file_bytes, s.files)]
        if not all(type(v) is int for v in numbers) or len(m.group_payload_bytes) != m.groups:
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


def load_slice(store: Storage, s: int) -> SliceMeta:
    key = slice_meta_key(s)
    try:
        return SliceMeta.from_json(json.loads(store.read(key)))
    except ObjectNotFound:
        raise FormatError(f"{store.url_for(key)}: slice metadata missing") from None
    except (ValueError, KeyError, TypeError) as exc:
        raise FormatError(
            f"{store.url_for(key)}: unreadable slice metadata ({exc}); an archive written by "
            "another keyfill version must be compacted again"
        ) from None


def slice_meta(store: Storage, summary: SliceSummary) -> SliceMeta:
    """A slice's metadata as readers need it: an empty slice has no groups and no
    partition ranges worth a GET, so it is built from its manifest entry."""
    if not summary.records:
        return SliceMeta(slice=summary.slice, start_ms=summary.start_ms, end_ms=summary.end_ms)
    return load_slice(store, summary.slice)

"""Pieces: one group's records of one slice, a byte range of a segment file, as the piece
index records it; and the CRC-32C every reader checks a piece's bytes against."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import NamedTuple

import google_crc32c

from keygroups.errors import FormatError


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
    builds one per piece of every index row group it loads (thousands with 10 s slices), and
    tuples of plain values leave the garbage collector's tracking, where dataclass instances
    made every collection walk them (docs/performance.md#index-rows-as-columns)."""

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
    value: int = google_crc32c.value(data)
    return value


def crc32c(data: bytes) -> str:
    """The CRC-32C as messages spell it: 8 lowercase hex digits."""
    return f"{crc32c_value(data):08x}"

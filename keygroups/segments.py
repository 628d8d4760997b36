"""Segment files of the compacted archive (docs/compacted-archive.md, "Segment files"): one Avro container per run of
consecutive slices of one group, each slice's records (a *piece*) whole blocks, one after another.

    <root>/groups/<group:05d>/<first slice:010d>-<run>.avro

A group's segments share one sync marker, derived from the group id, so a piece's blocks
do not depend on which file they land in and equal input gives equal bytes (invariant 6).
A file is closed once it reaches `target_bytes`, so every file but a group's last holds at
least the target: a group of B bytes has at most ceil(B / target) files, and no group is
left with several small ones.

An append continues a group's last file when it is smaller than the target (a *tail*): the
new file starts with the tail's bytes as they are (header, sync marker and blocks), so the
tail's pieces keep their byte ranges and checksums in it and only their file name changes.
Without it every append would leave each group one more small file.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from keygroups import envelope
from keygroups.envelope.framing import read_header
from keygroups.errors import FormatError, KeyfillError, OptionError
from keygroups.layout import segment_key
from keygroups.pieces import Piece, crc32c_value
from keygroups.storage import Storage

SEGMENT_FORMAT = "keyfill.segment/1"


def sync_marker(group: int) -> bytes:
    return hashlib.blake2b(f"keyfill group {group}".encode(), digest_size=16).digest()


@dataclass(frozen=True)
class Tail:
    """A group's last segment file, smaller than the target: what an append continues."""

    key: str
    first_slice: int
    file_bytes: int
    file_header: int


class SegmentWriter:
    """Writes one group's pieces, slice by slice, into segment files near `target_bytes`.
    Holds at most one file's bytes in memory (a continued tail's stay in the store)."""

    def __init__(
        self,
        store: Storage,
        group: int,
        run: str,
        *,
        codec: str,
        block_bytes: int,
        target_bytes: int,
        tail: Tail | None = None,
    ) -> None:
        if target_bytes < 1:
            raise OptionError(f"target_bytes={target_bytes}: must be at least 1")
        self.store, self.group, self.run = store, group, run
        self.codec, self.block_bytes, self.target_bytes = codec, block_bytes, target_bytes
        self.sync = sync_marker(group)
        self.pieces: list[Piece] = []  # of files already written
        self.files: list[str] = []
        self._open: list[Piece] = []  # of the file being filled
        self._parts: list[bytes] = []
        self._size = 0
        self._header = 0
        self._last_slice = -1
        self._taken = 0
        self.tail = tail  # continued by the first file this writer fills, if it fills one
        self._base: str | None = None  # the tail the open file continues

    def add(self, s: int, batch: pa.RecordBatch) -> None:
        """Append slice s's records of this group (slices strictly increasing); an empty
        batch writes nothing."""
        self.add_encoded(s, envelope.encode_records(batch), batch.column("timestamp").cast(pa.int64()).to_numpy())

    def add_encoded(self, s: int, records: pa.Array, ts: np.ndarray) -> None:
        """`add` for records already encoded (`envelope.encode_records`), with their
        timestamps (epoch ms)."""
        if s <= self._last_slice:
            raise OptionError(f"group {self.group}: slice {s} after slice {self._last_slice}; slices must increase")
        self._last_slice = s
        if len(records) == 0:
            return
        if not self._size and self.tail is not None:  # no file open yet
            self._continue(self.tail)
        if not self._size:
            header = envelope.avro_header(
                codec=self.codec,
                metadata={
                    "keyfill.format": SEGMENT_FORMAT,
                    "keyfill.group": str(self.group),
                    "keyfill.first_slice": str(s),
                },
                sync_marker=self.sync,
            )
            self._parts, self._size, self._header = [header], len(header), len(header)
            self._key = segment_key(self.group, s, self.run)
        blob = envelope.blocks_of(records, codec=self.codec, sync_marker=self.sync, block_bytes=self.block_bytes)
        self._open.append(
            Piece(
                slice=s,
                group=self.group,
                file=self._key,
                offset=self._size,
                length=len(blob),
                records=len(records),
                min_timestamp=int(np.min(ts)),
                max_timestamp=int(np.max(ts)),
                crc32c=crc32c_value(blob),
                file_header=self._header,
                file_bytes=0,  # known when the file is closed
            )
        )
        self._parts.append(blob)
        self._size += len(blob)
        if self._size >= self.target_bytes:
            self._flush()

    def _continue(self, tail: Tail) -> None:
        """Start the file with the tail's bytes (copied by the store when the file is
        written), after checking the tail is what the index says: a replaced or cut file
        would otherwise be carried into the new version."""
        name = self.store.url_for(tail.key)
        size = self.store.size(tail.key)
        if size != tail.file_bytes:
            raise FormatError(f"{name}: {size} bytes, the index says {tail.file_bytes}")
        try:
            meta, sync, end = read_header(self.store.read_range(tail.key, 0, tail.file_header), name)
        except KeyfillError as exc:
            raise FormatError(str(exc)) from None
        codec = meta.get("avro.codec", b"null").decode(errors="replace")
        if end != tail.file_header or sync != self.sync or codec != self.codec:
            raise FormatError(
                f"{name}: not a segment file of group {self.group} with codec {self.codec} "
                "(its header or sync marker differ)"
            )
        self._parts, self._size, self._header = [], size, tail.file_header
        self._key = segment_key(self.group, tail.first_slice, self.run)
        self._base = tail.key
        self.tail = None

    def _flush(self) -> None:
        if self._size:
            if self._base is not None:
                self.store.write_after(self._key, self._base, b"".join(self._parts))
                self._base = None
            else:
                self.store.write(self._key, b"".join(self._parts))
            self.files.append(self._key)
            self.pieces += [p._replace(file_bytes=self._size) for p in self._open]
            self._open, self._parts, self._size = [], [], 0

    def take(self) -> list[Piece]:
        """The pieces of files written since the last call: what a streaming caller can
        index now."""
        new = self.pieces[self._taken :]
        self._taken = len(self.pieces)
        return new

    def close(self) -> list[Piece]:
        """Write the last file; the pieces written, in slice order."""
        self._flush()
        return self.pieces

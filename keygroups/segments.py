"""Segment files of format v2 (DESIGN.md "Format v2"): one Avro container per run of
consecutive slices of one group, each slice's records (a *piece*) a run of whole blocks.

    <root>/groups/<group:05d>/<first slice:010d>-<run>.avro

A group's segments share one sync marker, derived from the group id, so a piece's blocks
do not depend on which file they land in and equal input gives equal bytes (invariant 6).
A file is closed once it reaches `target_bytes`, so every file but a group's last holds at
least the target: a group of B bytes has at most ceil(B / target) files, and no group is
left with several small ones.
"""

from __future__ import annotations

import dataclasses
import hashlib

import numpy as np
import pyarrow as pa

from keygroups import compacted, envelope
from keygroups.compacted import Piece, segment_key
from keygroups.errors import OptionError
from keygroups.storage import Storage

SEGMENT_FORMAT = "keyfill.segment/1"
DEFAULT_TARGET_BYTES = 64 << 20


def sync_marker(group: int) -> bytes:
    return hashlib.blake2b(f"keyfill group {group}".encode(), digest_size=16).digest()


class SegmentWriter:
    """Writes one group's pieces, slice by slice, into segment files near `target_bytes`.
    Holds at most one file's bytes in memory."""

    def __init__(
        self,
        store: Storage,
        group: int,
        run: str,
        *,
        codec: str = "snappy",
        block_bytes: int = envelope.DEFAULT_BLOCK_BYTES,
        target_bytes: int = DEFAULT_TARGET_BYTES,
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

    def add(self, s: int, batch: pa.RecordBatch) -> None:
        """Append slice s's records of this group (slices strictly increasing); an empty
        batch writes nothing."""
        if s <= self._last_slice:
            raise OptionError(f"group {self.group}: slice {s} after slice {self._last_slice}; slices must increase")
        self._last_slice = s
        if batch.num_rows == 0:
            return
        if not self._parts:
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
        blob = envelope.encode_blocks(batch, codec=self.codec, sync_marker=self.sync, block_bytes=self.block_bytes)
        ts = batch.column("timestamp").cast(pa.int64()).to_numpy()
        self._open.append(
            Piece(
                slice=s,
                group=self.group,
                file=self._key,
                offset=self._size,
                length=len(blob),
                records=batch.num_rows,
                min_timestamp=int(np.min(ts)),
                max_timestamp=int(np.max(ts)),
                crc32c=compacted.crc32c_value(blob),
                file_header=self._header,
                file_bytes=0,  # known when the file is closed
            )
        )
        self._parts.append(blob)
        self._size += len(blob)
        if self._size >= self.target_bytes:
            self._flush()

    def _flush(self) -> None:
        if self._parts:
            self.store.write(self._key, b"".join(self._parts))
            self.files.append(self._key)
            self.pieces += [dataclasses.replace(p, file_bytes=self._size) for p in self._open]
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

"""A piece too large to decode at once, decoded in steps of whole Avro blocks.

A hot key's piece of a long slice can be hundreds of MB compressed and several times that
decoded; decoding it whole would hold all of it whatever the reader's read-ahead. Its blocks
are walked first (`StepScan`, fed the piece's bytes in order, holding none of them): the walk
checks the piece against the index (length, CRC-32C, record count) before any record of it
is decoded, and cuts it into steps of about `step_bytes`, each with the CRC-32C of its bytes.
`decode_step` then decodes one step, from bytes held since the walk or fetched again (then
checked against the walk's CRC: the bytes decoded are the bytes checked).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import google_crc32c
import numpy as np
import pyarrow as pa

from keygroups import envelope
from keygroups.crc32c_combine import combine as crc32c_combine
from keygroups.errors import IntegrityError
from keygroups.pieces import Piece

HEAD_BYTES = 20  # an Avro block starts with two varints (record count, byte size): at most 10 bytes each
SYNC_BYTES = 16


@dataclass(frozen=True)
class PieceSteps:
    """A piece cut into steps: step k is its file's bytes [cuts[k], cuts[k + 1]), holding
    `records[k]` records, whose CRC-32C is `crc[k]`."""

    piece: Piece
    cuts: np.ndarray
    records: np.ndarray
    crc: np.ndarray

    def __len__(self) -> int:
        return len(self.records)

    def bounds(self, k: int) -> tuple[int, int]:
        return int(self.cuts[k]), int(self.cuts[k + 1])


@dataclass
class StepScan:
    """The walk over one piece's bytes, fed in order from its offset (`feed`); `steps()` once
    all are fed. Nothing it is fed is kept past the call but the few bytes of a block header
    cut between two feeds."""

    piece: Piece
    url: str
    step_bytes: int
    _at: int = 0  # file offset of the next byte to be fed
    _next: int = 0  # file offset where the next block starts
    _head: bytes = b""  # the bytes of that block's header fed so far, when a feed ended inside it
    _lost: bool = False  # a block header that cannot be one: the walk stopped (the checks name it)
    _step: int = 0  # file offset where the current step starts
    _step_records: int = 0
    _crc: int = 0  # CRC-32C of the current step's bytes fed so far
    _pending: list[tuple[int, int]] = field(default_factory=list)  # cuts found, not yet fed up to: (offset, records)
    _cuts: list[int] = field(default_factory=list)
    _records: list[int] = field(default_factory=list)
    _crcs: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._at = self._next = self._step = self.piece.offset
        self._cuts.append(self.piece.offset)

    def feed(self, chunk: bytes | np.ndarray) -> None:
        view = np.frombuffer(chunk, np.uint8) if isinstance(chunk, bytes) else chunk
        base, end = self._at, self._at + len(view)
        self._walk(view, base, end)
        lo = 0
        while self._pending and self._pending[0][0] <= end:
            cut, records = self._pending.pop(0)
            self._crc = google_crc32c.extend(self._crc, view[lo : cut - base])
            self._close(cut, records)
            lo = cut - base
        if lo < len(view):
            self._crc = google_crc32c.extend(self._crc, view[lo:])
        self._at = end

    def _walk(self, view: np.ndarray, base: int, end: int) -> None:
        """The headers of the blocks that start before `end`: where each ends, and the cuts."""
        piece_end = self.piece.end
        while not self._lost and self._next < min(end, piece_end):
            at = self._next - base  # < 0 only while a header cut by the last feed is completed
            head = self._head + view[max(0, at) : max(0, at) + HEAD_BYTES].tobytes()
            buf = np.frombuffer(head, np.uint8)
            count, pos = envelope.read_varint(buf, 0, len(buf))
            size, pos = envelope.read_varint(buf, pos, len(buf)) if pos >= 0 else (0, -1)
            if pos < 0:
                if end - self._next < HEAD_BYTES:  # the header goes on in the next feed
                    self._head = head
                    return
                self._lost = True  # a varint of more than 10 bytes
                return
            self._head = b""
            if count < 0 or size < 0:
                self._lost = True
                return
            block_end = self._next + pos + int(size) + SYNC_BYTES
            self._step_records += int(count)
            self._next = block_end
            if block_end - self._step >= self.step_bytes and block_end < piece_end:
                self._pending.append((block_end, self._step_records))
                self._step, self._step_records = block_end, 0

    def _close(self, cut: int, records: int) -> None:
        self._cuts.append(cut)
        self._records.append(records)
        self._crcs.append(self._crc)
        self._crc = 0

    def steps(self) -> PieceSteps:
        """The piece's steps, once its bytes are as the index says: its length, its CRC-32C
        and its record count (IntegrityError naming the piece otherwise)."""
        p, where = self.piece, self.piece.where(self.url)
        if self._at != p.end:
            raise IntegrityError(f"{where}: {self._at - p.offset} bytes, the index records {p.length}")
        lengths = np.diff(np.array([*self._cuts, p.end], np.int64))
        crcs = np.array([*self._crcs, self._crc], np.int64)
        if crc32c_combine(crcs, lengths) != p.crc32c:
            raise IntegrityError(f"{where}: CRC-32C differs from the index (file corrupted or replaced)")
        records = np.array([*self._records, self._step_records], np.int64)
        if self._lost or self._head or self._next != p.end or self._pending:
            raise IntegrityError(f"{where}: its bytes are not whole Avro blocks")
        if (n := int(records.sum())) != p.records:
            raise IntegrityError(f"{where}: its blocks hold {n} records, the index records {p.records}")
        return PieceSteps(p, np.array([*self._cuts, p.end], np.int64), records, crcs)


def decode_step(
    header: bytes, data: bytes | np.ndarray, steps: PieceSteps, k: int, url: str, *, fetched: bool, headers: bool = True
) -> pa.RecordBatch:
    """Step k's records from its bytes (`data`, exactly them). `fetched`: the bytes were
    fetched again after the walk, so they are checked against the walk's CRC-32C first."""
    a, b = steps.bounds(k)
    p = steps.piece
    if len(data) != b - a:
        raise IntegrityError(f"{p.where(url)}: bytes {a}..{b} came back as {len(data)} bytes")
    if fetched and google_crc32c.value(data) != int(steps.crc[k]):
        raise IntegrityError(f"{p.where(url)}: bytes {a}..{b} differ from what was checked (the object changed)")
    try:  # as bytes: a copy of one step, beside its decode (every codec's reader takes bytes)
        _, batch = envelope.decode_avro(bytes(data), name=url, verified=True, header=header, headers=headers)
    except envelope.CorruptFile as exc:
        raise IntegrityError(f"{p.where(url)}: bytes {a}..{b}: {exc}") from None
    if batch.num_rows != (n := int(steps.records[k])):
        raise IntegrityError(f"{p.where(url)}: bytes {a}..{b}: {batch.num_rows} records, its blocks say {n}")
    return batch

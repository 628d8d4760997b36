"""A span of pieces in flight (`reader.fetch`): the futures of its ranged GETs, joined once into
bytes, checked against the index and decoded in steps, each step's bytes asked of the read
budget (`reader.read_budget`) before it is decoded; its own bytes given back once its last
piece is decoded. A piece larger than a few steps is decoded a few of its blocks at a time
(`keygroups.piece_steps`), so no step holds more than about DECODE_BYTES of compressed bytes
decoded, whatever the piece's size; a piece too large to hold at all is a `StreamedPiece`."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from typing import NamedTuple

import numpy as np
import pyarrow as pa

from keygroups import compacted
from keygroups.compacted import Piece
from keygroups.errors import IntegrityError
from keygroups.piece_columns import FIELDS, PieceColumns
from keygroups.piece_steps import PieceSteps, StepScan, decode_step
from reader.coalesce import check_got, check_length
from reader.read_budget import ReadBudget

# A fetched span is decoded a step of about this many bytes at a time: the decoded records a
# group holds stay small whatever the span's length (a span is up to range_bytes, and decoded
# records are several times their compressed bytes). Smaller and larger steps replayed slower
# (a step has a cost of its own; large ones leave the cache): docs/performance.md#decode-step-size.
DECODE_BYTES = 1 << 20
# A piece larger than this is decoded in steps of its blocks (`keygroups.piece_steps`).
STEPPED_BYTES = 2 * DECODE_BYTES
_RECORDS = FIELDS.index("records")


class Decoded(NamedTuple):
    """One decoded step: its pieces (one piece's row with the step's record count when
    `partial`: the piece goes on in the next step), their records back to back, and the
    bytes charged to the budget for them."""

    pieces: PieceColumns
    batch: pa.RecordBatch
    held: int
    partial: bool


class FetchedSpan:
    """A span in flight: the futures of its parts (from byte `start`), joined once into bytes
    and decoded in steps of about DECODE_BYTES. Its compressed bytes are charged to the budget
    (`charge`) until its last piece is decoded or it is dropped."""

    fetched_again = False  # the bytes a step decodes are those the checks saw, held since

    def __init__(
        self, start: int, pieces: PieceColumns, futures: list[Future[bytes]], budget: ReadBudget, charge: int
    ) -> None:
        self.start, self.pieces, self.futures, self.budget = start, pieces, futures, budget
        self.last_slice = int(pieces.slice[-1])
        self._ends = np.cumsum(pieces.length)  # bytes of the span's pieces up to each one's end
        self.charge = charge  # the bytes GET for it (`reader.coalesce.span`)
        self._data: bytes | None = None
        self._decoded = 0  # pieces decoded so far
        self._steps: PieceSteps | None = None  # the steps of a large piece being decoded
        self._step = 0  # its steps decoded so far

    def data(self, url: str) -> bytes:
        if self._data is None:
            self._data = check_got(b"".join(f.result() for f in self.futures), self.start, self.pieces, url)
            self.futures = []
        return self._data

    def release(self) -> None:
        """The span's bytes are no longer held (decoded, or dropped): give them back."""
        self._data, self.futures, self._steps = None, [], None
        self.budget.give(self.charge)
        self.charge = 0

    @property
    def next_piece(self) -> Piece:
        """The first piece not yet decoded (the span is dropped once all are)."""
        return self.pieces[self._decoded]

    @property
    def next_slice(self) -> int:
        return int(self.pieces.slice[self._decoded])

    @property
    def done(self) -> bool:
        return self._decoded == len(self.pieces)

    def step(
        self,
        url_for: Callable[[str], str],
        header: Callable[[Piece, str], bytes],
        finish: Callable[[pa.RecordBatch, int], pa.RecordBatch],
        slice: int | None,
        before_wait: Callable[[], object] | None,
        most: int | None = None,
        headers: bool = True,
        step_bytes: int = DECODE_BYTES,
    ) -> Decoded:
        """The span's next pieces, about `step_bytes` of them (at least one, at most `most`),
        checked and decoded in one pass and `finish`ed once: their records back to back,
        piece after piece, and the bytes they hold, now charged to the budget; or the next
        step of a piece larger than STEPPED_BYTES (`partial` until its last). Waits for the
        budget first (`ReadBudget.take`: `slice` is the work's, None for a caller that
        consumes it itself); a step the budget lets through only because the consumer starves
        is one piece. `headers` False: the records without their `headers` column."""
        pieces, i = self.pieces, self._decoded
        url = url_for(pieces.file_of(i))
        if int(pieces.length[i]) > STEPPED_BYTES:
            return self._piece_step(url, header, finish, slice, before_wait, headers)
        done = int(self._ends[i - 1]) if i else 0
        j = max(i + 1, int(np.searchsorted(self._ends, done + step_bytes, side="right")))
        if most is not None:
            j = min(j, i + most)
        budget, one = self.budget, int(pieces.length[i])
        want = int(self._ends[j - 1]) - done
        full = budget.estimate(want)
        reserved = budget.take(full, budget.estimate(one), slice, before_wait)
        if reserved != full:
            j, want = i + 1, one
        data = self.data(url)
        step = pieces.rows(i, j)
        try:
            records = compacted.read_span(self._header(i, header, url), data, self.start, step, url, headers=headers)
            batch = finish(records, int(pieces.group[0]))
        except BaseException:
            budget.give(reserved)
            raise
        held = batch.nbytes
        budget.charge_decoded(reserved, want, held)
        self._decoded = j
        if j == len(pieces):
            self.release()
        return Decoded(step, batch, held, False)

    def _header(self, i: int, header: Callable[[Piece, str], bytes], url: str) -> bytes:
        if self.start == 0 and self._data is not None:  # the span begins with the file: its header rode along
            return self._data[: int(self.pieces.file_header[0])]
        return header(self.pieces[i], url)

    def _piece_step(
        self,
        url: str,
        header: Callable[[Piece, str], bytes],
        finish: Callable[[pa.RecordBatch, int], pa.RecordBatch],
        slice: int | None,
        before_wait: Callable[[], object] | None,
        headers: bool,
    ) -> Decoded:
        """The next step of the large piece the span is at: its blocks walked and checked
        whole first (`scan`), before any of its records is decoded."""
        i = self._decoded
        if self._steps is None:
            self._steps, self._step = self.scan(self.pieces[i], url), 0
        steps, k = self._steps, self._step
        a, b = steps.bounds(k)
        budget = self.budget
        reserved = budget.take(budget.estimate(b - a), budget.estimate(b - a), slice, before_wait)
        try:
            data = self.byte_range(a, b, url)
            head = self._header(i, header, url)
            records = decode_step(head, data, steps, k, url, fetched=self.fetched_again, headers=headers)
            batch = finish(records, int(self.pieces.group[0]))
        except BaseException:
            budget.give(reserved)
            raise
        held = batch.nbytes
        budget.charge_decoded(reserved, b - a, held)
        self._step = k + 1
        partial = self._step < len(steps)
        cols = PieceColumns(self.pieces.files, self.pieces.a[:, i : i + 1].copy())
        cols.a[_RECORDS, 0] = int(steps.records[k])
        if not partial:
            self._steps, self._decoded = None, i + 1
            if self._decoded == len(self.pieces):
                self.release()
        return Decoded(cols, batch, held, partial)

    def scan(self, p: Piece, url: str) -> PieceSteps:
        """Piece p's steps, from the span's bytes."""
        data = self.data(url)
        walk = StepScan(p, url, DECODE_BYTES)
        walk.feed(np.frombuffer(data, np.uint8)[p.offset - self.start : p.end - self.start])
        return walk.steps()

    def byte_range(self, a: int, b: int, url: str) -> bytes | np.ndarray:
        """The file's bytes [a, b), within the span."""
        return np.frombuffer(self.data(url), np.uint8)[a - self.start : b - self.start]


class StreamedPiece(FetchedSpan):
    """A piece too large to hold (a span of its own): read twice, in ranged GETs of `part`
    bytes, one GET ahead of the one being used. The first read walks and checks it whole
    (`keygroups.piece_steps.StepScan`), keeping none of it; the second decodes it a step at a
    time, each step's bytes checked against the first read's CRC-32C. Charged at two GETs'
    bytes throughout: what it holds of the piece at once.

    Read twice rather than once with per-step checksums in the index (a format change) or
    spilled to a local disk (a disk an executor may not have room on): a piece this large is
    read at the speed of its decode, several times slower than its bytes arrive."""

    fetched_again = True

    def __init__(
        self,
        pieces: PieceColumns,
        submit: Callable[[str, int, int], Future[bytes]],
        part: int,
        budget: ReadBudget,
        charge: int,
    ) -> None:
        p = pieces[0]
        self._submit, self._part, self._piece = submit, part, p
        # the first read asks one byte past a piece that ends its file, so a longer object shows
        self._first_end = p.end + (p.end == p.file_bytes)
        self._queue: deque[tuple[int, Future[bytes]]] = deque()
        self._queued = p.offset  # the next byte to ask for
        self._last = self._first_end
        super().__init__(p.offset, pieces, [], budget, charge)
        self._buf, self._buf_at = np.zeros(0, np.uint8), p.offset
        self._ask(2)

    def _ask(self, n: int) -> None:
        while len(self._queue) < n and self._queued < self._last:
            length = min(self._part, self._last - self._queued)
            self._queue.append((self._queued, self._submit(self._piece.file, self._queued, length)))
            self._queued += length

    def _next_part(self) -> tuple[int, bytes]:
        """The next GET's bytes, with one more asked for: what is held is the part in use and
        the one in flight, the two GETs the piece is charged for."""
        at, future = self._queue.popleft()
        self._ask(1)
        return at, future.result()

    def scan(self, p: Piece, url: str) -> PieceSteps:
        walk = StepScan(p, url, DECODE_BYTES)
        got = p.offset
        while self._queue:
            at, data = self._next_part()
            if at != got or not data:
                break
            walk.feed(data[: max(0, p.end - at)])
            got = at + len(data)
        check_length(got - p.offset, p.offset, self.pieces, url)
        steps = walk.steps()
        self._queued, self._last = p.offset, p.end  # the second read: the piece's bytes only
        self._ask(2)
        return steps

    def byte_range(self, a: int, b: int, url: str) -> bytes | np.ndarray:
        chunks = []
        while b > self._buf_at + len(self._buf):
            chunks.append(self._buf[max(0, a - self._buf_at) :])
            if not self._queue:
                ended = self._buf_at + len(self._buf)
                raise IntegrityError(f"{self._piece.where(url)}: the object ends at byte {ended}")
            at, data = self._next_part()
            self._buf, self._buf_at = np.frombuffer(data, np.uint8), at
        chunks.append(self._buf[max(0, a - self._buf_at) : b - self._buf_at])
        return chunks[0] if len(chunks) == 1 else np.concatenate(chunks)

    def release(self) -> None:
        for _, future in self._queue:
            future.cancel()
        self._queue.clear()
        self._buf = np.zeros(0, np.uint8)
        super().release()

"""A span of pieces in flight (`reader.fetch`): the futures of its ranged GETs, joined once into
bytes, checked against the index and decoded in steps, each step's bytes asked of the read
budget (`reader.read_budget`) before it is decoded; its own bytes given back once its last
piece is decoded."""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future

import numpy as np
import pyarrow as pa

from keygroups import compacted
from keygroups.compacted import Piece
from keygroups.piece_columns import PieceColumns
from reader.coalesce import checked
from reader.read_budget import ReadBudget

# A fetched span is decoded a step of about this many bytes at a time: the decoded records a
# group holds stay small whatever the span's length (a span is up to range_bytes, and decoded
# records are several times their compressed bytes). Smaller and larger steps replayed slower
# (a step has a cost of its own; large ones leave the cache): docs/performance.md#decode-step-size.
DECODE_BYTES = 1 << 20


class FetchedSpan:
    """A span in flight: the futures of its parts (from byte `start`), joined once into bytes
    and decoded in steps of about DECODE_BYTES. Its compressed bytes are charged to the budget
    (`charge`) until its last piece is decoded or it is dropped."""

    def __init__(
        self, start: int, pieces: PieceColumns, futures: list[Future[bytes]], budget: ReadBudget, charge: int
    ) -> None:
        self.start, self.pieces, self.futures, self.budget = start, pieces, futures, budget
        self.last_slice = int(pieces.slice[-1])
        self._ends = np.cumsum(pieces.length)  # bytes of the span's pieces up to each one's end
        self.charge = charge  # the bytes GET for it (`reader.coalesce.span`)
        self._data: bytes | None = None
        self._decoded = 0  # pieces decoded so far

    def data(self, url: str) -> bytes:
        if self._data is None:
            self._data = checked(b"".join(f.result() for f in self.futures), self.start, self.pieces, url)
            self.futures = []
        return self._data

    def release(self) -> None:
        """The span's bytes are no longer held (decoded, or dropped): give them back."""
        self._data, self.futures = None, []
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
    ) -> tuple[PieceColumns, pa.RecordBatch, int]:
        """The span's next pieces, about DECODE_BYTES of them (at least one, at most `most`),
        checked and decoded in one pass and `finish`ed once: their records back to back,
        piece after piece, and the bytes they hold, now charged to the budget. Waits for the
        budget first (`ReadBudget.take`: `slice` is the work's, None for a caller that
        consumes it itself); a step the budget lets through only because the consumer starves
        is one piece. `headers` False: the records without their `headers` column."""
        pieces, i = self.pieces, self._decoded
        url = url_for(pieces.file_of(i))
        done = int(self._ends[i - 1]) if i else 0
        j = max(i + 1, int(np.searchsorted(self._ends, done + DECODE_BYTES, side="right")))
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
        head = data[: int(pieces.file_header[0])] if self.start == 0 else header(pieces[i], url)
        try:
            records = compacted.read_span(head, data, self.start, step, url, headers=headers)
            batch = finish(records, int(pieces.group[0]))
        except BaseException:
            budget.give(reserved)
            raise
        held = batch.nbytes
        budget.decoded(reserved, want, held)
        self._decoded = j
        if j == len(pieces):
            self.release()
        return step, batch, held

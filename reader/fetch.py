"""The group reader, shared by the replay and the Spark source: each group's upcoming pieces
as few large ranged GETs (consecutive pieces of a segment file fetched together as a span,
`reader.coalesce`), within a read-ahead budget (`reader.memory`), on a pool of daemon
threads (`reader.fetch_pool`), every piece checked before its records are decoded."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future

import numpy as np
import pyarrow as pa

from keygroups import compacted
from keygroups.compacted import Piece
from keygroups.errors import FormatError, IntegrityError, KeyfillError
from keygroups.piece_columns import PieceColumns
from keygroups.piece_index import SLICES_PER_ROW_GROUP
from keygroups.storage import Storage
from reader.coalesce import checked, parts, span
from reader.fetch_pool import GET_THREADS, FetchPool

LOOKAHEAD_SLICES = 256  # how far a span may reach past the slice being read


def span_bytes(read_ahead_bytes: int, groups: int, get_bytes: int) -> int:
    """The largest span a reader fetches: each group holds the span it reads and the next one
    in flight, so 2 x groups spans share the budget, and no span exceeds `get_bytes` (unless
    one piece does: a piece is never split between spans)."""
    share = read_ahead_bytes // max(1, 2 * groups)
    return max(1, min(get_bytes or share, share)) if read_ahead_bytes else 1


# A fetched span is decoded a step of about this many bytes at a time: the decoded records a
# group holds stay small whatever the span's length (a span is up to range_bytes, and decoded
# records are several times their compressed bytes). Measured at 10 s slices: 256 KiB, 512 KiB,
# 2 MiB and 4 MiB steps all replayed slower (a step costs ~0.1 ms of its own; large ones
# leave the cache).
DECODE_BYTES = 1 << 20


class _Fetched:
    """A span in flight: the futures of its parts (from byte `start`), joined once into bytes
    and decoded in steps of about DECODE_BYTES."""

    def __init__(self, start: int, pieces: PieceColumns, futures: list[Future]) -> None:
        self.start, self.pieces, self.futures = start, pieces, futures
        self.last_slice = int(pieces.slice[-1])
        self._ends = np.cumsum(pieces.length)  # bytes of the span's pieces up to each one's end
        self._data: bytes | None = None
        self._records: dict[int, pa.RecordBatch] = {}  # decoded and not yet read, by slice
        self._decoded = 0  # pieces decoded so far

    def data(self, url: str) -> bytes:
        if self._data is None:
            self._data = checked(b"".join(f.result() for f in self.futures), self.start, self.pieces, url)
            self.futures = []
        return self._data

    @property
    def next_piece(self) -> Piece:
        """The first piece not yet decoded (the span is dropped once all are)."""
        return self.pieces[self._decoded]

    @property
    def next_slice(self) -> int:
        return int(self.pieces.slice[self._decoded])

    def index_of(self, s: int) -> int | None:
        """Where the span's piece of slice s is, if it has one."""
        i = int(np.searchsorted(self.pieces.slice, s))
        return i if i < len(self.pieces) and self.pieces.slice[i] == s else None

    @property
    def done(self) -> bool:
        return self._decoded == len(self.pieces)

    def step(
        self,
        url_for: Callable[[str], str],
        header: Callable[[Piece, str], bytes],
        finish: Callable[[pa.RecordBatch, int], pa.RecordBatch],
    ) -> tuple[PieceColumns, pa.RecordBatch]:
        """The span's next pieces, about DECODE_BYTES of them (at least one), checked and
        decoded in one pass and `finish`ed once: their records back to back, piece after piece."""
        pieces, i = self.pieces, self._decoded
        url = url_for(pieces.file_of(i))
        data = self.data(url)
        done = int(self._ends[i - 1]) if i else 0
        j = max(i + 1, int(np.searchsorted(self._ends, done + DECODE_BYTES, side="right")))
        step = pieces.rows(i, j)
        head = data[: int(pieces.file_header[0])] if self.start == 0 else header(pieces[i], url)
        batch = finish(compacted.read_span(head, data, self.start, step, url), int(pieces.group[0]))
        self._decoded = j
        if j == len(pieces):
            self._data = None
        return step, batch

    def take(
        self,
        p: Piece,
        url_for: Callable[[str], str],
        header: Callable[[Piece, str], bytes],
        finish: Callable[[pa.RecordBatch, int], pa.RecordBatch],
    ) -> pa.RecordBatch:
        """The records of the span's piece p (each piece is taken once), decoding the next
        step if p is not decoded yet."""
        batch = self._records.pop(p.slice, None)
        if batch is not None:
            return batch
        step, whole = self.step(url_for, header, finish)
        self._records.update(zip(step.slice.tolist(), compacted.split_span(whole, step)))
        return self._records.pop(p.slice)


class PieceFetcher:
    """One replay thread's view of its groups' pieces: keeps, per group, the span being read
    and the next one in flight (two spans of at most `span_bytes`), GETs each span as parts of
    at most `part_bytes`, and the Avro header of a file once."""

    def __init__(
        self,
        store: Storage,
        pool: FetchPool,
        group_pieces: Callable[[int, int], PieceColumns],
        slices: int,
        groups: set[int],
        *,
        span_bytes: int,
        part_bytes: int,
        ahead: bool = True,
        finish: Callable[[pa.RecordBatch, int], pa.RecordBatch] = lambda batch, group: batch,
    ) -> None:
        self.store, self.pool, self.group_pieces, self.slices = store, pool, group_pieces, slices
        self.span_bytes, self.part_bytes, self.ahead = span_bytes, part_bytes or (1 << 62), ahead
        self.finish = finish  # applied to a span's records once, e.g. to tag them with their group
        self._spans: dict[int, deque[_Fetched]] = {g: deque() for g in groups}
        self._frontier: dict[int, int] = {}  # group -> first slice not yet scanned for spans
        self._headers: dict[str, Future | bytes] = {}  # a file's Avro header, or its GET in flight
        self._wake = 0  # prefetch has nothing to start before this slice (the look-ahead limit holds all back)
        self.gets = 0

    def _submit(self, key: str, start: int, length: int) -> Future:
        self.gets += 1
        return self.pool.submit(self.store.read_range, key, start, length)

    def _schedule(self, g: int, limit: int) -> None:
        """Start the GETs of group g's next span, looking at its pieces up to slice `limit`
        (a block's pieces by group come from the plan, as columns: no walk over every slice
        or piece)."""
        s = self._frontier[g]
        found: list[PieceColumns] = []
        file, start, end = "", 0, 0  # the span so far: its file and bytes [start, end)
        while s < limit:
            block = s // SLICES_PER_ROW_GROUP
            mine = self.group_pieces(block, g)
            stop = min(limit, (block + 1) * SLICES_PER_ROW_GROUP)
            a, z = np.searchsorted(mine.slice, [s, stop]).tolist()
            if a < z:
                if not found:
                    file, start = mine.file_of(a), int(mine.offset[a])
                    end = start  # the first piece joins whatever its size
                n = self._joining(mine, a, z, file, start, end)
                if n:
                    found.append(mine.rows(a, a + n))
                    end = int(mine.offset[a + n - 1] + mine.length[a + n - 1])
                if a + n < z:  # the span ends before this piece
                    stop = limit = int(mine.slice[a + n])
            s = stop
        self._frontier[g] = s
        if not found:
            return
        pieces = PieceColumns.concat(found)
        start, end = span(pieces)
        futures = [self._submit(file, a, n) for a, n in parts(start, end, self.part_bytes)]
        self._spans[g].append(_Fetched(start, pieces, futures))

    def _joining(self, mine: PieceColumns, a: int, z: int, file: str, start: int, end: int) -> int:
        """How many of pieces a..z-1 carry on the span of `file` bytes [start, end): each must
        begin in that file where the one before it ends, and the span stay within span_bytes."""
        cut = mine.rows(a, z)  # one view, its rows read once: this happens per block per span
        ids, offsets = cut.file_id, cut.offset
        ends = cut.end
        if mine.file_of(a) != file or offsets[0] != end:
            return 0
        # a span's first piece joins whatever its size; a later one only within span_bytes
        if end > start and ends[0] - start > self.span_bytes:
            return 0
        bad = (ends[1:] - start > self.span_bytes) | (ids[1:] != ids[:-1]) | (offsets[1:] != ends[:-1])
        first_bad = int(bad.argmax()) if len(bad) else 0
        return first_bad + 1 if len(bad) and bad[first_bad] else z - a

    def _fill(self, g: int, s: int) -> None:
        """Group g's spans in flight: the one being read and, with read-ahead, the next."""
        limit = min(self.slices, s + LOOKAHEAD_SLICES)
        spans, want = self._spans[g], 2 if self.ahead else 1
        while len(spans) < want and self._frontier[g] < limit:
            self._schedule(g, limit)
        if len(spans) < want and self._frontier[g] < self.slices:  # held back by the look-ahead limit only
            self._wake = min(self._wake, self._frontier[g] - LOOKAHEAD_SLICES + 1)

    def prefetch(self, s: int) -> None:
        """Make sure every group of this thread has its spans from slice s on in flight.
        Called per slice: returns at once until the look-ahead limit lets a span start (a
        span's end starts the next one from `read`)."""
        if s < self._wake:
            return
        self._wake = self.slices
        for g in self._spans:
            self._frontier.setdefault(g, s)
            self._fill(g, s)

    def next_slice(self, g: int, s: int) -> int | None:
        """The slice of group g's next piece not yet decoded, from slice s on; its span is put
        in flight if it is not. None: group g has none before `frontier(g)`, where the
        look-ahead limit stopped the search."""
        spans = self._spans[g]
        if not spans:
            self._frontier[g] = start = max(s, self._frontier.get(g, s))
            self._schedule(g, min(self.slices, start + LOOKAHEAD_SLICES))
            if not spans:
                return None
        return spans[0].next_slice

    def frontier(self, g: int) -> int:
        """The first slice group g's pieces have not been looked for in yet."""
        return self._frontier.get(g, 0)

    def next_piece(self, g: int) -> Piece:
        """Group g's next piece, once `next_slice` said there is one: what an error names."""
        return self._spans[g][0].next_piece

    def step(self, g: int) -> tuple[PieceColumns, pa.RecordBatch]:
        """Group g's next pieces (once `next_slice` said there is one), decoded together:
        their records back to back. The next span is put in flight when this one ends."""
        spans = self._spans[g]
        fetched = spans[0]
        step, batch = fetched.step(self.store.url_for, self._header, self.finish)
        if fetched.done:
            spans.popleft()
            if self.ahead:
                self._fill(g, fetched.last_slice + 1)
        return step, batch

    def _header(self, p: Piece, url: str) -> bytes:
        head = self._headers.get(p.file)
        if head is None:
            head = self._headers[p.file] = self._submit(p.file, 0, p.file_header)
        if isinstance(head, Future):
            head = self._headers[p.file] = head.result()[: p.file_header]
        if len(head) != p.file_header:
            raise IntegrityError(f"{p.where(url)}: the object is shorter than its {p.file_header}-byte header")
        return head

    def read(self, p: Piece) -> pa.RecordBatch:
        """Piece p's records, checked against the index; the spans before it are dropped.
        Called per piece: the common path is a few dict reads."""
        spans = self._spans[p.group]
        while spans and spans[0].last_slice < p.slice:
            spans.popleft()
        if not spans or spans[0].pieces.slice[0] > p.slice:  # not in flight (no read-ahead budget)
            spans.clear()
            self._frontier[p.group] = p.slice
            self._schedule(p.group, p.slice + 1)
        fetched = spans[0]
        at = fetched.index_of(p.slice)
        if at is None or fetched.pieces[at] != p:
            url = self.store.url_for(p.file)
            raise FormatError(f"{p.where(url)}: not where the index put it when the span was planned")
        batch = fetched.take(p, self.store.url_for, self._header, self.finish)
        if p.slice == fetched.last_slice:
            spans.popleft()
            if self.ahead:
                self._fill(p.group, p.slice + 1)
        return batch


def read_groups(
    store: Storage,
    pieces: Sequence[Piece],
    *,
    read_ahead_bytes: int,
    part_bytes: int,
    workers: int | None = None,
) -> Iterator[tuple[PieceColumns, pa.RecordBatch]]:
    """Pieces of some groups (each group's in slice order, groups in the order they come),
    read group after group by a `PieceFetcher` as the replay reads them: every group's first
    spans put in flight at once within `read_ahead_bytes`, consecutive pieces of a file
    coalesced into ranged GETs of at most `part_bytes`, every piece checked before its
    records are decoded. Yields the decode steps: their pieces, and their records back to
    back. A failure is raised naming the piece (a FormatError names its own)."""
    if not pieces:
        return
    cols = PieceColumns.of(list(pieces))
    order = list(dict.fromkeys(cols.group.tolist()))
    blocks: dict[tuple[int, int], PieceColumns] = {}
    for g in order:
        mine = cols.take(np.flatnonzero(cols.group == g))
        block = mine.slice // SLICES_PER_ROW_GROUP
        cuts = [0, *(np.flatnonzero(np.diff(block)) + 1).tolist(), len(mine)]
        for a, z in zip(cuts, cuts[1:]):
            blocks[(g, int(block[a]))] = mine.rows(a, z)
    none = cols.rows(0, 0)
    first, end = int(cols.slice.min()), int(cols.slice.max()) + 1
    # GETs in flight: two spans per group, within 4..GET_THREADS threads (a span's parts share them)
    pool = FetchPool(workers or min(GET_THREADS, max(4, 2 * len(order))), "keyfill-group-read")
    fetcher = PieceFetcher(
        store,
        pool,
        lambda block, g: blocks.get((g, block), none),
        end,
        set(order),
        span_bytes=span_bytes(read_ahead_bytes, len(order), part_bytes),
        part_bytes=part_bytes,
        ahead=read_ahead_bytes > 0,
    )
    try:
        fetcher.prefetch(first)
        for g in order:
            s = first
            while s < end:
                if fetcher.next_slice(g, s) is None:  # nothing of g before where the look-ahead stopped
                    s = fetcher.frontier(g)
                    continue
                at = fetcher.next_piece(g)
                try:
                    step, batch = fetcher.step(g)
                except FormatError:
                    raise
                except KeyfillError as exc:  # a missing object, a failed GET: name the piece too
                    raise IntegrityError(f"{at.where(store.url_for(at.file))}: {exc}") from None
                yield step, batch
                s = int(step.slice[-1]) + 1
    finally:
        pool.shutdown()

"""The group reader, shared by the replay and the Spark source: each group's upcoming pieces
as few large ranged GETs (consecutive pieces of a segment file fetched together as a span,
`reader.coalesce`), within a read-ahead budget that bounds what is held (`reader.read_budget`),
on a pool of daemon threads (`reader.fetch_pool`), every piece checked before its records are
decoded (`reader.fetched_span`)."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future

import numpy as np
import pyarrow as pa

from keygroups import compacted
from keygroups.batch_join import join_batches
from keygroups.compacted import Piece
from keygroups.errors import FormatError, IntegrityError, KeyfillError, ObjectNotFound
from keygroups.piece_columns import PieceColumns
from keygroups.piece_index import row_group_of, row_group_start
from keygroups.storage import Storage
from reader.coalesce import parts, span
from reader.errors import VersionGone
from reader.fetch_pool import GET_THREADS, FetchPool
from reader.fetched_span import DECODE_BYTES, STEPPED_BYTES, Decoded, FetchedSpan, StreamedPiece
from reader.read_budget import ReadBudget

LOOKAHEAD_SLICES = 256  # how far a span may reach past the slice being read


def span_bytes(read_ahead_bytes: int, groups: int, range_bytes: int) -> int:
    """The largest span a reader fetches: each group holds the span it reads and the next one
    in flight, so 2 x groups spans share the budget, and no span exceeds `range_bytes` (unless
    one piece does: a piece is never split between spans)."""
    share = read_ahead_bytes // max(1, 2 * groups)
    return max(1, min(range_bytes or share, share)) if read_ahead_bytes else 1


class PieceFetcher:
    """One replay thread's view of its groups' pieces: keeps, per group, the span being read
    and the next one in flight (two spans of at most `span_bytes`, the second only while the
    budget has room for it), GETs each span as parts of at most `range_bytes`, and the Avro
    header of a file once. Every span and decoded step is charged to `budget`, which threads
    and the consumer share (`reader.read_budget`); `caller_consumes`: the caller takes each
    step as it is decoded (a Spark task), so a needed read never waits for the budget."""

    def __init__(
        self,
        store: Storage,
        pool: FetchPool,
        group_pieces: Callable[[int, int], PieceColumns],
        slices: int,
        groups: set[int],
        *,
        span_bytes: int,
        range_bytes: int,
        budget: ReadBudget,
        ahead: bool = True,
        caller_consumes: bool = False,
        finish: Callable[[pa.RecordBatch, int], pa.RecordBatch] = lambda batch, group: batch,
        headers: bool = True,
        step_bytes: int = DECODE_BYTES,
    ) -> None:
        self.store, self.pool, self.group_pieces, self.slices = store, pool, group_pieces, slices
        self.span_bytes, self.range_bytes, self.ahead = span_bytes, range_bytes or (1 << 62), ahead
        self.budget = budget
        # a piece larger than a quarter of the budget is not held whole: it is read twice, a
        # GET of `stream_part` bytes at a time (`reader.fetched_span.StreamedPiece`)
        self.stream_bytes = max(STEPPED_BYTES, budget.limit // 4)
        self.stream_part = max(DECODE_BYTES, min(self.range_bytes, budget.limit // 8))
        self.finish = finish  # applied to a span's records once, e.g. to tag them with their group
        self.caller_consumes = caller_consumes
        self.headers = headers  # False: records are decoded without their `headers` column
        self.step_bytes = step_bytes  # compressed bytes of pieces decoded together (`FetchedSpan.step`)
        self._spans: dict[int, deque[FetchedSpan]] = {g: deque() for g in groups}
        self._frontier: dict[int, int] = {}  # group -> first slice not yet scanned for spans
        self._headers: dict[str, Future[bytes] | bytes] = {}  # a file's Avro header, or its GET in flight
        self._wake = 0  # prefetch has nothing to start before this slice (the look-ahead limit holds all back)
        self.gets = 0
        # called with the slice the thread is at before it waits for the budget (`ReadBudget.take`)
        self.on_wait: Callable[[int], object] | None = None

    def _submit(self, key: str, start: int, length: int) -> Future[bytes]:
        self.gets += 1
        return self.pool.submit(self.store.read_range, key, start, length)

    def _next_span(self, g: int, limit: int) -> tuple[PieceColumns | None, int]:
        """Group g's next span, looking at its pieces up to slice `limit` (an index row group's
        pieces by group come from the plan, as columns: no walk over every slice or piece),
        and the first slice past what was looked at."""
        s = self._frontier[g]
        found: list[PieceColumns] = []
        file, start, end = "", 0, 0  # the span so far: its file and bytes [start, end)
        while s < limit:
            rg = row_group_of(s)
            mine = self.group_pieces(rg, g)
            stop = min(limit, row_group_start(rg + 1))
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
        return (PieceColumns.concat(found) if found else None), s

    def _read_ahead(self, g: int, limit: int) -> bool:
        """Start group g's next span (up to slice `limit`) if the budget has room for it.
        False: it had none, and nothing was started."""
        pieces, frontier = self._next_span(g, limit)
        if pieces is not None:
            start, end = span(pieces)
            charge = self._holding(pieces, start, end)
            if not self.budget.try_take(charge):
                return False
            self._start(g, pieces, start, end, charge)
        self._frontier[g] = frontier
        return True

    def _need(self, g: int, limit: int, s: int) -> int | None:
        """Start group g's next span (up to slice `limit`), which the thread, at slice s,
        needs: waits for the budget if the span starts at s (and is cut to its first piece if
        the budget lets it through only because the consumer starves for s). A span that
        starts later is started only if the budget has room now; if not, its first slice is
        returned, so the thread can go on with its other groups and come back to it."""
        pieces, frontier = self._next_span(g, limit)
        if pieces is None:
            self._frontier[g] = frontier
            return None
        start, end = span(pieces)
        first = int(pieces.slice[0])
        charge = self._holding(pieces, start, end)
        if first > s and not self.caller_consumes and not self.budget.try_take(charge):
            return first
        if first == s or self.caller_consumes:
            one = pieces.rows(0, 1)
            a, z = span(one)
            least = self._holding(one, a, z)
            taken = self.budget.take(charge, least, self._consumer_slice(first), self._waiting(s))
            if taken != charge:
                pieces, frontier, start, end, charge = one, first + 1, a, z, least
        self._frontier[g] = frontier
        self._start(g, pieces, start, end, charge)
        return None

    def _stream_piece(self, pieces: PieceColumns) -> bool:
        """A span of one piece too large to hold (a larger piece is always a span of its own)."""
        return len(pieces) == 1 and int(pieces.length[0]) > self.stream_bytes

    def _holding(self, pieces: PieceColumns, start: int, end: int) -> int:
        """What the span of `pieces` (bytes [start, end)) holds of compressed bytes at most."""
        return min(end - start, 2 * self.stream_part) if self._stream_piece(pieces) else end - start

    def _start(self, g: int, pieces: PieceColumns, start: int, end: int, charge: int) -> None:
        """The GETs of a span whose bytes the budget has given."""
        if self._stream_piece(pieces):
            self._spans[g].append(StreamedPiece(pieces, self._submit, self.stream_part, self.budget, charge))
            return
        file = pieces.file_of(0)
        futures = [self._submit(file, a, n) for a, n in parts(start, end, self.range_bytes)]
        self._spans[g].append(FetchedSpan(start, pieces, futures, self.budget, charge))

    def _consumer_slice(self, s: int) -> int | None:
        """The slice work on s is for, as the budget weighs it (None: the caller consumes it)."""
        return None if self.caller_consumes else s

    def _waiting(self, s: int) -> Callable[[], object] | None:
        hook = self.on_wait
        return None if hook is None else lambda: hook(s)

    def _joining(self, mine: PieceColumns, a: int, z: int, file: str, start: int, end: int) -> int:
        """How many of pieces a..z-1 carry on the span of `file` bytes [start, end): each must
        begin in that file where the one before it ends, and the span stay within span_bytes."""
        cut = mine.rows(a, z)  # one view, its rows read once: this happens per row group per span
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

    def _fill(self, g: int, s: int) -> bool:
        """Group g's spans in flight: the one being read and, with read-ahead, the next, as
        far as the budget has room. False: it had none (`prefetch` tries again)."""
        limit = min(self.slices, s + LOOKAHEAD_SLICES)
        spans, want = self._spans[g], 2 if self.ahead else 1
        while len(spans) < want and self._frontier[g] < limit:
            if not self._read_ahead(g, limit):
                self._wake = 0
                return False
        if len(spans) < want and self._frontier[g] < self.slices:  # held back by the look-ahead limit only
            self._wake = min(self._wake, self._frontier[g] - LOOKAHEAD_SLICES + 1)
        return True

    def prefetch(self, s: int) -> None:
        """Make sure every group of this thread has its spans from slice s on in flight.
        Called per slice: returns at once until the look-ahead limit or the budget lets a
        span start (a span's end starts the next one from `read`)."""
        if s < self._wake:
            return
        self._wake = self.slices
        for g in self._spans:
            self._frontier.setdefault(g, s)
            if not self._fill(g, s):  # the budget is spent: the other groups wait too
                return

    def next_slice(self, g: int, s: int) -> int | None:
        """The slice of group g's next piece not yet decoded, from slice s on; its span is put
        in flight if it is not (a span past s only if the budget has room for it now). None:
        group g has none before `frontier(g)`, where the look-ahead limit stopped the search."""
        spans = self._spans[g]
        if not spans:
            self._frontier[g] = start = max(s, self._frontier.get(g, s))
            later = self._need(g, min(self.slices, start + LOOKAHEAD_SLICES), s)
            if not spans:
                return later
        return spans[0].next_slice

    def frontier(self, g: int) -> int:
        """The first slice group g's pieces have not been looked for in yet."""
        return self._frontier.get(g, 0)

    def next_piece(self, g: int) -> Piece:
        """Group g's next piece, once `next_slice` said there is one: what an error names."""
        return self._spans[g][0].next_piece

    def step(self, g: int) -> Decoded:
        """Group g's next pieces (once `next_slice` said there is one), decoded together:
        their records back to back, and the bytes charged to the budget for them (the
        consumer gives them back); or the next step of a large piece. The next span is put
        in flight when this one ends."""
        spans = self._spans[g]
        fetched = spans[0]
        at = fetched.next_slice
        decoded = fetched.step(
            self.store.url_for,
            self._header,
            self.finish,
            self._consumer_slice(at),
            self._waiting(at),
            headers=self.headers,
            step_bytes=self.step_bytes,
        )
        if fetched.done:
            spans.popleft()
            if self.ahead:
                self._fill(g, fetched.last_slice + 1)
        return decoded

    def _header(self, p: Piece, url: str) -> bytes:
        head = self._headers.get(p.file)
        if head is None:
            head = self._headers[p.file] = self._submit(p.file, 0, p.file_header)
        if isinstance(head, Future):
            head = self._headers[p.file] = head.result()[: p.file_header]
        if len(head) != p.file_header:
            raise IntegrityError(f"{p.where(url)}: the object is shorter than its {p.file_header}-byte header")
        return head

    def read(self, p: Piece) -> tuple[pa.RecordBatch, int]:
        """Piece p's records, checked against the index, and the bytes charged for them; the
        spans before it are dropped. Decoded a piece at a time: the caller (a thread under a
        drift bound) holds its pieces of a slice until it has merged them by event time."""
        spans = self._spans[p.group]
        while spans and spans[0].last_slice < p.slice:
            spans.popleft().release()
        if not spans or spans[0].pieces.slice[0] > p.slice:  # not in flight (no read-ahead budget)
            for dropped in spans:
                dropped.release()
            spans.clear()
            self._frontier[p.group] = p.slice
            self._need(p.group, p.slice + 1, p.slice)
        fetched = spans[0]
        if fetched.next_piece != p:
            url = self.store.url_for(p.file)
            raise FormatError(f"{p.where(url)}: not where the index put it when the span was planned")
        batches, held, partial = [], 0, True
        while partial:  # a large piece is decoded in steps: the caller holds them all (the drift bound's exception)
            _, batch, charged, partial = fetched.step(
                self.store.url_for,
                self._header,
                self.finish,
                self._consumer_slice(p.slice),
                self._waiting(p.slice),
                most=1,
                headers=self.headers,
            )
            batches.append(batch)
            held += charged
        batch = join_batches(batches)
        if fetched.done:
            spans.popleft()
            if self.ahead:
                self._fill(p.group, p.slice + 1)
        return batch, held

    def close(self) -> None:
        """Give back what the spans still in flight hold."""
        for spans in self._spans.values():
            for fetched in spans:
                fetched.release()
            spans.clear()


def read_failed(store: Storage, p: Piece, exc: BaseException) -> KeyfillError:
    """The error for a failed read of piece p, naming it. A file gone from under the reader
    while the latest version no longer names its run is VersionGone: the version being read
    was vacuumed while it was read (nothing of another version was delivered); a file the
    latest version names is damage."""
    where = p.where(store.url_for(p.file))
    if isinstance(exc, ObjectNotFound):
        found = compacted.run_of(p.file)
        try:
            latest = compacted.load_manifest(store)
        except KeyfillError:
            latest = None  # the archive itself is gone or unreadable: the file's error says enough
        if found is not None and latest is not None and found[0] not in latest.runs:
            return VersionGone.of(where, latest.version)
    return IntegrityError(f"{where}: {exc}")


def read_groups(
    store: Storage,
    pieces: Sequence[Piece],
    *,
    read_ahead_bytes: int,
    range_bytes: int,
    workers: int | None = None,
    headers: bool = True,
    step_bytes: int = DECODE_BYTES,
) -> Iterator[tuple[PieceColumns, pa.RecordBatch]]:
    """Pieces of some groups (each group's in slice order, groups in the order they come),
    read group after group by a `PieceFetcher` as the replay reads them: the spans of the
    groups to come put in flight as far as `read_ahead_bytes` allows (what is fetched and not
    yet yielded stays within it, or one piece past it: `reader.read_budget`), consecutive
    pieces of a file coalesced into ranged GETs of at most `range_bytes`, every piece checked
    before its records are decoded. Yields the decode steps (about `step_bytes` of compressed
    pieces): their pieces, and their records back to back. A failure is raised naming the
    piece (a FormatError names its own). `headers` False: no `headers` column (a sixth of the decode)."""
    if not pieces:
        return
    cols = PieceColumns.of(list(pieces))
    order = list(dict.fromkeys(cols.group.tolist()))
    row_groups: dict[tuple[int, int], PieceColumns] = {}  # (group, index row group) -> its pieces
    for g in order:
        mine = cols.take(np.flatnonzero(cols.group == g))
        rg = row_group_of(mine.slice)
        cuts = [0, *(np.flatnonzero(np.diff(rg)) + 1).tolist(), len(mine)]
        for a, z in zip(cuts, cuts[1:]):
            row_groups[(g, int(rg[a]))] = mine.rows(a, z)
    none = cols.rows(0, 0)
    first, end = int(cols.slice.min()), int(cols.slice.max()) + 1
    # GETs in flight: two spans per group, within 4..GET_THREADS threads (a span's parts share them)
    pool = FetchPool(workers or min(GET_THREADS, max(4, 2 * len(order))), "keyfill-group-read")
    budget = ReadBudget(read_ahead_bytes)
    fetcher = PieceFetcher(
        store,
        pool,
        lambda rg, g: row_groups.get((g, rg), none),
        end,
        set(order),
        span_bytes=span_bytes(read_ahead_bytes, len(order), range_bytes),
        range_bytes=range_bytes,
        budget=budget,
        ahead=read_ahead_bytes > 0,
        caller_consumes=True,
        headers=headers,
        step_bytes=step_bytes,
    )
    try:
        for g in order:
            s = first
            while s < end:
                fetcher.prefetch(first)  # the groups to come, as the budget makes room
                if fetcher.next_slice(g, s) is None:  # nothing of g before where the look-ahead stopped
                    s = fetcher.frontier(g)
                    continue
                at = fetcher.next_piece(g)
                try:
                    step, batch, held, partial = fetcher.step(g)
                except FormatError:
                    raise
                except KeyfillError as exc:  # a missing object, a failed GET: name the piece too
                    raise read_failed(store, at, exc) from None
                yield step, batch
                budget.give(held)  # the consumer has it now
                s = int(step.slice[-1]) + (not partial)  # a large piece's next step is of the same slice
    finally:
        fetcher.close()
        pool.shutdown()

"""What a replay reads and who reads it: groups balanced over threads by bytes, and the
slices' index rows loaded a row group of the piece index at a time, once for all threads,
keeping only the row groups in use (the index of a long archive does not fit in memory).

The PRELOAD_ROW_GROUPS row groups after the furthest one asked for are loaded in the
background, together: threads move through slices at about the same pace, so without it
they all reached a row group boundary together and waited on one of them; and a fetcher
plans a span over several row groups at once, which on S3 waited for their GETs one after
another. One read for all of them, in one thread: a thread per row group cost more, most of
it per-read overhead and the threads taking the GIL from each other at the start of a
replay (docs/performance.md#index-row-groups-read-together). Only those row groups: a
preload that went on to the next would walk the whole index of a long archive."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from concurrent.futures import Future

import numpy as np

import keygroups
from keygroups import compacted
from keygroups.errors import FormatError
from keygroups.piece_columns import Files, PieceColumns, rows_fine
from keygroups.piece_index import PieceIndex, row_group_of, row_group_start
from keygroups.storage import Storage

_NONE = PieceColumns.of([])
CACHED_ROW_GROUPS = 16  # covers the fetchers' look-ahead and threads apart
PRELOAD_ROW_GROUPS = 4  # the fetchers look LOOKAHEAD_SLICES (256) = 4 row groups ahead


class ReplayPlan:
    """A replay's plan, decided from the manifest and the index before any piece is read:
    which thread reads which groups, and each index row group's pieces by group and by thread."""

    def __init__(self, store: Storage, manifest: compacted.Manifest, threads: int) -> None:
        self.store = store
        self.manifest = manifest
        self.end = manifest.slices  # past the last slice replayed (a replay bounded in time: less)
        self.index = PieceIndex.of(store, manifest)
        self.threads = threads
        self.group_bytes = np.asarray(manifest.group_file_bytes, dtype=np.int64)
        if len(self.group_bytes):
            self.thread_of_group = keygroups.assign_threads(self.group_bytes, threads)
        else:
            self.thread_of_group = np.zeros(0, np.int32)
        # row group -> (group -> pieces, slice -> its event-time reach across threads)
        self._row_groups: dict[int, tuple[dict[int, PieceColumns], dict[int, int]]] = {}
        self._by_thread: dict[
            int, list[dict[int, list[compacted.Piece]]]
        ] = {}  # row group -> thread -> slice -> pieces
        self._loading: dict[int, Future[None]] = {}  # row groups being loaded, by whichever thread started first
        self._ahead = -1  # preloads have been started up to this row group
        self._lock = threading.Lock()
        self._files = Files()  # one numbering of files for all row groups: a span may cross two

    @property
    def slices(self) -> int:
        return self.end

    def groups_of(self, t: int) -> set[int]:
        return {g for g in range(len(self.thread_of_group)) if self.thread_of_group[g] == t}

    def group_pieces(self, rg: int, g: int) -> PieceColumns:
        """Group g's pieces in index row group rg, in slice order."""
        if rg + PRELOAD_ROW_GROUPS > self._ahead:
            self._preload_after(rg)
        return (self._row_groups.get(rg) or self._load(rg))[0].get(g, _NONE)

    def _preload_after(self, rg: int) -> None:
        """Start loading row groups rg + 1 .. rg + PRELOAD_ROW_GROUPS in the background (one
        thread, one index read), those not started before."""
        last = min(rg + PRELOAD_ROW_GROUPS, row_group_of(self.slices - 1))
        with self._lock:
            first, self._ahead = max(rg, self._ahead) + 1, max(last, self._ahead)
        if first <= last:
            threading.Thread(target=self._preload, args=(first, last + 1), name="keyfill-plan", daemon=True).start()

    def thread_pieces(self, rg: int, t: int) -> dict[int, list[compacted.Piece]]:
        """Thread t's pieces in index row group rg by slice, slices in order (only those it has
        pieces in): what a thread under a drift bound walks. Built on first use, from the
        groups' lists."""
        by_thread = self._by_thread.get(rg)
        if by_thread is None:
            by_group = self._load(rg)[0]
            unsorted: list[dict[int, list[compacted.Piece]]] = [{} for _ in range(self.threads)]
            thread_of = self.thread_of_group.tolist()
            for g in sorted(by_group):  # pieces of a slice by group
                for p in by_group[g]:
                    unsorted[thread_of[g]].setdefault(p.slice, []).append(p)
            by_thread = [dict(sorted(mine.items())) for mine in unsorted]  # slices in order
            with self._lock:
                if rg in self._row_groups:  # not dropped meanwhile
                    self._by_thread = {**self._by_thread, rg: by_thread}
        return by_thread[t]

    def occupied_slices(self, first: int) -> Iterator[tuple[int, bool]]:
        """The slices from `first` on that some thread has pieces in, each with whether empty
        slices came before it: under a drift bound the threads meet at those only, as an idle
        stretch of 1 s slices is thousands of empty ones."""
        s = after = first  # after: the slice after the last one yielded
        while s < self.end:
            rg = row_group_of(s)
            for x in sorted({x for t in range(self.threads) for x in self.thread_pieces(rg, t) if s <= x < self.end}):
                yield x, x > after
                after = x + 1
            s = row_group_start(rg + 1)

    def slice_spread(self, s: int) -> int:
        """From the earliest record of slice s's pieces to the latest, when two threads or
        more have pieces in it (else 0): how far apart in event time the threads are when a
        slice's pieces are taken whole, one thread's after another's."""
        rg = row_group_of(s)
        return (self._row_groups.get(rg) or self._load(rg))[1].get(s, 0)

    def _load(self, rg: int) -> tuple[dict[int, PieceColumns], dict[int, int]]:
        """Row group rg, loaded now unless another thread is loading it (then waited for)."""
        while True:
            with self._lock:
                if rg in self._row_groups:
                    return self._row_groups[rg]
                loading = self._loading.get(rg)
                if loading is None:
                    claimed = self._claim(range(rg, rg + 1))
                    break
            loading.result()  # another thread loads it: wait, then look again
        return self._fill(claimed)[rg]

    def _claim(self, row_groups: range) -> list[int]:
        """Of `row_groups`, those neither loaded nor being loaded, now this thread's to load.
        Called holding the lock."""
        mine = [n for n in row_groups if n not in self._row_groups and n not in self._loading]
        for n in mine:
            self._loading[n] = Future()
        return mine

    def _fill(self, claimed: list[int]) -> dict[int, tuple[dict[int, PieceColumns], dict[int, int]]]:
        """Load the claimed row groups (one read of the index from the first to the last) and
        publish them. On failure the claims are dropped and raised, not handed to the threads
        waiting: each loads its row group itself, so a damaged one fails only the threads that
        need it, with its own error, as when every row group loaded alone."""
        try:
            built = self._build(claimed[0], claimed[-1] + 1)
        except BaseException:
            with self._lock:
                futures = [self._loading.pop(n) for n in claimed]
            for f in futures:
                f.set_result(None)  # the waiting threads look again (`_load`)
            raise
        with self._lock:
            loaded = {**self._row_groups, **{n: built[n] for n in claimed}}
            threads = dict(self._by_thread)
            # Threads do not wait for each other, so they may be row groups apart: drop those
            # loaded longest ago (dicts keep insertion order), never those just loaded.
            for old in list(loaded)[: max(0, len(loaded) - max(CACHED_ROW_GROUPS, len(claimed)))]:
                del loaded[old]
                threads.pop(old, None)
            # replaced whole: readers never see half
            self._row_groups, self._by_thread = loaded, threads
            futures = [self._loading.pop(n) for n in claimed]
        for f in futures:
            f.set_result(None)
        return built

    def _preload(self, first: int, end: int) -> None:
        with self._lock:
            claimed = self._claim(range(first, end))
        if not claimed:
            return
        try:
            self._fill(claimed)
        except BaseException:  # noqa: S110 - named to the thread that needs the row group, when it loads it
            pass

    def _build(self, first_rg: int, end_rg: int) -> dict[int, tuple[dict[int, PieceColumns], dict[int, int]]]:
        """Row groups first_rg..end_rg - 1, read from the index at once and checked: by row
        group, its pieces by group and its slices' spreads."""
        first = row_group_start(first_rg)
        end = min(self.slices, row_group_start(end_rg))
        starts = self.index.slice_starts(first, end)
        want = (self.manifest.base + np.arange(first, end, dtype=np.int64)) * self.manifest.slice_duration_ms
        if (starts != want).any():
            bad_slice = first + int(np.flatnonzero(starts != want)[0])
            raise FormatError(f"{self.store.url}: slice {bad_slice} of the index does not match the manifest")
        pieces = PieceColumns.of_table(self.index.piece_rows(first, end), self._files)
        if len(pieces):
            sl = pieces.slice
            outside = (sl < first) | (sl >= end)
            if outside.any():
                s = int(sl[outside][0])
                raise FormatError(f"index: a piece of slice {s}, which the slice index does not list")
            fine = rows_fine(pieces, self.manifest.groups)
            if not fine.all():  # names the first bad row the way every reader does
                bad = pieces[int(np.flatnonzero(~fine)[0])]
                bad.check(self.manifest.groups, self.store.url_for)
                raise FormatError(f"{bad.where(self.store.url_for(bad.file))}: index row out of range")
            pieces = pieces.take(np.argsort(sl, kind="stable"))  # by slice (the index's order already)
        row_groups = range(first_rg, end_rg)
        cuts = np.searchsorted(pieces.slice, [row_group_start(rg) for rg in [*row_groups, end_rg]]).tolist()
        return {rg: self._row_group(pieces.rows(a, z)) for rg, a, z in zip(row_groups, cuts, cuts[1:])}

    def _row_group(self, pieces: PieceColumns) -> tuple[dict[int, PieceColumns], dict[int, int]]:
        """A row group's pieces (in slice order) by group, and its slices' spreads. Column-wise:
        with 10 s slices a row group is 4,096 pieces, and a loop or a Piece object per piece
        cost more (and garbage collections, `keygroups.piece_columns`;
        docs/performance.md#index-rows-as-columns)."""
        if not len(pieces):
            return {}, {}
        sl, g = pieces.slice, pieces.group
        order = np.lexsort((sl, g))  # by group, then slice
        ordered = pieces.take(order)
        bounds = [0, *(np.flatnonzero(np.diff(ordered.group)) + 1).tolist(), len(order)]
        by_group = {int(ordered.group[a]): ordered.rows(a, z) for a, z in zip(bounds, bounds[1:])}
        # per slice: earliest and latest record, and whether two threads or more have pieces
        heads = np.concatenate([[0], np.flatnonzero(np.diff(sl)) + 1])
        th = self.thread_of_group[g]
        lo = np.minimum.reduceat(pieces.min_timestamp, heads)
        hi = np.maximum.reduceat(pieces.max_timestamp, heads)
        several = np.minimum.reduceat(th, heads) != np.maximum.reduceat(th, heads)
        spreads = {int(s): int(h - x) for s, x, h in zip(sl[heads][several], lo[several], hi[several])}
        return by_group, spreads

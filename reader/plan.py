"""What a replay reads and who reads it: groups balanced over threads by bytes, and the
slices' index rows loaded a row group at a time, once for all threads, keeping only the
blocks in use (the index of a long archive does not fit in memory).

A block's successor is loaded in the background as soon as the block is: threads move
through slices at about the same pace, so without it they all reached a block boundary
together and waited on one of them turning 4,096 index rows into pieces (7 ms a block
with 10 s slices, 7% of a replay)."""

from __future__ import annotations

import threading
from concurrent.futures import Future

import numpy as np

import keygroups
from keygroups import compacted
from keygroups.errors import FormatError
from keygroups.piece_index import SLICES_PER_ROW_GROUP, PieceIndex
from keygroups.storage import Storage

CACHED_BLOCKS = 16  # of SLICES_PER_ROW_GROUP slices: covers the fetchers' look-ahead and threads apart


class ReplayPlan:
    def __init__(self, store: Storage, manifest: compacted.Manifest, threads: int) -> None:
        self.store = store
        self.manifest = manifest
        self.index = PieceIndex.of(store, manifest)
        self.threads = threads
        self.group_bytes = np.asarray(manifest.group_file_bytes, dtype=np.int64)
        if len(self.group_bytes):
            self.thread_of_group = keygroups.assign_threads(self.group_bytes, threads)
        else:
            self.thread_of_group = np.zeros(0, np.int32)
        self._by_group: dict[int, dict[int, list[compacted.Piece]]] = {}  # block -> group -> pieces
        self._by_thread: dict[int, list[dict[int, list[compacted.Piece]]]] = {}  # block -> thread -> slice -> pieces
        self._spreads: dict[int, dict[int, int]] = {}  # block -> slice -> its event-time reach across threads
        self._loading: dict[int, Future] = {}  # blocks being loaded, by whichever thread started first
        self._lock = threading.Lock()

    @property
    def slices(self) -> int:
        return self.manifest.slices

    def groups_of(self, t: int) -> set[int]:
        return {g for g in range(len(self.thread_of_group)) if self.thread_of_group[g] == t}

    def group_pieces(self, b: int, g: int) -> list[compacted.Piece]:
        """Group g's pieces in block b (SLICES_PER_ROW_GROUP slices), in slice order."""
        by_group = self._by_group.get(b)
        if by_group is None:
            by_group = self._load(b)[0]
        return by_group.get(g, [])

    def thread_pieces(self, b: int, t: int) -> dict[int, list[compacted.Piece]]:
        """Thread t's pieces in block b by slice, slices in order (only those it has pieces in):
        a thread walks these, not every slice's every piece."""
        by_thread = self._by_thread.get(b)
        if by_thread is None:
            by_thread = self._load(b)[1]
        return by_thread[t]

    def slice_spread(self, s: int) -> int:
        """From the earliest record of slice s's pieces to the latest, when two threads or
        more have pieces in it (else 0): how far apart in event time the threads are when a
        slice's pieces are taken whole, one thread's after another's."""
        spreads = self._spreads.get(s // SLICES_PER_ROW_GROUP)
        if spreads is None:
            self._load(s // SLICES_PER_ROW_GROUP)
            spreads = self._spreads[s // SLICES_PER_ROW_GROUP]
        return spreads.get(s, 0)

    def _load(self, b: int) -> tuple[dict[int, list[compacted.Piece]], list[dict[int, list[compacted.Piece]]]]:
        while True:
            with self._lock:
                if b in self._by_group:
                    return self._by_group[b], self._by_thread[b]
                loading = self._loading.get(b)
                if loading is None:
                    loading = self._loading[b] = Future()
                    break
            loading.result()  # another thread loads it: wait (and raise what it raised)
        try:
            built = self._build(b)
        except BaseException as exc:
            with self._lock:
                del self._loading[b]
            loading.set_exception(exc)
            raise
        with self._lock:
            groups, threads, spreads = dict(self._by_group), dict(self._by_thread), dict(self._spreads)
            groups[b], threads[b], spreads[b] = built
            # Threads do not wait for each other, so they may be blocks apart: drop the blocks
            # loaded longest ago (dicts keep insertion order), never the one just loaded.
            for old in list(groups)[: max(0, len(groups) - CACHED_BLOCKS)]:
                del groups[old], threads[old], spreads[old]
            # replaced whole: readers never see half
            self._by_group, self._by_thread, self._spreads = groups, threads, spreads
            del self._loading[b]
        loading.set_result(None)
        if (b + 1) * SLICES_PER_ROW_GROUP < self.slices:
            threading.Thread(target=self._preload, args=(b + 1,), name="keyfill-plan", daemon=True).start()
        return built[0], built[1]

    def _preload(self, b: int) -> None:
        with self._lock:
            if b in self._by_group or b in self._loading:
                return
        try:
            self._load(b)
        except BaseException:  # noqa: S110 - named to the thread that needs the block, when it loads it
            pass

    def _build(
        self, b: int
    ) -> tuple[dict[int, list[compacted.Piece]], list[dict[int, list[compacted.Piece]]], dict[int, int]]:
        first = b * SLICES_PER_ROW_GROUP
        block = self.index.metas(first, min(self.slices, first + SLICES_PER_ROW_GROUP))
        self._check(block)
        by_group: dict[int, list[compacted.Piece]] = {}
        by_thread: list[dict[int, list[compacted.Piece]]] = [{} for _ in range(self.threads)]
        spreads: dict[int, int] = {}
        thread_of = self.thread_of_group.tolist()
        for meta in block:
            if not meta.pieces:
                continue
            lo, hi, threads = meta.pieces[0].min_timestamp, meta.pieces[0].max_timestamp, set()
            for p in meta.pieces:
                t = thread_of[p.group]
                by_group.setdefault(p.group, []).append(p)
                by_thread[t].setdefault(p.slice, []).append(p)
                threads.add(t)
                lo, hi = min(lo, p.min_timestamp), max(hi, p.max_timestamp)
            if len(threads) > 1:
                spreads[meta.slice] = hi - lo
        return by_group, by_thread, spreads

    def _check(self, block: list[compacted.SliceMeta]) -> None:
        """Every index row of a block, once when it is loaded, before any GET it leads to."""
        for meta in block:
            for p in meta.pieces:
                p.check(self.manifest.groups, self.store.url_for)
            if meta.start_ms != self.manifest.bounds(meta.slice)[0]:
                raise FormatError(f"{self.store.url}: slice {meta.slice} of the index does not match the manifest")

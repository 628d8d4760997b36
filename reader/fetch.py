"""Fetching group files for the replay: read-ahead within a byte budget, large files as
concurrent ranged GETs, on a pool of daemon threads that a stopped replay can abandon.

The pool is written by hand because `concurrent.futures.ThreadPoolExecutor` joins its (non-daemon)
threads when the interpreter exits: a GET stuck on a frozen endpoint would then hold a
Ctrl-C'd replay open until the read timeout. These threads are daemons, and `shutdown`
cancels what has not started and returns at once; a GET in flight finishes (or times
out) on its own and its result is dropped.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

from keygroups import compacted
from keygroups.storage import Storage, StorageError

_STOP = object()


class FetchPool:
    def __init__(self, workers: int, name: str = "keyfill-read") -> None:
        self._tasks: queue.SimpleQueue = queue.SimpleQueue()
        self._closed = False
        self._lock = threading.Lock()
        self._threads = [
            threading.Thread(target=self._run, name=f"{name}-{i}", daemon=True) for i in range(max(1, workers))
        ]
        self._started = False

    def submit(self, fn: Callable[..., Any], *args: Any) -> Future:
        future: Future = Future()
        with self._lock:
            if self._closed:
                future.cancel()
                return future
            if not self._started:  # threads start on first use: a replay that fails early costs none
                self._started = True
                for t in self._threads:
                    t.start()
            self._tasks.put((future, fn, args))
        return future

    def _run(self) -> None:
        while True:
            item = self._tasks.get()
            if item is _STOP:
                return
            future, fn, args = item
            if not future.set_running_or_notify_cancel():
                continue
            try:
                future.set_result(fn(*args))
            except BaseException as exc:  # handed to whoever waits on the future
                future.set_exception(exc)

    def shutdown(self) -> None:
        """Cancel queued work and let the threads end; never waits for a GET in flight."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        while True:
            try:
                item = self._tasks.get_nowait()
            except queue.Empty:
                break
            if item is not _STOP:
                item[0].cancel()
        for _ in self._threads:
            self._tasks.put(_STOP)


class Fetcher:
    """A group file's bytes: whole, or as ranged GETs when larger than `range_bytes` (the
    hot group's, typically), so one thread is not serialised behind one long transfer while
    the others wait at the barrier."""

    def __init__(self, store: Storage, range_bytes: int, workers: int) -> None:
        self.store = store
        self.range_bytes = range_bytes
        self.pool = FetchPool(workers)

    def ranges(self, gf: compacted.GroupFile) -> list[tuple[int, int]]:
        """(start, length) of the ranged GETs for a file larger than `range_bytes`; none for a
        file fetched whole. The last range asks for one byte more than the slice metadata
        promises, so an object that is longer than recorded cannot be silently cut short."""
        size = gf.file_bytes
        if not self.range_bytes or size <= self.range_bytes:
            return []
        starts = list(range(0, size, self.range_bytes))
        return [(a, min(self.range_bytes, size - a) + (a == starts[-1])) for a in starts]

    def start(self, gf: compacted.GroupFile) -> list[Future]:
        """Read-ahead: the file's GET, or its ranged GETs, in flight on the pool."""
        ranges = self.ranges(gf)
        if not ranges:
            return [self.pool.submit(self.store.read, gf.key)]
        return [self.pool.submit(self.store.read_range, gf.key, a, n) for a, n in ranges]

    def fetch(self, gf: compacted.GroupFile, pending: list[Future] | None) -> bytes:
        """The file's bytes: from its read-ahead futures, or fetched now (beyond the read-ahead
        budget; then the calling thread GETs the first range itself while the pool GETs the
        rest)."""
        ranges = self.ranges(gf)
        if pending is None:
            if not ranges:
                return self.store.read(gf.key)
            pending = [self.pool.submit(self.store.read_range, gf.key, a, n) for a, n in ranges[1:]]
            parts = [self.store.read_range(gf.key, *ranges[0])] + [f.result() for f in pending]
        else:
            parts = [f.result() for f in pending]
        if not ranges:
            return parts[0]
        data = b"".join(parts)
        if len(data) != gf.file_bytes:
            found = "more" if len(data) > gf.file_bytes else len(data)
            raise StorageError(
                f"{self.store.url_for(gf.key)}: the slice metadata says {gf.file_bytes} bytes, the object has {found}"
            )
        return data

    def close(self) -> None:
        self.pool.shutdown()


class ReadAhead:
    """One thread's files of upcoming slices in flight, within its share of the budget."""

    def __init__(self, fetcher: Fetcher, groups: set[int], budget: int) -> None:
        self.fetcher = fetcher
        self.groups = groups
        self.budget = budget
        self._ahead: dict[tuple[int, int], list[Future]] = {}

    def prefetch(self, s: int, meta: compacted.SliceMeta) -> None:
        budget = self.budget
        for gf in meta.groups:
            if gf.group in self.groups and (s, gf.group) not in self._ahead and budget >= 0:
                budget -= gf.file_bytes
                self._ahead[(s, gf.group)] = self.fetcher.start(gf)

    def fetch(self, s: int, gf: compacted.GroupFile) -> bytes:
        return self.fetcher.fetch(gf, self._ahead.pop((s, gf.group), None))  # None: beyond the budget

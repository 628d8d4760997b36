"""The replay's hand-off from its threads to the consumer, and the place slice order is kept.

Each thread puts bundles on a FIFO of its own (a bundle: one group's records of a span of its
pieces, decoded together), with how far it has got (`through`: every piece of a slice before
it is handed over). The consumer takes slice s's pieces out of every thread's bundles and
announces s only when every thread is past it, so all records of slice s come before the
watermark of s and before any record of s + 1 (docs/design.md, invariants 1-4) while no thread
ever waits for another.

Bundles, not one item per piece: with 10 s slices a piece is ~150 records, and per-piece
work in every thread, each taking the GIL in turn, held them all back. A thread now hands
over a decoded step of ~1 MiB whole; only the consumer touches pieces one by one
(docs/performance.md#the-replays-hand-off-in-bundles).

Why not one shared queue and a per-slice barrier (what the replay had): threads then meet at
every slice, and with short slices the wake-ups and GIL hand-offs cost more than the reads.
Here a thread bundles
records across slices and blocks only when its own FIFO is full.

Within a slice the consumer takes whatever any thread has ready, so a thread that a drift
bound holds back (`reader.pacing`) is never waited on while another thread is blocked on a
full FIFO: nothing deadlocks.
"""

from __future__ import annotations

import itertools
import threading
from collections import deque
from collections.abc import Iterator

import pyarrow as pa

from reader.read_budget import ReadBudget


class ThreadFailed(Exception):
    """Raised to the consumer: a replay thread failed with `error`."""

    def __init__(self, error: BaseException) -> None:
        super().__init__(str(error))
        self.error = error


class Bundle:
    """One group's records of consecutive pieces (one per slice, slices increasing), back to
    back in `batch`: piece k is rows rows[k]..rows[k + 1], of slice slices[k]."""

    __slots__ = ("batch", "group", "slices", "rows", "next", "held")

    def __init__(self, batch: pa.RecordBatch, group: int, slices: list[int], counts: list[int], held: int = 0) -> None:
        self.batch, self.group, self.slices = batch, group, slices
        self.held = held  # bytes charged to the read budget for it, given back when its last piece is taken
        self.rows = [0, *itertools.accumulate(counts)]
        self.next = 0  # the first piece the consumer has not taken


class SliceMerge:
    def __init__(self, threads: int, capacity: int, stop: threading.Event, budget: ReadBudget | None = None) -> None:
        self.threads = threads
        self.capacity = max(1, capacity)  # items per thread's FIFO
        self._stop = stop
        self._fifos: list[deque[tuple[list[Bundle], int]]] = [deque() for _ in range(threads)]
        # one lock for the FIFOs and the read budget: a thread waiting for budget must see
        # the consumer start waiting for its slice (`ReadBudget.urgent`) at once
        self._budget = budget or ReadBudget(1 << 62, stop)
        self._cond = self._budget.cond
        self._failed: BaseException | None = None
        # consumer side: per thread, the bundles taken from its FIFO by the slices they have
        # pieces of (a dict of lists, not a heap of bundles: a heap operation per piece cost more
        # with 10 s slices, and no object is made per piece, which kept the garbage collector
        # busy); how far each thread is; the slice being handed out
        self._pending: list[dict[int, list[Bundle]]] = [{} for _ in range(threads)]
        self._through = [0] * threads
        self._slice = 0

    # --- producers --------------------------------------------------------------------------

    def put(self, t: int, bundles: list[Bundle], through: int) -> bool:
        """Thread t's next bundles (no piece before a slice it already declared finished) and
        the first slice it has not finished. Blocks while t's FIFO is full; False once the
        replay has stopped."""
        with self._cond:
            fifo = self._fifos[t]
            while len(fifo) >= self.capacity:
                if self._stop.is_set():
                    return False
                self._cond.wait(0.1)
            if self._stop.is_set():
                return False
            fifo.append((bundles, through))
            self._budget.handed_over(bool(bundles))
            self._cond.notify_all()
        return True

    def fail(self, error: BaseException) -> None:
        """A thread failed: the consumer raises `error` at once, whatever it waits for."""
        with self._cond:
            if self._failed is None:
                self._failed = error
            self._cond.notify_all()

    # --- consumer ---------------------------------------------------------------------------

    def records(self, s: int) -> Iterator[list[Bundle]]:
        """Every thread's pieces of slice s as they become ready, as lists of the bundles
        they are in (a bundle's piece of s is its `next`: the consumer takes each bundle's
        pieces in order, one per slice); returns once every thread is past s (or the replay
        stopped). Raises what a thread failed with."""
        waiting = list(range(self.threads))
        self._slice = s
        while waiting:
            progressed = False
            for t in list(waiting):
                ready = self._pending[t].pop(s, None)
                if ready:
                    yield ready
                    progressed = True
                if self._through[t] > s:
                    waiting.remove(t)  # every piece it has of s is handed out
                elif self._take(t):
                    progressed = True
            if waiting and not progressed and not self._wait(waiting):
                return

    def _take(self, t: int) -> bool:
        if self._failed is not None:
            raise ThreadFailed(self._failed)
        fifo = self._fifos[t]
        if not fifo:
            return False
        with self._cond:
            bundles, through = fifo.popleft()
            self._cond.notify_all()  # t may be blocked on its full FIFO
        pending, s = self._pending[t], self._slice
        for b in bundles:
            if b.slices[0] < s:  # a bug, never bad input: named rather than reordered
                raise ThreadFailed(RuntimeError(f"replay thread {t} handed over slice {b.slices[0]} late"))
            for sl in b.slices:
                entry = pending.get(sl)
                if entry is None:
                    pending[sl] = [b]
                else:
                    entry.append(b)
        self._through[t] = through
        return True

    def _wait(self, threads: list[int]) -> bool:
        """Until one of `threads` has handed something over (True), the replay stopped
        (False), or a thread failed (raised)."""
        with self._cond:
            while self._failed is None and not any(self._fifos[t] for t in threads):
                if self._stop.is_set():
                    return False
                self._budget.consumer(self._slice, starving=True)
                self._cond.wait(0.1)
            self._budget.consumer(self._slice, starving=False)
        if self._failed is not None:
            raise ThreadFailed(self._failed)
        return True

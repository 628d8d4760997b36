"""The replay's hand-off from its threads to the consumer, and the place slice order is kept.

Each thread puts its records on a FIFO of its own, in slice order, with how far it has got
(`through`: every slice before it is finished by that thread). The consumer takes slice s's
records from every thread's FIFO and announces s only when every thread is past it, so all
records of slice s come before the watermark of s and before any record of s + 1 (DESIGN.md
invariants 1-4) while no thread ever waits for another.

Why not one shared queue and a per-slice barrier (what the replay had): threads then meet at
every slice, and with short slices the wake-ups and GIL hand-offs cost more than the reads
(10 s slices replayed at 0.6x the rate of 10 min slices at 4 threads). Here a thread bundles
records across slices and blocks only when its own FIFO is full.

Within a slice the consumer takes whatever any thread has ready, so a thread that a drift
bound holds back (`reader.pacing`) is never waited on while another thread is blocked on a
full FIFO: nothing deadlocks.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Iterator
from typing import Any


class ThreadFailed(Exception):
    """Raised to the consumer: a replay thread failed with `error`."""

    def __init__(self, error: BaseException) -> None:
        super().__init__(str(error))
        self.error = error


class SliceMerge:
    def __init__(self, threads: int, capacity: int, stop: threading.Event) -> None:
        self.threads = threads
        self.capacity = max(1, capacity)  # items per thread's FIFO
        self._stop = stop
        self._fifos: list[deque[tuple[list[Any], int]]] = [deque() for _ in range(threads)]
        self._cond = threading.Condition()
        self._failed: BaseException | None = None
        # consumer side: records taken from a FIFO and not yet handed out, and how far each thread is
        self._pending: list[deque[Any]] = [deque() for _ in range(threads)]
        self._through = [0] * threads

    # --- producers --------------------------------------------------------------------------

    def put(self, t: int, records: list[Any], through: int) -> bool:
        """Thread t's next records (in slice order, none before a slice it already declared
        finished) and the first slice it has not finished. Blocks while t's FIFO is full;
        False once the replay has stopped."""
        with self._cond:
            fifo = self._fifos[t]
            while len(fifo) >= self.capacity:
                if self._stop.is_set():
                    return False
                self._cond.wait(0.1)
            if self._stop.is_set():
                return False
            fifo.append((records, through))
            self._cond.notify_all()
        return True

    def fail(self, error: BaseException) -> None:
        """A thread failed: the consumer raises `error` at once, whatever it waits for."""
        with self._cond:
            if self._failed is None:
                self._failed = error
            self._cond.notify_all()

    # --- consumer ---------------------------------------------------------------------------

    def records(self, s: int) -> Iterator[list[Any]]:
        """Every thread's records of slice s, in lists as they become ready; returns once
        every thread is past s (or the replay stopped). Raises what a thread failed with."""
        waiting = list(range(self.threads))
        while waiting:
            progressed = False
            for t in list(waiting):
                pending = self._pending[t]
                if pending and pending[0].slice == s:
                    ready = []
                    while pending and pending[0].slice == s:
                        ready.append(pending.popleft())
                    yield ready
                    progressed = True
                if pending:
                    if pending[0].slice < s:  # a bug, never bad input: named rather than reordered
                        raise ThreadFailed(RuntimeError(f"replay thread {t} handed over slice {pending[0].slice} late"))
                    waiting.remove(t)  # its next records are of a later slice
                elif self._through[t] > s:
                    waiting.remove(t)
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
            records, through = fifo.popleft()
            self._cond.notify_all()  # t may be blocked on its full FIFO
        self._pending[t].extend(records)
        self._through[t] = through
        return True

    def _wait(self, threads: list[int]) -> bool:
        """Until one of `threads` has handed something over (True), the replay stopped
        (False), or a thread failed (raised)."""
        with self._cond:
            while self._failed is None and not any(self._fifos[t] for t in threads):
                if self._stop.is_set():
                    return False
                self._cond.wait(0.1)
        if self._failed is not None:
            raise ThreadFailed(self._failed)
        return True

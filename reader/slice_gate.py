"""The replay's barrier, per slice and without a round for every thread: slice s + 1's
records may be emitted only once every thread has finished slice s.

A `threading.Barrier` makes every thread meet at every slice: with short slices that is a
wake-up of every thread per slice, even of threads with nothing to read there. Here a thread
only waits before a slice it has records in; a thread with nothing in a slice marks it done
and moves on. The last thread to finish a slice announces it (on the consumer's queue, under
the gate's lock, so announcements are in slice order and after every record of the slice:
each thread queues its records before it marks the slice done).
"""

from __future__ import annotations

import threading
from collections.abc import Callable


class SliceGate:
    def __init__(self, threads: int, first: int, stop: threading.Event, announce: Callable[[int], None]) -> None:
        self.threads = threads
        self.complete = first - 1  # every slice up to this one is finished by every thread
        self._done: dict[int, int] = {}
        self._stop = stop
        self._announce = announce
        self._cond = threading.Condition()

    def wait_for(self, s: int) -> bool:
        """Block until every slice before s is finished; False if the replay stopped."""
        if self.complete >= s - 1:  # an int read needs no lock
            return True
        with self._cond:
            while self.complete < s - 1:
                if self._stop.is_set():
                    return False
                self._cond.wait(0.1)
        return True

    def finish(self, first: int, end: int) -> None:
        """The calling thread has finished slices [first, end). Nothing once the replay has
        stopped: its consumer reads no more, and a stopped thread must leave at once."""
        if self._stop.is_set():
            return
        with self._cond:
            before = self.complete
            for s in range(first, end):
                n = self._done.get(s, 0) + 1
                if n < self.threads:
                    self._done[s] = n
                    continue
                self._done.pop(s, None)
                self.complete = s  # a thread finishes slices in order, so s - 1 completed before
                if not self._stop.is_set():
                    self._announce(s)
            if self.complete != before:  # wake the waiting threads only when they may go on
                self._cond.notify_all()

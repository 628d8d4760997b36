"""The read-ahead budget as a bound on memory: the bytes one reader holds (a replay's threads
together, or one Spark task), counted as they are fetched, decoded and handed over.

What counts: the compressed bytes of every span of pieces from the moment its GETs start until
its last piece is decoded, and decoded records from the moment a step is decoded until the
consumer has taken them. A reader asks before it starts a GET or decodes a step; it waits
while the budget is spent, so a slow consumer slows the fetch instead of letting the reader
run ahead of it by whole slices.

Two ways past the limit, both needed for progress and both one piece wide:
- nothing is held at all: a piece larger than the budget is still read (a piece is never
  split);
- the consumer waits for slice s with nothing to take while the budget is spent on later
  slices (a thread that ran ahead): one reader that owes it a piece of s may fetch and decode
  that one piece (`urgent`), and no other reader may until it has handed the piece over.
  Without it the replay would deadlock: the bytes held can only be handed over after slice s,
  and s cannot be read within the budget.

Written by hand: a counting semaphore whose waiters may be let through by the consumer's
state, and whose permits are sized per request, is no standard primitive.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

# Decoded records are several times their compressed bytes (the envelope's columns, Arrow's
# offsets). A step is admitted at this many times its compressed bytes until a decode shows
# more; the charge is then set to what the step really holds.
FIRST_RATIO = 4.0

WAIT_S = 0.1  # how often a waiting reader looks at the stop flag


class ReadStopped(Exception):
    """The reader was stopped while it waited for its budget."""


class ReadBudget:
    """Bytes held by one reader, within `limit` (0: no read-ahead; everything is read when it
    is needed, one piece at a time)."""

    def __init__(self, limit: int, stop: threading.Event | None = None) -> None:
        self.limit = limit
        self.held = 0
        self.peak = 0  # the most held at once: what the tests and benchmarks read
        self.cond = threading.Condition()  # shared with the replay's hand-off (`reader.slice_merge`)
        self._stop = stop or threading.Event()
        self._ratio = FIRST_RATIO
        self._slice = 0  # the slice the consumer takes
        self._starving = False  # the consumer waits for that slice with nothing to take
        self._feeder: int | None = None  # the thread let past the limit for it, until it hands over
        self._waiting = 0  # readers waiting in `take`

    # --- readers -----------------------------------------------------------------------------

    def try_take(self, n: int) -> bool:
        """Read-ahead: `n` bytes only if they fit (or nothing is held); never waits."""
        with self.cond:
            if self._fits(n):
                self._add(n)
                return True
            return False

    def take(
        self, n: int, least: int, slice: int | None = None, before_wait: Callable[[], object] | None = None
    ) -> int:
        """Bytes for work on `slice`: `n` once they fit, or `least` (the work cut to one piece)
        at once if the consumer starves for that slice (None: the caller is its own consumer,
        and nothing else can free the budget). `before_wait` is called once if the caller
        must wait (a replay thread tells the consumer how far it has got, so the consumer can
        go on without it). Returns the bytes taken; raises ReadStopped if the reader was
        stopped while waiting."""
        with self.cond:
            taken = self._admit(n, least, slice)
        if taken is not None:
            return taken
        if before_wait is not None:
            before_wait()
        with self.cond:
            self._waiting += 1
            try:
                while (taken := self._admit(n, least, slice)) is None:
                    if self._stop.is_set():
                        raise ReadStopped
                    self.cond.wait(WAIT_S)
            finally:
                self._waiting -= 1
            return taken

    def _admit(self, n: int, least: int, slice: int | None) -> int | None:
        if self._fits(n):
            taken = n
        elif slice is None or self.urgent(slice):
            taken = least
            if slice is not None:
                self._feeder = threading.get_ident()
        else:
            return None
        self._add(taken)
        return taken

    def urgent(self, slice: int) -> bool:
        """Work on `slice` is what the consumer waits for, it has nothing else to take, and no
        other thread is already let past the limit to feed it."""
        return self._starving and slice <= self._slice and self._feeder in (None, threading.get_ident())

    def handed_over(self, records: bool) -> None:
        """The calling thread handed records (or only how far it has got) to the consumer
        (call with `cond` held): if it was the one let past the limit, another may be now,
        but not before the consumer has looked (records end its starving until it has)."""
        if self._feeder == threading.get_ident():
            self._feeder = None
        if records:
            self._starving = False

    def give(self, n: int) -> None:
        if n:
            with self.cond:
                self.held -= n
                if self._waiting:  # the consumer gives per batch: wake nobody in vain
                    self.cond.notify_all()

    def estimate(self, compressed: int) -> int:
        """What decoding `compressed` bytes of pieces is expected to hold."""
        return int(compressed * self._ratio)

    def charge_decoded(self, reserved: int, compressed: int, actual: int) -> None:
        """A step reserved at `reserved` decoded to `actual` bytes: charge what it holds."""
        with self.cond:
            if compressed:
                self._ratio = max(self._ratio, actual / compressed)
            self._add(actual - reserved)
            if actual < reserved and self._waiting:
                self.cond.notify_all()

    # --- the consumer ------------------------------------------------------------------------

    def consumer(self, slice: int, starving: bool) -> None:
        """Where the consumer is (call with `cond` held, as `reader.slice_merge` does)."""
        if (slice, starving) != (self._slice, self._starving):
            self._slice, self._starving = slice, starving
            if starving and self._waiting:  # a reader waiting for the budget may be urgent now
                self.cond.notify_all()

    # --- ---------------------------------------------------------------------------------------

    def _fits(self, n: int) -> bool:
        return self.held + n <= self.limit or self.held == 0

    def _add(self, n: int) -> None:
        self.held += n
        if self.held > self.peak:
            self.peak = self.held

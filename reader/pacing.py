"""Event-time pacing inside a slice: how far ahead of the others a replay thread may get.

Between barriers every thread reads its own groups at its own speed, so one thread can be
minutes of event time ahead of another (docs/performance.md#drift-between-replay-threads).
Under a drift bound a thread more than `max_drift_ms` ahead of the slowest other active
thread waits; the slowest never waits, so nothing deadlocks. (The seed design's sleep per batch, longer for
lighter groups, is a baseline in bench/bench_replay.py.)
"""

from __future__ import annotations

import threading

import numpy as np
import pyarrow as pa

from reader.options import ReplayOptions


class Pacer:
    def __init__(self, options: ReplayOptions, stop: threading.Event) -> None:
        self.threads = options.threads
        self.max_drift_ms = options.max_drift_ms
        self.max_spread_ms = 0
        self._stop = stop
        self._cond = threading.Condition()
        self._progress = [0] * self.threads
        self._active = [False] * self.threads

    def begin_slice(self, t: int, start_ms: int) -> None:
        """Thread t starts emitting at event time `start_ms` (its earliest record)."""
        with self._cond:
            self._progress[t] = start_ms
            self._active[t] = True
            self._cond.notify_all()

    def end_slice(self, t: int) -> None:
        with self._cond:
            self._active[t] = False
            self._cond.notify_all()

    def advance(self, t: int, ts: int) -> None:
        """Thread t has emitted up to event time `ts`."""
        with self._cond:
            self._progress[t] = max(self._progress[t], ts)
            self.max_spread_ms = max(self.max_spread_ms, self._spread_locked())
            self._cond.notify_all()

    def pace(self, t: int, ts: int) -> None:
        """Under a drift bound: wait while thread t would get ahead of the slowest other
        active thread by more than the bound. The slowest (ties: the lowest id) never waits."""
        if self.max_drift_ms is None:
            return
        with self._cond:
            while not self._stop.is_set():
                others = [(self._progress[u], u) for u in range(self.threads) if u != t and self._active[u]]
                if not others or (self._progress[t], t) < min(others) or ts - min(others)[0] <= self.max_drift_ms:
                    return
                self._cond.wait(0.05)

    def _spread_locked(self) -> int:
        active = [self._progress[u] for u in range(self.threads) if self._active[u]]
        return max(active) - min(active) if len(active) > 1 else 0

    def spread_ms(self) -> int:
        """Event-time spread across the threads still working on the current slice."""
        with self._cond:
            return self._spread_locked()

    def cut(self, batch: pa.RecordBatch, batch_size: int) -> list[tuple[int, int, int]]:
        """(event-time key, start, stop) of the batches a group's records go out in, keyed by
        the running maximum of their timestamps (never decreasing, so a merge on it keeps the
        group's order). Under a drift bound a batch also never spans more than half the bound
        of event time, or one batch of a light group could cover its whole slice and jump
        past the bound at once."""
        n = batch.num_rows
        if n == 0:
            return []
        ts = batch.column("timestamp").view(pa.int64()).to_numpy()
        if self.max_drift_ms is None and n <= batch_size:  # one batch: only its largest timestamp matters
            return [(int(ts.max()), 0, n)]
        runmax = np.maximum.accumulate(ts)
        cuts = set(range(0, n, batch_size))
        if self.max_drift_ms is not None:
            step = max(1, self.max_drift_ms // 2)
            cuts.update((np.flatnonzero(np.diff(runmax // step)) + 1).tolist())
        bounds = sorted(cuts) + [n]
        return [(int(runmax[b - 1]), a, b) for a, b in zip(bounds, bounds[1:])]

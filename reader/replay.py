"""Barrier-synchronised multithreaded replay of a compacted archive.

T threads share the G key groups (balanced by bytes with `keygroups.assign_threads`). For
each slice every thread reads and decodes its groups' files and puts record batches on one
bounded queue, then marks the slice done and waits at a barrier; the slice's watermark is
emitted after the last thread's mark. The queue is FIFO and nobody starts slice s + 1 before
everyone has finished slice s, so every record of slice s reaches the consumer before the
watermark of s and before any record of s + 1 (DESIGN.md invariants 1-4).

While a thread decodes slice s, its files of slice s + 1 are already being fetched (bounded
by `read_ahead_bytes`), which hides object-store latency. A file larger than `range_bytes`
(the hot group's, typically) is fetched as several concurrent ranged GETs, so one thread is
not serialised behind one long transfer while the others wait at the barrier.
"""

from __future__ import annotations

import heapq
import queue
import threading
import time
from collections.abc import Iterable, Iterator
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

import keygroups
from keygroups import compacted, envelope
from keygroups.storage import Storage, StorageError, open_storage
from reader.fetch_pool import FetchPool

CHECKPOINT_VERSION = 1
_KEY_GROUP = pa.field("key_group", pa.int32(), nullable=False)
RECORD_SCHEMA = envelope.ARROW_SCHEMA.append(_KEY_GROUP)


@dataclass(frozen=True)
class Records:
    """Records of one key group in one slice, in the group file's order."""

    batch: pa.RecordBatch
    slice: int
    group: int


@dataclass(frozen=True)
class Watermark:
    """No later record has a timestamp below `timestamp_ms` unless it was already late in its
    own partition's original order (with the replay's `watermark_bound_ms`)."""

    timestamp_ms: int
    slice: int


class ReplayError(RuntimeError):
    """A read, check or decode failed in a replay thread; names the file, slice and group."""


class CheckpointError(ValueError):
    """A checkpoint that does not belong to this archive or is not a keyfill checkpoint."""


@dataclass(frozen=True)
class _SliceDone:
    thread: int
    slice: int


@dataclass(frozen=True)
class _Failed:
    error: BaseException


def drain(q: queue.Queue) -> None:
    """Empty a queue so producers blocked on it can see the stop flag and leave."""
    while True:
        try:
            q.get_nowait()
        except queue.Empty:
            return


def put_until_stopped(q: queue.Queue, item: Any, stop: threading.Event, *, force: bool = False) -> None:
    """Put on a bounded queue, giving up once `stop` is set (unless `force`: an error must
    still reach the consumer, but not block forever if nobody is left to read it)."""
    while not stop.is_set() or force:
        try:
            q.put(item, timeout=0.1)
            return
        except queue.Full:
            if force and stop.is_set():
                return


class Replay:
    """The iterator `replay()` returns; use it as a context manager."""

    def __init__(
        self,
        url: str,
        *,
        threads: int = 16,
        resume: dict | None = None,
        batch_size: int = 65_536,
        watermark_bound_ms: int = 0,
        read_ahead_bytes: int = 256 << 20,
        range_bytes: int = 8 << 20,
        queue_batches: int | None = None,
        max_drift_ms: int | None = None,
        pacing: str = "drift",
        pacing_sleep_s: float = 0.001,
        store: Storage | None = None,
    ):
        if threads < 1:
            raise ValueError("threads must be at least 1")
        if batch_size < 1:
            raise ValueError("batch_size must be at least 1")
        if pacing not in ("drift", "proportional", "none"):
            raise ValueError("pacing must be 'drift' (with max_drift_ms), 'proportional' or 'none'")
        if max_drift_ms is not None and max_drift_ms < 0:
            raise ValueError("max_drift_ms must not be negative")
        if range_bytes < 0:
            raise ValueError("range_bytes must not be negative (0: one GET per file)")
        if watermark_bound_ms < 0:
            raise ValueError(
                "watermark_bound_ms must not be negative: a watermark past a slice's end would "
                "declare the next slice's valid records late"
            )
        self.store = store or open_storage(url, threads=max(threads * 2, 16))
        self.manifest = compacted.load_manifest(self.store)
        self.threads = threads
        self.batch_size = batch_size
        self.bound = watermark_bound_ms
        self.read_ahead_bytes = read_ahead_bytes
        self.range_bytes = range_bytes
        weights = np.asarray(self.manifest.group_payload_bytes, dtype=np.int64)
        self.thread_of_group = keygroups.assign_threads(weights, threads) if len(weights) else np.zeros(0, np.int32)
        self._queue: queue.Queue = queue.Queue(maxsize=queue_batches or max(4, 2 * threads))
        self._stop = threading.Event()
        self._barrier = threading.Barrier(threads)
        self._workers: list[threading.Thread] = []
        self._io = FetchPool(max(2, threads))
        self._started = False
        self._finished = False
        self.pacing = pacing
        self.pacing_sleep_s = pacing_sleep_s
        self.max_drift_ms = max_drift_ms if pacing == "drift" else None
        self._cond = threading.Condition()
        self._meta_lock = threading.Lock()
        self._progress = [0] * threads
        self._active = [False] * threads
        self.max_spread_ms = 0
        self.trace: list | None = None  # tests: (thread, event time, slowest other, was slowest) per paced batch
        self._group_bytes = weights
        self._heaviest = int(weights.max()) if len(weights) else 0

        # Position: the slice being replayed, records of each group already yielded in it.
        self._slice = 0
        self._emitted: dict[int, int] = {}
        self._watermark: int | None = None
        if resume is not None:
            self._restore(resume)
        self._skip = dict(self._emitted)  # records to drop at the start of each group's file

    # --- checkpoint -------------------------------------------------------------------------

    def checkpoint(self) -> dict:
        """JSON-serialisable position covering exactly the events yielded so far."""
        return {
            "version": CHECKPOINT_VERSION,
            "archive": self.store.url,
            "slices": len(self.manifest.slices),
            "slice": self._slice,
            "groups": {str(g): n for g, n in sorted(self._emitted.items()) if n},
            "watermark": self._watermark,
        }

    def _restore(self, state: dict) -> None:
        if not isinstance(state, dict) or state.get("version") != CHECKPOINT_VERSION:
            found = state.get("version") if isinstance(state, dict) else type(state).__name__
            raise CheckpointError(f"checkpoint version {found!r}; this keyfill writes {CHECKPOINT_VERSION}")
        if state.get("slices") != len(self.manifest.slices):
            raise CheckpointError(
                f"checkpoint is for an archive of {state.get('slices')} slices; {self.store.url} has "
                f"{len(self.manifest.slices)}"
            )
        try:
            position = int(state["slice"])
            emitted = {int(g): int(n) for g, n in state.get("groups", {}).items()}
            watermark = state.get("watermark")
            if watermark is not None:
                watermark = int(watermark)
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise CheckpointError(f"malformed checkpoint ({type(exc).__name__}: {exc})") from None
        if not 0 <= position <= len(self.manifest.slices) or any(n < 0 for n in emitted.values()):
            raise CheckpointError(f"checkpoint position slice {position} is outside {self.store.url}")
        self._slice, self._emitted, self._watermark = position, emitted, watermark

    # --- threads ----------------------------------------------------------------------------

    def _ranges(self, gf: compacted.GroupFile) -> list[tuple[int, int]]:
        """(start, length) of the ranged GETs for a file larger than `range_bytes`; none for a
        file fetched whole. The last range asks for one byte more than the slice metadata
        promises, so an object that is longer than recorded cannot be silently cut short."""
        size = gf.file_bytes
        if not self.range_bytes or size <= self.range_bytes:
            return []
        starts = list(range(0, size, self.range_bytes))
        return [(a, min(self.range_bytes, size - a) + (a == starts[-1])) for a in starts]

    def _start_fetch(self, gf: compacted.GroupFile) -> list[Future]:
        """Read-ahead: the file's GET, or its ranged GETs, in flight on the I/O pool."""
        ranges = self._ranges(gf)
        if not ranges:
            return [self._io.submit(self.store.read, gf.key)]
        return [self._io.submit(self.store.read_range, gf.key, a, n) for a, n in ranges]

    def _fetch(self, gf: compacted.GroupFile, pending: list[Future] | None) -> bytes:
        """The file's bytes: from its read-ahead futures, or fetched now (beyond the read-ahead
        budget; then this thread GETs the first range itself while the pool GETs the rest)."""
        ranges = self._ranges(gf)
        if pending is None:
            if not ranges:
                return self.store.read(gf.key)
            pending = [self._io.submit(self.store.read_range, gf.key, a, n) for a, n in ranges[1:]]
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

    def _worker(self, t: int, first: int, metas: list[compacted.SliceMeta | None]) -> None:
        mine = {g for g in range(len(self.thread_of_group)) if self.thread_of_group[g] == t}
        ahead: dict[tuple[int, int], list[Future]] = {}

        def prefetch(s: int) -> None:
            if s >= len(metas):
                return
            budget = self.read_ahead_bytes // self.threads
            for gf in self._slice_meta(metas, s).groups:
                if gf.group in mine and (s, gf.group) not in ahead and budget >= 0:
                    budget -= gf.file_bytes
                    ahead[(s, gf.group)] = self._start_fetch(gf)

        try:
            for s in range(first, len(metas)):
                meta = self._slice_meta(metas, s)
                prefetch(s)
                prefetch(s + 1)
                own = [gf for gf in meta.groups if gf.group in mine]
                if own:  # event time starts at the earliest record it will emit, known from metadata
                    self._begin_slice(t, min(gf.min_timestamp for gf in own))
                if self.max_drift_ms is not None:
                    # Everyone declares where its slice starts before anyone emits: a thread that
                    # began late would otherwise join below a bound the others already used.
                    self._barrier.wait()
                runs = []  # per group: its batches with a non-decreasing event-time key
                for gf in meta.groups:
                    if gf.group not in mine:
                        continue
                    if self._stop.is_set():
                        return
                    name = self.store.url_for(gf.key)
                    try:
                        data = self._fetch(gf, ahead.pop((s, gf.group), None))  # None: beyond the budget
                        batch = compacted.decode_group_file(data, gf, s, name)  # checked before any is emitted
                    except compacted.IntegrityError as exc:
                        raise ReplayError(str(exc)) from exc
                    except BaseException as exc:
                        raise ReplayError(f"group {gf.group}, slice {s}: {name}: {exc}") from exc
                    skip = self._skip.get(gf.group, 0) if s == first else 0
                    batch = batch.slice(skip)
                    batch = batch.append_column(_KEY_GROUP, pa.array(np.full(batch.num_rows, gf.group, np.int32)))
                    if self.max_drift_ms is None:  # stream file by file: decoding overlaps consuming
                        self._emit(t, self._pieces(batch, s, gf.group))
                    else:
                        runs.append(self._pieces(batch, s, gf.group))
                # Under a drift bound, emit this thread's groups merged by event time (each group
                # in its own order), so its event time only moves forward within the slice.
                self._emit(t, heapq.merge(*runs))
                self._end_slice(t)
                self._put(_SliceDone(t, s))
                self._barrier.wait()
        except threading.BrokenBarrierError:
            return
        except BaseException as exc:  # surfaces in the consumer
            self._put(_Failed(exc), force=True)
            self._barrier.abort()

    def _emit(self, t: int, pieces: Iterable[tuple[int, int, int, Records]]) -> None:
        for ts, _, _, records in pieces:
            self._pace(t, ts)
            self._put(records)
            self._advance(t, ts, records.group)

    def _pieces(self, batch: pa.RecordBatch, s: int, g: int) -> list[tuple[int, int, int, Records]]:
        """The group's batches, keyed by the running maximum of their timestamps (never
        decreasing, so a merge on it keeps the group's order). Under a drift bound a batch
        also never spans more than half the bound of event time, or one batch of a light
        group could cover its whole slice and jump past the bound at once."""
        n = batch.num_rows
        if n == 0:
            return []
        runmax = np.maximum.accumulate(batch.column("timestamp").cast(pa.int64()).to_numpy())
        cuts = set(range(0, n, self.batch_size))
        if self.max_drift_ms is not None:
            step = max(1, self.max_drift_ms // 2)
            cuts.update((np.flatnonzero(np.diff(runmax // step)) + 1).tolist())
        bounds = sorted(cuts) + [n]
        return [
            (int(runmax[b - 1]), g, i, Records(batch.slice(a, b - a), s, g))
            for i, (a, b) in enumerate(zip(bounds, bounds[1:]))
        ]

    # --- event-time pacing ------------------------------------------------------------------

    def _begin_slice(self, t: int, start_ms: int) -> None:
        with self._cond:
            self._progress[t] = start_ms
            self._active[t] = True
            self._cond.notify_all()

    def _end_slice(self, t: int) -> None:
        with self._cond:
            self._active[t] = False
            self._cond.notify_all()

    def _advance(self, t: int, ts: int, group: int) -> None:
        with self._cond:
            self._progress[t] = max(self._progress[t], ts)
            spread = self._spread_locked()
            self.max_spread_ms = max(self.max_spread_ms, spread)
            self._cond.notify_all()
        if self.pacing == "proportional" and self._heaviest:
            # The seed design's heuristic, kept for comparison: lighter groups sleep longer.
            time.sleep(self.pacing_sleep_s * (self._heaviest - self._group_bytes[group]) / self._heaviest)

    def _pace(self, t: int, ts: int) -> None:
        """With max_drift_ms: wait while this thread would get ahead of the slowest other
        active thread by more than the bound. The slowest thread (ties: the lowest id) never
        waits, so nothing deadlocks."""
        if self.max_drift_ms is None:
            return
        with self._cond:
            while not self._stop.is_set():
                others = [(self._progress[u], u) for u in range(self.threads) if u != t and self._active[u]]
                slowest = not others or (self._progress[t], t) < min(others)
                if slowest or ts - min(others)[0] <= self.max_drift_ms:
                    if self.trace is not None:
                        self.trace.append((t, ts, None if not others else min(others)[0], slowest))
                    return
                self._cond.wait(0.05)

    def _spread_locked(self) -> int:
        active = [self._progress[u] for u in range(self.threads) if self._active[u]]
        return max(active) - min(active) if len(active) > 1 else 0

    def spread_ms(self) -> int:
        """Event-time spread across the threads still working on the current slice."""
        with self._cond:
            return self._spread_locked()

    def _slice_meta(self, metas: list, s: int) -> compacted.SliceMeta:
        """Slice metadata, fetched once for all threads (empty slices need no fetch)."""
        if metas[s] is not None:  # already loaded: no need to queue behind a fetch of another slice
            return metas[s]
        with self._meta_lock:
            if metas[s] is None:
                metas[s] = compacted.slice_meta(self.store, self.manifest.slices[s])
            return metas[s]

    def _put(self, item: Any, force: bool = False) -> None:
        put_until_stopped(self._queue, item, self._stop, force=force)

    # --- consumer ---------------------------------------------------------------------------

    def __iter__(self) -> Iterator[Records | Watermark]:
        if self._started:
            raise RuntimeError("a replay can be iterated once")
        self._started = True
        slices = self.manifest.slices
        metas: list[compacted.SliceMeta | None] = [None] * len(slices)
        for t in range(self.threads):
            w = threading.Thread(
                target=self._worker, args=(t, self._slice, metas), name=f"keyfill-replay-{t}", daemon=True
            )
            w.start()
            self._workers.append(w)
        done = 0
        while self._slice < len(slices):
            item = self._queue.get()
            if isinstance(item, Records):
                self._emitted[item.group] = self._emitted.get(item.group, 0) + item.batch.num_rows
                yield item
            elif isinstance(item, _SliceDone):
                done += 1
                if done == self.threads:
                    done = 0
                    mark = slices[self._slice].end_ms - self.bound
                    self._slice += 1
                    self._emitted = {}
                    self._watermark = mark
                    yield Watermark(mark, self._slice - 1)
            elif isinstance(item, _Failed):
                self.close()
                if isinstance(item.error, ReplayError):
                    raise item.error
                raise ReplayError(str(item.error)) from item.error
        self._finished = True

    def close(self) -> None:
        """Stop all threads promptly (about a second at most, whatever they are doing);
        safe to call twice. A thread stuck in a GET is a daemon: it is abandoned, ends when
        its request times out, and emits nothing more."""
        self._stop.set()
        self._barrier.abort()
        drain(self._queue)
        self._io.shutdown()
        deadline = time.monotonic() + 1.0
        for w in self._workers:
            w.join(timeout=max(0.0, deadline - time.monotonic()))

    def __enter__(self) -> Replay:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def replay(url: str, *, threads: int = 16, resume: dict | None = None, **options: Any) -> Replay:
    """Replay the compacted archive at `url` with `threads` readers. Options: batch_size
    (records per batch), watermark_bound_ms (B: watermark = slice end - B), read_ahead_bytes
    (GETs of the next slice in flight), range_bytes (files larger than this are fetched as
    concurrent ranged GETs of this size; 0: one GET per file), queue_batches (batches buffered for the consumer),
    max_drift_ms (a thread ahead of the slowest active one by more than this pauses),
    pacing ("drift", or "proportional": the seed design's sleep heuristic, for comparison)."""
    return Replay(url, threads=threads, resume=resume, **options)

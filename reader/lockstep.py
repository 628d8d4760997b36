"""Multithreaded replay of a compacted archive, in slice lockstep for the consumer only.

T threads share the G key groups (balanced by bytes: `reader.replay_plan`). Every thread
(`reader.replay_threads`) reads and decodes its groups' pieces a step of about a MiB at a
time, the group that is furthest behind first (`reader.fetch`: spans of upcoming pieces are
already in flight), and hands each step over whole, on a FIFO of its own. This module is the
consumer: it takes slice s's pieces from every thread's steps and yields the watermark of s
once every thread is past s (`reader.slice_merge`), so every record of slice s reaches the consumer before the watermark
of s and before any record of s + 1 (docs/design.md, invariants 1-4), and no thread waits for
another. Inside a slice `reader.pacing` bounds how far threads drift apart in event time;
`reader.checkpoint` is the position the consumer can resume from."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
import pyarrow as pa

from keygroups import compacted, envelope, handoff
from keygroups.errors import OptionError
from keygroups.storage import Storage, open_storage
from reader.checkpoint import Checkpoint, State
from reader.errors import ReplayError
from reader.fetch import PieceFetcher, span_bytes
from reader.fetch_pool import GET_THREADS, FetchPool
from reader.memory import bounded_read_ahead, map_large_buffers
from reader.options import ReplayOptions
from reader.pacing import Pacer
from reader.read_budget import ReadBudget
from reader.replay_plan import ReplayPlan
from reader.replay_threads import ReplayThreads
from reader.slice_merge import SliceMerge, ThreadFailed
from reader.time_bounds import OffsetBounds, ScanReads, offset_bounds

_KEY_GROUP = pa.field("key_group", pa.int32(), nullable=False)
RECORD_SCHEMA = envelope.ARROW_SCHEMA.append(_KEY_GROUP)


class Records(NamedTuple):
    """Records of one key group in one slice, in the piece's order. A named tuple, not a
    frozen dataclass: a replay of 10 s slices yields one per piece, and building a frozen
    dataclass took longer (docs/performance.md#index-rows-as-columns)."""

    batch: pa.RecordBatch
    slice: int
    group: int


@dataclass(frozen=True)
class Watermark:
    """No later record has a timestamp below `timestamp_ms` unless it was already late in its
    own partition's original order (with the replay's `watermark_bound_ms`)."""

    timestamp_ms: int
    slice: int


def _tag(batch: pa.RecordBatch, group: int) -> pa.RecordBatch:
    """Records with their key group: done once per span of pieces, not per piece."""
    return batch.append_column(_KEY_GROUP, pa.array(np.full(batch.num_rows, group, np.int32)))


class Replay:
    """The iterator `replay()` returns; use it as a context manager."""

    def __init__(
        self,
        url: str,
        *,
        resume: State | None = None,
        store: Storage | None = None,
        options: ReplayOptions | None = None,
    ):
        self.options = opts = options or ReplayOptions()
        self.store = store or open_storage(url, threads=max(opts.threads * 2, 16))
        self.manifest = compacted.load_manifest(self.store)
        self.fingerprint = self.manifest.archive
        self.plan = ReplayPlan(self.store, self.manifest, opts.threads)
        self.bounds = self._bounds()
        if self.bounds:
            self.plan.end = self.bounds.end_slice
        self._stop = threading.Event()
        self.pacer = Pacer(opts, self._stop)
        # what every thread has fetched or decoded and the consumer has not taken, bounded by
        # the memory the process has; large buffers mapped, so that RSS stays near it (reader.memory)
        self.budget = ReadBudget(bounded_read_ahead(opts.read_ahead_bytes), self._stop)
        map_large_buffers()
        self._merge = SliceMerge(opts.threads, -(-opts.queue_size // opts.threads), self._stop, self.budget)
        self._pool = FetchPool(max(GET_THREADS, opts.threads))
        self._span_bytes = span_bytes(self.budget.limit, self.manifest.groups, opts.range_bytes)
        self._workers: list[threading.Thread] = []
        self._started = False
        self._last_slice_spread = self._max_slice_spread = 0

        # Position: the slice being replayed, records of each group already yielded in it.
        self._slice = self.bounds.first_slice if self.bounds else 0
        self._emitted: dict[int, int] = {}
        self._watermark: int | None = None
        if resume is not None:
            cp = Checkpoint.from_json(resume)
            cp.check(self.manifest, self.store.url)
            self._slice, self._emitted, self._watermark = cp.slice, dict(cp.groups), cp.watermark
        # records to drop at the start of each group's piece of the slice the replay resumes in
        self._threads = ReplayThreads(
            self.store,
            self.plan,
            self._merge,
            self.pacer,
            self.budget,
            self._stop,
            threads=opts.threads,
            batch_size=opts.batch_size,
            skip=dict(self._emitted),
            skip_slice=self._slice,
        )

    def _bounds(self) -> OffsetBounds | None:
        """The offsets a replay bounded in time delivers (None: the whole archive)."""
        opts = self.options
        if opts.starting_timestamp is None and opts.ending_timestamp is None:
            return None
        partitions = sorted(handoff.offsets(self.manifest))
        times = [
            None if t is None else dict.fromkeys(partitions, t)
            for t in (opts.starting_timestamp, opts.ending_timestamp)
        ]
        reads = ScanReads(bounded_read_ahead(opts.read_ahead_bytes), opts.range_bytes)
        return offset_bounds(self.plan.index, self.manifest, reads, *times)

    @property
    def gets(self) -> int:
        """GET requests made for pieces and headers so far."""
        return sum(f.gets for f in self._threads.fetchers)

    @property
    def max_spread_ms(self) -> int:
        """The largest event-time spread across threads seen so far."""
        return max(self.pacer.max_spread_ms, self._max_slice_spread)

    def spread_ms(self) -> int:
        """Event-time spread across the threads still working on the current slice (without
        a drift bound: across the threads of the last slice replayed, see `_slice_spread`)."""
        return self.pacer.spread_ms() if self.pacer.max_drift_ms is not None else self._last_slice_spread

    def _slice_spread(self, s: int) -> None:
        """Without a drift bound the consumer takes each thread's pieces of a slice whole, one
        after another: threads are as far apart as the slice's records reach (`ReplayPlan.slice_spread`)."""
        self._last_slice_spread = self.plan.slice_spread(s)
        self._max_slice_spread = max(self._max_slice_spread, self._last_slice_spread)

    def checkpoint(self) -> State:
        """JSON-serialisable position covering exactly the events yielded so far."""
        return Checkpoint(
            archive=self.fingerprint,
            url=self.store.url,
            slices=self.plan.slices,
            slice=self._slice,
            groups=dict(self._emitted),
            watermark=self._watermark,
        ).to_json()

    # --- consumer ---------------------------------------------------------------------------

    def __iter__(self) -> Iterator[Records | Watermark]:
        if self._started:
            raise RuntimeError("a replay can be iterated once")
        self._started = True
        slices = self.plan.slices
        bounds = self.bounds
        for t in range(self.options.threads):
            self._threads.fetchers.append(
                PieceFetcher(
                    self.store,
                    self._pool,
                    self.plan.group_pieces,
                    slices,
                    self.plan.groups_of(t),
                    span_bytes=self._span_bytes,
                    range_bytes=self.options.range_bytes,
                    budget=self.budget,
                    ahead=self.options.read_ahead_bytes > 0,
                    finish=_tag,
                )
            )
        for t in range(self.options.threads):
            w = threading.Thread(
                target=self._threads.run, args=(t, self._slice), name=f"keyfill-replay-{t}", daemon=True
            )
            w.start()
            self._workers.append(w)
        size = self.options.batch_size
        give = self.budget.give
        new = tuple.__new__  # Records(...) without its Python-level __new__: once per piece
        while self._slice < slices:
            s = self._slice
            emitted = self._emitted
            cut = bounds is not None and bounds.cuts(s)  # a slice at a time bound: its records in range only
            try:
                for ready in self._merge.records(s):
                    for bundle in ready:
                        k, rows, g = bundle.next, bundle.rows, bundle.group
                        bundle.next = k + 1
                        if k + 2 == len(rows):  # its last piece: the consumer holds the bundle now
                            give(bundle.held)
                        a, b, batch = rows[k], rows[k + 1], bundle.batch
                        n = b - a
                        if 0 < n <= size and not cut:  # the common case: the piece is one batch
                            emitted[g] = emitted.get(g, 0) + n  # before the yield: a checkpoint may follow it
                            yield new(Records, (batch.slice(a, n), s, g))
                            continue
                        # a piece over batch_size is several; none if the checkpoint this replay
                        # resumed from covered it all
                        for at in range(a, b, size):
                            m = min(size, b - at)
                            emitted[g] = emitted.get(g, 0) + m  # positions in the piece, kept or not
                            part = batch.slice(at, m)
                            if cut and bounds is not None:  # cut: there are bounds
                                part = bounds.filter(part)
                                if not part.num_rows:
                                    continue
                            yield Records(part, s, g)
            except ThreadFailed as failed:
                self.close()
                if isinstance(failed.error, ReplayError):
                    raise failed.error from None
                raise ReplayError(str(failed.error)) from failed.error
            if self._stop.is_set():
                return
            if self.pacer.max_drift_ms is None:
                self._slice_spread(s)
            mark = self.manifest.bounds(s)[1] - self.options.watermark_bound_ms
            self._slice = s + 1
            self._emitted = {}
            self._watermark = mark
            yield Watermark(mark, s)

    def close(self) -> None:
        """Stop all threads promptly (about a second at most, whatever they are doing);
        safe to call twice. A thread stuck in a GET is a daemon: it is abandoned, ends when
        its request times out, and emits nothing more."""
        self._stop.set()
        self._threads.barrier.abort()
        self._pool.shutdown()
        deadline = time.monotonic() + 1.0
        for w in self._workers:
            w.join(timeout=max(0.0, deadline - time.monotonic()))

    def __enter__(self) -> Replay:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def replay(
    url: str,
    *,
    threads: int = ReplayOptions.threads,
    batch_size: int = ReplayOptions.batch_size,
    watermark_bound_ms: int = ReplayOptions.watermark_bound_ms,
    read_ahead_bytes: int = ReplayOptions.read_ahead_bytes,
    range_bytes: int = ReplayOptions.range_bytes,
    queue_batches: int | None = ReplayOptions.queue_batches,
    max_drift_ms: int | None = ReplayOptions.max_drift_ms,
    starting_timestamp: int | None = ReplayOptions.starting_timestamp,
    ending_timestamp: int | None = ReplayOptions.ending_timestamp,
    resume: State | None = None,
    options: ReplayOptions | None = None,
    store: Storage | None = None,
) -> Replay:
    """Replay the compacted archive at `url`: its records group by group, each key's in
    order, with a watermark after every slice (docs/replay.md). Use it as a context manager.

    Args:
        url: the compacted archive (a local path, `s3://`, `gs://`, `abfss://`, ...).
        threads: reader threads; each fetches and decodes its own groups.
        batch_size: records per `Records` batch, at most.
        watermark_bound_ms: B: the watermark after slice s is its end minus B.
        read_ahead_bytes: bytes fetched or decoded and not yet taken, all threads together.
        range_bytes: the largest GET; 0: a span in one GET.
        queue_batches: decoded steps waiting for the consumer (default: 2 a thread, at least 64).
        max_drift_ms: a thread ahead of the slowest active one by more than this pauses.
        starting_timestamp, ending_timestamp: a backfill bounded in time (ms since the epoch),
            as Spark's Kafka source means it.
        resume: a `Replay.checkpoint()`: the replay goes on from there, exactly once.
        options: all of the above but `resume` as one `ReplayOptions`, instead of keywords.
        store: the archive's store, already open (default: `open_storage(url)`).

    Raises OptionError for an option out of its limits (docs/options.md), CheckpointError
    for a checkpoint of another archive.
    """
    keywords = ReplayOptions(
        threads=threads,
        batch_size=batch_size,
        watermark_bound_ms=watermark_bound_ms,
        read_ahead_bytes=read_ahead_bytes,
        range_bytes=range_bytes,
        queue_batches=queue_batches,
        max_drift_ms=max_drift_ms,
        starting_timestamp=starting_timestamp,
        ending_timestamp=ending_timestamp,
    )
    if options is not None and keywords != ReplayOptions():
        raise OptionError("pass either options=ReplayOptions(...) or keyword options, not both")
    return Replay(url, resume=resume, store=store, options=options or keywords)

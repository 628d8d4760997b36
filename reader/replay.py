"""Barrier-synchronised multithreaded replay of a compacted archive.

T threads share the G key groups (balanced by bytes: `reader.plan`). For each slice every
thread reads and decodes its groups' pieces (`reader.fetch`: runs of upcoming pieces are
already in flight), puts record batches on one bounded queue, then marks the slice done;
the last thread's mark queues the slice's watermark. The queue is FIFO and nobody emits
slice s + 1 before everyone has finished slice s (`reader.slice_gate`, a barrier waited on
only by threads with records in the next slice), so every record of slice s reaches the
consumer before the watermark of s and before any record of s + 1 (DESIGN.md invariants
1-4). Inside a slice `reader.pacing` bounds how far threads drift
apart in event time; `reader.checkpoint` is the position the consumer can resume from.
"""

from __future__ import annotations

import heapq
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from keygroups import compacted, envelope
from keygroups.errors import KeyfillError, OptionError
from keygroups.storage import Storage, open_storage
from reader.checkpoint import Checkpoint
from reader.fetch import FetchPool, PieceFetcher, run_bytes
from reader.options import ReplayOptions
from reader.pacing import Pacer
from reader.plan import ReplayPlan
from reader.slice_gate import SliceGate
from reader.stoppable_queue import StoppableQueue

_KEY_GROUP = pa.field("key_group", pa.int32(), nullable=False)
RECORD_SCHEMA = envelope.ARROW_SCHEMA.append(_KEY_GROUP)


@dataclass(frozen=True)
class Records:
    """Records of one key group in one slice, in the piece's order."""

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
    """Records with their key group: done once per run of pieces, not per piece."""
    return batch.append_column(_KEY_GROUP, pa.array(np.full(batch.num_rows, group, np.int32)))


class ReplayError(KeyfillError, RuntimeError):
    """A read, check or decode failed in a replay thread; names the file, slice and group."""


@dataclass(frozen=True)
class _SliceComplete:
    """Every thread has queued all its records of `slice`."""

    slice: int


@dataclass(frozen=True)
class _Bundle:
    """Several Records handed over as one queue item: a slice of short pieces costs one
    hand-off between threads, not one per piece."""

    records: tuple[Records, ...]


@dataclass(frozen=True)
class _Failed:
    error: BaseException


class Replay:
    """The iterator `replay()` returns; use it as a context manager."""

    def __init__(
        self,
        url: str,
        *,
        resume: dict | None = None,
        store: Storage | None = None,
        options: ReplayOptions | None = None,
        **kwargs: Any,
    ):
        self.options = opts = options or ReplayOptions(**kwargs)
        self.store = store or open_storage(url, threads=max(opts.threads * 2, 16))
        self.manifest = compacted.load_manifest(self.store)
        self.fingerprint = compacted.fingerprint(self.manifest)
        self.plan = ReplayPlan(self.store, self.manifest, opts.threads)
        self._stop = threading.Event()
        self.pacer = Pacer(opts, self.plan.group_bytes, self._stop)
        self._queue = StoppableQueue(opts.queue_size, self._stop)
        self._barrier = threading.Barrier(opts.threads)  # only under a drift bound, inside a slice
        self._pool = FetchPool(max(2, opts.threads))
        self._run_bytes = run_bytes(opts.read_ahead_bytes, self.manifest.groups, opts.range_bytes)
        self._fetchers: list[PieceFetcher] = []
        self._workers: list[threading.Thread] = []
        self._started = False

        # Position: the slice being replayed, records of each group already yielded in it.
        self._slice = 0
        self._emitted: dict[int, int] = {}
        self._watermark: int | None = None
        if resume is not None:
            cp = Checkpoint.from_json(resume)
            cp.check(self.manifest, self.store.url)
            self._slice, self._emitted, self._watermark = cp.slice, dict(cp.groups), cp.watermark
        # records to drop at the start of each group's piece of the slice the replay resumes in
        self._skip, self._skip_slice = dict(self._emitted), self._slice
        self._gate = SliceGate(
            opts.threads, self._slice, self._stop, lambda s: self._queue.put(_SliceComplete(s), force=True)
        )

    @property
    def gets(self) -> int:
        """GET requests made for pieces and headers so far."""
        return sum(f.gets for f in self._fetchers)

    @property
    def max_spread_ms(self) -> int:
        """The largest event-time spread across threads seen so far."""
        return self.pacer.max_spread_ms

    def spread_ms(self) -> int:
        """Event-time spread across the threads still working on the current slice."""
        return self.pacer.spread_ms()

    def checkpoint(self) -> dict:
        """JSON-serialisable position covering exactly the events yielded so far."""
        return Checkpoint(
            archive=self.fingerprint,
            url=self.store.url,
            slices=self.plan.slices,
            slice=self._slice,
            groups=dict(self._emitted),
            watermark=self._watermark,
        ).to_json()

    # --- threads ----------------------------------------------------------------------------

    def _worker(self, t: int, first: int) -> None:
        plan = self.plan
        mine = plan.groups_of(t)
        fetcher = self._fetchers[t]
        drift = self.pacer.max_drift_ms is not None
        unmarked = first  # slices [unmarked, s) are finished here and not yet marked at the gate
        try:
            for s in range(first, plan.slices):
                own = [p for p in plan.slice_meta(s).pieces if p.group in mine]
                if not own and not drift:
                    continue  # nothing to emit: marked done before this thread next waits, or at the end
                fetcher.prefetch(s)
                if unmarked < s:
                    self._gate.finish(unmarked, s)
                if drift:
                    if not self._gate.wait_for(s):
                        return
                    if own:  # event time starts at the earliest record it will emit, known from the index
                        self.pacer.begin_slice(t, min(p.min_timestamp for p in own))
                    # Everyone declares where its slice starts before anyone emits: a thread that
                    # began late would otherwise join below a bound the others already used.
                    self._barrier.wait()
                    self._paced(t, fetcher, s, own)
                    self.pacer.end_slice(t)
                else:
                    self._streamed(t, fetcher, s, own)
                    self.pacer.end_slice(t)
                self._gate.finish(s, s + 1)
                unmarked = s + 1
            if unmarked < plan.slices:
                self._gate.finish(unmarked, plan.slices)
        except threading.BrokenBarrierError:
            return
        except BaseException as exc:  # surfaces in the consumer
            self._queue.put(_Failed(exc), force=True)
            self._barrier.abort()

    def _streamed(self, t: int, fetcher: PieceFetcher, s: int, own: list[compacted.Piece]) -> None:
        """A slice's pieces, handed over in bundles of about batch_size records as they are
        read (decoding overlaps consuming); the seed's proportional sleeps, if chosen, between
        batches."""
        size = self.options.batch_size
        bundle: list[Records] = []
        rows, ts = 0, 0
        opened = False  # the first batch is read and decoded before waiting for the others
        self.pacer.begin_slice(t, min(p.min_timestamp for p in own))  # for the spread statistic
        for p in own:
            if self._stop.is_set():
                return
            batch = self._read(fetcher, p)
            n = batch.num_rows
            if not n:  # all of it emitted before the checkpoint this replay resumed from
                continue
            parts = (
                [Records(batch, s, p.group)]
                if n <= size
                else [Records(batch.slice(a, size), s, p.group) for a in range(0, n, size)]
            )
            if not opened:
                if not self._gate.wait_for(s):
                    return
                opened = True
            if self.pacer.proportional:
                for r in parts:
                    self._queue.put(r)
                    self.pacer.advance(t, p.max_timestamp, p.group)
                continue
            bundle += parts
            rows, ts = rows + n, max(ts, p.max_timestamp)
            if rows >= size:
                self._hand_over(t, bundle, ts)
                bundle, rows = [], 0
        if bundle:
            self._hand_over(t, bundle, ts)

    def _paced(self, t: int, fetcher: PieceFetcher, s: int, own: list[compacted.Piece]) -> None:
        """Under a drift bound: this thread's groups merged by event time (each group in its
        own order), so its event time only moves forward within the slice, each batch waiting
        while the thread is too far ahead of the slowest."""
        runs = []  # per group: its batches with a non-decreasing event-time key
        for p in own:
            if self._stop.is_set():
                return
            batch = self._read(fetcher, p)
            runs.append(
                [
                    (ts, p.group, i, Records(batch.slice(a, b - a), s, p.group))
                    for i, (ts, a, b) in enumerate(self.pacer.cut(batch, self.options.batch_size))
                ]
            )
        for ts, _, _, records in heapq.merge(*runs):
            self.pacer.pace(t, ts)
            self._queue.put(records)
            self.pacer.advance(t, ts, records.group)

    def _hand_over(self, t: int, records: list[Records], ts: int) -> None:
        self._queue.put(_Bundle(tuple(records)))
        self.pacer.advance(t, ts, records[-1].group)

    def _read(self, fetcher: PieceFetcher, p: compacted.Piece) -> pa.RecordBatch:
        """The piece's records not yet emitted before the checkpoint resumed from, tagged with
        their group; checked against the index before any of them is emitted."""
        try:
            batch = fetcher.read(p)
        except compacted.FormatError as exc:
            raise ReplayError(str(exc)) from exc
        except BaseException as exc:
            raise ReplayError(f"{p.where(self.store.url_for(p.file))}: {exc}") from exc
        skip = self._skip.get(p.group, 0) if p.slice == self._skip_slice else 0
        if skip > batch.num_rows:
            where = p.where(self.store.url_for(p.file))
            raise ReplayError(
                f"{where}: the checkpoint says {skip} records were emitted, the piece has {batch.num_rows}"
            )
        return batch.slice(skip) if skip else batch

    # --- consumer ---------------------------------------------------------------------------

    def __iter__(self) -> Iterator[Records | Watermark]:
        if self._started:
            raise RuntimeError("a replay can be iterated once")
        self._started = True
        slices = self.manifest.slices
        for t in range(self.options.threads):
            self._fetchers.append(
                PieceFetcher(
                    self.store,
                    self._pool,
                    self.plan.group_pieces,
                    slices,
                    self.plan.groups_of(t),
                    run_bytes=self._run_bytes,
                    part_bytes=self.options.range_bytes,
                    ahead=self.options.read_ahead_bytes > 0,
                    finish=_tag,
                )
            )
        for t in range(self.options.threads):
            w = threading.Thread(target=self._worker, args=(t, self._slice), name=f"keyfill-replay-{t}", daemon=True)
            w.start()
            self._workers.append(w)
        while self._slice < slices:
            item = self._queue.get()
            if isinstance(item, Records):
                self._emitted[item.group] = self._emitted.get(item.group, 0) + item.batch.num_rows
                yield item
            elif isinstance(item, _Bundle):
                for records in item.records:
                    self._emitted[records.group] = self._emitted.get(records.group, 0) + records.batch.num_rows
                    yield records
            elif isinstance(item, _SliceComplete):
                mark = self.manifest.bounds(item.slice)[1] - self.options.watermark_bound_ms
                self._slice = item.slice + 1
                self._emitted = {}
                self._watermark = mark
                yield Watermark(mark, item.slice)
            elif isinstance(item, _Failed):
                self.close()
                if isinstance(item.error, ReplayError):
                    raise item.error
                raise ReplayError(str(item.error)) from item.error

    def close(self) -> None:
        """Stop all threads promptly (about a second at most, whatever they are doing);
        safe to call twice. A thread stuck in a GET is a daemon: it is abandoned, ends when
        its request times out, and emits nothing more."""
        self._stop.set()
        self._barrier.abort()
        self._queue.drain()
        self._pool.shutdown()
        deadline = time.monotonic() + 1.0
        for w in self._workers:
            w.join(timeout=max(0.0, deadline - time.monotonic()))

    def __enter__(self) -> Replay:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def replay(url: str, *, threads: int = 16, resume: dict | None = None, **options: Any) -> Replay:
    """Replay the compacted archive at `url` with `threads` readers, resuming from a
    `checkpoint()` if given. Options: see `reader.options.ReplayOptions` (batch_size,
    watermark_bound_ms, read_ahead_bytes, range_bytes, queue_batches, max_drift_ms, pacing)."""
    if "options" in options:  # a ReplayOptions value: it carries the thread count itself
        if len(options) > 1 or threads != 16:
            raise OptionError("pass either options=ReplayOptions(...) or keyword options, not both")
        return Replay(url, resume=resume, **options)
    return Replay(url, threads=threads, resume=resume, **options)

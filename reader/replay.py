"""Barrier-synchronised multithreaded replay of a compacted archive.

T threads share the G key groups (balanced by bytes: `reader.plan`). For each slice every
thread reads and decodes its groups' pieces (`reader.fetch`: runs of upcoming pieces are
already in flight) and puts record batches on one bounded queue, then marks the slice done and waits
at a barrier; the slice's watermark is emitted after the last thread's mark. The queue is
FIFO and nobody starts slice s + 1 before everyone has finished slice s, so every record of
slice s reaches the consumer before the watermark of s and before any record of s + 1
(DESIGN.md invariants 1-4). Inside a slice `reader.pacing` bounds how far threads drift
apart in event time; `reader.checkpoint` is the position the consumer can resume from.
"""

from __future__ import annotations

import heapq
import threading
import time
from collections.abc import Iterable, Iterator
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


class ReplayError(KeyfillError, RuntimeError):
    """A read, check or decode failed in a replay thread; names the file, slice and group."""


@dataclass(frozen=True)
class _SliceDone:
    thread: int
    slice: int


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
        self._barrier = threading.Barrier(opts.threads)
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
        self._skip = dict(self._emitted)  # records to drop at the start of each group's piece

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
        opts, plan = self.options, self.plan
        mine = plan.groups_of(t)
        fetcher = self._fetchers[t]
        try:
            for s in range(first, plan.slices):
                meta = plan.slice_meta(s)
                fetcher.prefetch(s)
                own = [p for p in meta.pieces if p.group in mine]
                if own:  # event time starts at the earliest record it will emit, known from the index
                    self.pacer.begin_slice(t, min(p.min_timestamp for p in own))
                if self.pacer.max_drift_ms is not None:
                    # Everyone declares where its slice starts before anyone emits: a thread that
                    # began late would otherwise join below a bound the others already used.
                    self._barrier.wait()
                runs = []  # per group: its batches with a non-decreasing event-time key
                for p in own:
                    if self._stop.is_set():
                        return
                    batch = self._read(fetcher, p, skip=self._skip.get(p.group, 0) if s == first else 0)
                    pieces = [
                        (ts, p.group, i, Records(batch.slice(a, b - a), s, p.group))
                        for i, (ts, a, b) in enumerate(self.pacer.cut(batch, opts.batch_size))
                    ]
                    if self.pacer.max_drift_ms is None:  # stream piece by piece: decoding overlaps consuming
                        self._emit(t, pieces)
                    else:
                        runs.append(pieces)
                # Under a drift bound, emit this thread's groups merged by event time (each group
                # in its own order), so its event time only moves forward within the slice.
                self._emit(t, heapq.merge(*runs))
                self.pacer.end_slice(t)
                self._queue.put(_SliceDone(t, s))
                self._barrier.wait()
        except threading.BrokenBarrierError:
            return
        except BaseException as exc:  # surfaces in the consumer
            self._queue.put(_Failed(exc), force=True)
            self._barrier.abort()

    def _read(self, fetcher: PieceFetcher, p: compacted.Piece, skip: int) -> pa.RecordBatch:
        """The piece's records after `skip`, tagged with their group; checked against the
        index before any of them is emitted."""
        name = self.store.url_for(p.file)
        try:
            header, data = fetcher.read(p)
            batch = compacted.read_piece(header, data, p, name)
        except compacted.FormatError as exc:
            raise ReplayError(str(exc)) from exc
        except BaseException as exc:
            raise ReplayError(f"{p.where(name)}: {exc}") from exc
        if skip > batch.num_rows:
            raise ReplayError(
                f"{p.where(name)}: the checkpoint says {skip} records were emitted, the piece has {batch.num_rows}"
            )
        batch = batch.slice(skip)
        return batch.append_column(_KEY_GROUP, pa.array(np.full(batch.num_rows, p.group, np.int32)))

    def _emit(self, t: int, pieces: Iterable[tuple[int, int, int, Records]]) -> None:
        for ts, _, _, records in pieces:
            self.pacer.pace(t, ts)
            self._queue.put(records)
            self.pacer.advance(t, ts, records.group)

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
                    self.plan.slice_meta,
                    slices,
                    self.plan.groups_of(t),
                    run_bytes=self._run_bytes,
                    part_bytes=self.options.range_bytes,
                    ahead=self.options.read_ahead_bytes > 0,
                )
            )
        for t in range(self.options.threads):
            w = threading.Thread(target=self._worker, args=(t, self._slice), name=f"keyfill-replay-{t}", daemon=True)
            w.start()
            self._workers.append(w)
        done = 0
        while self._slice < slices:
            item = self._queue.get()
            if isinstance(item, Records):
                self._emitted[item.group] = self._emitted.get(item.group, 0) + item.batch.num_rows
                yield item
            elif isinstance(item, _SliceDone):
                done += 1
                if done == self.options.threads:
                    done = 0
                    mark = self.manifest.bounds(self._slice)[1] - self.options.watermark_bound_ms
                    self._slice += 1
                    self._emitted = {}
                    self._watermark = mark
                    yield Watermark(mark, self._slice - 1)
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

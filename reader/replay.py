"""Multithreaded replay of a compacted archive, in slice lockstep for the consumer only.

T threads share the G key groups (balanced by bytes: `reader.plan`). Every thread reads and
decodes its groups' pieces slice after slice (`reader.fetch`: runs of upcoming pieces are
already in flight) and hands its records over on a FIFO of its own, bundled across slices.
The consumer takes slice s's records from every thread's FIFO and yields the watermark of s
once every thread is past s (`reader.slice_merge`), so every record of slice s reaches the
consumer before the watermark of s and before any record of s + 1 (DESIGN.md invariants
1-4), and no thread waits for another. Inside a slice `reader.pacing` bounds how far threads
drift apart in event time; `reader.checkpoint` is the position the consumer can resume from.
"""

from __future__ import annotations

import heapq
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from keygroups import compacted, envelope
from keygroups.errors import KeyfillError, OptionError
from keygroups.piece_index import SLICES_PER_ROW_GROUP
from keygroups.storage import Storage, open_storage
from reader.checkpoint import Checkpoint
from reader.fetch import FetchPool, PieceFetcher, run_bytes
from reader.options import ReplayOptions
from reader.pacing import Pacer
from reader.plan import ReplayPlan
from reader.slice_merge import SliceMerge, ThreadFailed

_KEY_GROUP = pa.field("key_group", pa.int32(), nullable=False)
RECORD_SCHEMA = envelope.ARROW_SCHEMA.append(_KEY_GROUP)


@dataclass(frozen=True, slots=True)
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


class _Outbox:
    """A replay thread's records not yet handed over: bundled across slices up to about
    batch_size records, so a run of short slices costs one hand-off, not one per slice or piece."""

    def __init__(self, merge: SliceMerge, t: int, size: int) -> None:
        self.merge, self.t, self.size = merge, t, size
        self.records: list[Records] = []
        self.rows = 0

    def add(self, records: Sequence[Records], rows: int) -> bool:
        """True when the bundle is full."""
        self.records += records
        self.rows += rows
        return self.rows >= self.size

    def flush(self, through: int) -> bool:
        """Hand the bundle over; `through`: the first slice this thread has not finished.
        False once the replay has stopped."""
        handed = self.merge.put(self.t, self.records, through)
        self.records, self.rows = [], 0
        return handed


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
        self.fingerprint = self.manifest.archive
        self.plan = ReplayPlan(self.store, self.manifest, opts.threads)
        self._stop = threading.Event()
        self.pacer = Pacer(opts, self.plan.group_bytes, self._stop)
        self._merge = SliceMerge(opts.threads, -(-opts.queue_size // opts.threads), self._stop)
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
        fetcher = self._fetchers[t]
        out = _Outbox(self._merge, t, self.options.batch_size)
        try:
            if self.pacer.max_drift_ms is None:
                block = -1
                for s, own in self._own_slices(t, first):
                    if s // SLICES_PER_ROW_GROUP != block:
                        # A hand-off at least every index block, even an empty one: a light
                        # thread would otherwise hold back the watermarks of every slice until
                        # its bundle filled, or until it ended.
                        block = s // SLICES_PER_ROW_GROUP
                        if not out.flush(s):
                            return
                    fetcher.prefetch(s)
                    if not self._streamed(t, fetcher, s, own, out):
                        return  # the replay stopped
                    self.pacer.end_slice(t)
                out.flush(plan.slices)  # also says this thread is past every slice
                return
            for s in range(first, plan.slices):  # under a drift bound every thread meets at every slice
                own = plan.thread_pieces(s // SLICES_PER_ROW_GROUP, t).get(s, [])
                fetcher.prefetch(s)
                # No thread declares where slice s starts before every thread has finished
                # s - 1: the pacer would hold a thread of s - 1 back against it.
                self._barrier.wait()
                if own:  # event time starts at the earliest record it will emit, known from the index
                    self.pacer.begin_slice(t, min(p.min_timestamp for p in own))
                # Everyone declares where its slice starts before anyone emits: a thread that
                # began late would otherwise join below a bound the others already used.
                self._barrier.wait()
                self._paced(t, fetcher, s, own)
                self.pacer.end_slice(t)
                if not self._merge.put(t, [], s + 1):  # at once: the others wait at the next barrier
                    return
        except threading.BrokenBarrierError:
            return
        except BaseException as exc:  # surfaces in the consumer
            self._merge.fail(exc)
            self._barrier.abort()

    def _own_slices(self, t: int, first: int) -> Iterator[tuple[int, list[compacted.Piece]]]:
        """The slices from `first` on that thread t has pieces in, with those pieces."""
        for b in range(first // SLICES_PER_ROW_GROUP, -(-self.plan.slices // SLICES_PER_ROW_GROUP)):
            for s, own in self.plan.thread_pieces(b, t).items():
                if s >= first:
                    yield s, own

    def _streamed(self, t: int, fetcher: PieceFetcher, s: int, own: list[compacted.Piece], out: _Outbox) -> bool:
        """A slice's pieces into the thread's outbox, handed over in bundles of about
        batch_size records (decoding overlaps consuming); the seed's proportional sleeps, if
        chosen, between batches. Runs once per piece: kept to a few attribute reads. False
        once the replay has stopped."""
        size = self.options.batch_size
        self.pacer.begin_slice(t, min(p.min_timestamp for p in own))  # for the spread statistic
        plain = not self.pacer.proportional and s != self._skip_slice
        stop = self._stop
        for p in own:
            if stop.is_set():
                return False
            if plain and p.records <= size:  # the common case: one Records per piece
                full = out.add((Records(self._read(fetcher, p), s, p.group),), p.records)
            else:
                batch = self._read(fetcher, p, s == self._skip_slice)
                n = batch.num_rows
                if not n:  # all of it emitted before the checkpoint this replay resumed from
                    continue
                parts = [Records(batch.slice(a, size), s, p.group) for a in range(0, n, size)]
                if self.pacer.proportional:  # each batch handed over alone, a sleep after each
                    for r in parts:
                        out.add((r,), 0)
                        if not out.flush(s):
                            return False
                        self.pacer.advance(t, p.max_timestamp, p.group)
                    continue
                full = out.add(parts, n)
            if full:
                if not out.flush(s):
                    return False
                self.pacer.advance(t, p.max_timestamp, p.group)
        return True

    def _paced(self, t: int, fetcher: PieceFetcher, s: int, own: list[compacted.Piece]) -> None:
        """Under a drift bound: this thread's groups merged by event time (each group in its
        own order), so its event time only moves forward within the slice, each batch waiting
        while the thread is too far ahead of the slowest."""
        runs = []  # per group: its batches with a non-decreasing event-time key
        for p in own:
            if self._stop.is_set():
                return
            batch = self._read(fetcher, p, s == self._skip_slice)
            runs.append(
                [
                    (ts, p.group, i, Records(batch.slice(a, b - a), s, p.group))
                    for i, (ts, a, b) in enumerate(self.pacer.cut(batch, self.options.batch_size))
                ]
            )
        for ts, _, _, records in heapq.merge(*runs):
            self.pacer.pace(t, ts)
            if not self._merge.put(t, [records], s):
                return
            self.pacer.advance(t, ts, records.group)

    def _read(self, fetcher: PieceFetcher, p: compacted.Piece, resumed: bool = False) -> pa.RecordBatch:
        """The piece's records, tagged with their group and checked against the index before
        any of them is emitted; `resumed`: in the slice this replay resumed in, only those not
        emitted before its checkpoint."""
        try:
            batch = fetcher.read(p)
        except compacted.FormatError as exc:
            raise ReplayError(str(exc)) from exc
        except BaseException as exc:
            raise ReplayError(f"{p.where(self.store.url_for(p.file))}: {exc}") from exc
        skip = self._skip.get(p.group, 0) if resumed else 0
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
            s = self._slice
            try:
                for ready in self._merge.records(s):
                    for records in ready:
                        self._emitted[records.group] = self._emitted.get(records.group, 0) + records.batch.num_rows
                        yield records
            except ThreadFailed as failed:
                self.close()
                if isinstance(failed.error, ReplayError):
                    raise failed.error from None
                raise ReplayError(str(failed.error)) from failed.error
            if self._stop.is_set():
                return
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
        self._barrier.abort()
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

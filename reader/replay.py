"""Barrier-synchronised multithreaded replay of a compacted archive.

T threads share the G key groups (balanced by bytes with `keygroups.assign_threads`). For
each slice every thread reads and decodes its groups' files and puts record batches on one
bounded queue, then marks the slice done and waits at a barrier; the slice's watermark is
emitted after the last thread's mark. The queue is FIFO and nobody starts slice s + 1 before
everyone has finished slice s, so every record of slice s reaches the consumer before the
watermark of s and before any record of s + 1 (DESIGN.md invariants 1-4).

While a thread decodes slice s, its files of slice s + 1 are already being fetched (bounded
by `read_ahead_bytes`), which hides object-store latency.
"""

from __future__ import annotations

import queue
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Iterator

import numpy as np
import pyarrow as pa

import keygroups
from keygroups import compacted, envelope
from keygroups.storage import Storage, open_storage

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
    """A read or decode failed in a replay thread; names the file and the group."""


@dataclass(frozen=True)
class _SliceDone:
    thread: int
    slice: int


@dataclass(frozen=True)
class _Failed:
    error: BaseException


_STOP = object()


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
        queue_batches: int | None = None,
        store: Storage | None = None,
    ):
        if threads < 1:
            raise ValueError("threads must be at least 1")
        if batch_size < 1:
            raise ValueError("batch_size must be at least 1")
        self.store = store or open_storage(url, threads=max(threads * 2, 16))
        self.manifest = compacted.load_manifest(self.store)
        self.threads = threads
        self.batch_size = batch_size
        self.bound = watermark_bound_ms
        self.read_ahead_bytes = read_ahead_bytes
        weights = np.asarray(self.manifest.group_payload_bytes, dtype=np.int64)
        self.thread_of_group = keygroups.assign_threads(weights, threads) if len(weights) else np.zeros(0, np.int32)
        self._queue: queue.Queue = queue.Queue(maxsize=queue_batches or max(4, 2 * threads))
        self._stop = threading.Event()
        self._barrier = threading.Barrier(threads)
        self._workers: list[threading.Thread] = []
        self._io = ThreadPoolExecutor(max_workers=max(2, threads), thread_name_prefix="keyfill-read")
        self._started = False
        self._finished = False

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
        if state.get("version") != CHECKPOINT_VERSION:
            raise ValueError(f"checkpoint version {state.get('version')!r}; this keyfill writes {CHECKPOINT_VERSION}")
        if state.get("slices") != len(self.manifest.slices):
            raise ValueError(
                f"checkpoint is for an archive of {state.get('slices')} slices; {self.store.url} has "
                f"{len(self.manifest.slices)}"
            )
        self._slice = int(state["slice"])
        self._emitted = {int(g): int(n) for g, n in state.get("groups", {}).items()}
        self._watermark = state.get("watermark")

    # --- threads ----------------------------------------------------------------------------

    def _fetch(self, s: int, group_file: compacted.GroupFile) -> bytes:
        return self.store.read(group_file.key)

    def _worker(self, t: int, first: int, metas: list[compacted.SliceMeta | None]) -> None:
        mine = {g for g in range(len(self.thread_of_group)) if self.thread_of_group[g] == t}
        ahead: dict[tuple[int, int], Future] = {}

        def prefetch(s: int) -> None:
            if s >= len(metas):
                return
            budget = self.read_ahead_bytes // self.threads
            for gf in self._slice_meta(metas, s).groups:
                if gf.group in mine and (s, gf.group) not in ahead and budget >= 0:
                    budget -= gf.file_bytes
                    ahead[(s, gf.group)] = self._io.submit(self._fetch, s, gf)

        try:
            for s in range(first, len(metas)):
                meta = self._slice_meta(metas, s)
                prefetch(s)
                prefetch(s + 1)
                for gf in meta.groups:
                    if gf.group not in mine:
                        continue
                    if self._stop.is_set():
                        return
                    name = self.store.url_for(gf.key)
                    try:
                        pending = ahead.pop((s, gf.group), None)  # None: beyond the read-ahead budget
                        data = pending.result() if pending is not None else self._fetch(s, gf)
                        _, batch = envelope.decode_avro(data, name=name)
                    except BaseException as exc:
                        raise ReplayError(f"group {gf.group}, slice {s}: {name}: {exc}") from exc
                    skip = self._skip.get(gf.group, 0) if s == first else 0
                    batch = batch.slice(skip)
                    batch = batch.append_column(_KEY_GROUP, pa.array(np.full(batch.num_rows, gf.group, np.int32)))
                    for start in range(0, batch.num_rows, self.batch_size):
                        self._put(Records(batch.slice(start, self.batch_size), s, gf.group))
                self._put(_SliceDone(t, s))
                self._barrier.wait()
        except threading.BrokenBarrierError:
            return
        except BaseException as exc:  # surfaces in the consumer
            self._put(_Failed(exc), force=True)
            self._barrier.abort()

    def _slice_meta(self, metas: list, s: int) -> compacted.SliceMeta:
        if metas[s] is None:
            if self.manifest.slices[s].records == 0:
                summary = self.manifest.slices[s]
                metas[s] = compacted.SliceMeta(slice=s, start_ms=summary.start_ms, end_ms=summary.end_ms)
            else:
                metas[s] = compacted.load_slice(self.store, s)
        return metas[s]

    def _put(self, item: Any, force: bool = False) -> None:
        while not self._stop.is_set() or force:
            try:
                self._queue.put(item, timeout=0.1)
                return
            except queue.Full:
                if force and self._stop.is_set():
                    return

    # --- consumer ---------------------------------------------------------------------------

    def __iter__(self) -> Iterator[Records | Watermark]:
        if self._started:
            raise RuntimeError("a replay can be iterated once")
        self._started = True
        slices = self.manifest.slices
        metas: list[compacted.SliceMeta | None] = [None] * len(slices)
        for t in range(self.threads):
            w = threading.Thread(target=self._worker, args=(t, self._slice, metas), name=f"keyfill-replay-{t}",
                                 daemon=True)
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
        """Stop all threads promptly; safe to call twice."""
        self._stop.set()
        self._barrier.abort()
        while True:  # unblock producers waiting on a full queue
            try:
                self._queue.get_nowait()
            except queue.Empty:
                break
        for w in self._workers:
            w.join(timeout=5)
        self._io.shutdown(wait=False, cancel_futures=True)

    def __enter__(self) -> Replay:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def replay(url: str, *, threads: int = 16, resume: dict | None = None, **options: Any) -> Replay:
    """Replay the compacted archive at `url` with `threads` readers; see `Replay` for options
    (batch_size, watermark_bound_ms, read_ahead_bytes, queue_batches)."""
    return Replay(url, threads=threads, resume=resume, **options)

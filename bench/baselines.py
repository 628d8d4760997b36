"""Baseline replays of a SOURCE archive (partition-ordered envelope chunks), for benchmarks.

They are what a backfill does without keyfill, so the benchmark can show what compaction
buys. Both decode with the same compiled decoder as the reader (`envelope.decode_avro`,
GIL-free) and yield the same events, Arrow record batches of envelope records, so the
comparison is about the I/O pattern and the parallelism, not the decoder:

- `PerPartitionReplay`: one reader thread per Kafka partition, each reading its
  partition's chunks in offset order (today's practice: parallelism = partitions).
- `ShardedReplay`: N reader threads, each reading EVERY chunk and keeping only its keys, so
  it reads N x the archive (I/O amplification) but is not capped by the partition count.

Both count the bytes they GET (`bytes_read`). Each reader fetches `read_ahead` chunks ahead
of the one it decodes (default 1): without it the baselines would also lose on GET latency,
which is not what compaction is about. They live in bench/ because they need `compactor`
(the source-archive index), and the `reader` package must never import `compactor`.
"""

from __future__ import annotations

import heapq
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TypeVar

import numpy as np
import pyarrow as pa

from bench.stoppable_queue import StoppableQueue
from compactor.sources.envelope import ArchiveIndex, SourceChunk, build_index
from keygroups import envelope
from keygroups.storage import Storage, open_storage
from reader.flink_keyby import consumer_indexes, flink_default_max_parallelism
from reader.lockstep import Replay
from reader.options import ReplayOptions

__all__ = ["BaselineError", "PerPartitionReplay", "ShardedReplay", "time_ordered_chunks"]


_R = TypeVar("_R", bound="_BaselineReplay")


class BaselineError(RuntimeError):
    """A read or decode failed in a baseline reader thread; names the file."""


class _Done:
    pass


_DONE = _Done()


class _BaselineReplay:
    """Shared plumbing: reader threads put batches on one bounded queue (backpressure, bounded
    memory, like the reader); iterating yields them in arrival order, so each thread's own
    order is kept. Use as a context manager so leaving early stops the threads."""

    def __init__(
        self,
        url: str,
        *,
        store: Storage | None = None,
        index: ArchiveIndex | None = None,
        batch_size: int = 65_536,
        read_ahead: int = 1,
        queue_batches: int | None = None,
    ) -> None:
        if batch_size < 1:
            raise ValueError("batch_size must be at least 1")
        if read_ahead < 0:
            raise ValueError("read_ahead must not be negative")
        self.store = store or open_storage(url, threads=32)
        self.index = index or build_index(self.store)
        self.batch_size = batch_size
        self.read_ahead = read_ahead
        self.jobs = self._jobs()
        self._bytes = [0] * len(self.jobs)
        self.records = 0
        self._stop = threading.Event()
        self._queue = StoppableQueue(queue_batches or max(4, 2 * len(self.jobs)), self._stop)
        self._workers: list[threading.Thread] = []
        self._started = False

    @property
    def readers(self) -> int:
        return len(self.jobs)

    @property
    def bytes_read(self) -> int:
        """Bytes fetched from storage so far, by all reader threads."""
        return sum(self._bytes)

    def _jobs(self) -> list[tuple[list[SourceChunk], Callable[[pa.RecordBatch], pa.RecordBatch]]]:
        """Per reader thread: the chunks it reads, in order, and what it keeps of each."""
        raise NotImplementedError

    def _run(self, t: int, chunks: list[SourceChunk], keep: Callable[[pa.RecordBatch], pa.RecordBatch]) -> None:
        fetch = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"baseline-get-{t}") if self.read_ahead else None
        ahead: deque[Future[bytes]] = deque()
        nxt = 0
        try:
            for chunk in chunks:
                if self._stop.is_set():
                    return
                if fetch is not None:
                    while nxt < len(chunks) and len(ahead) <= self.read_ahead:
                        ahead.append(fetch.submit(self.store.read, chunks[nxt].key))
                        nxt += 1
                name = self.store.url_for(chunk.key)
                try:
                    data = ahead.popleft().result() if fetch is not None else self.store.read(chunk.key)
                    self._bytes[t] += len(data)
                    _, batch = envelope.decode_avro(data, name=name)
                    del data
                    batch = keep(batch)
                except BaseException as exc:
                    raise BaselineError(f"{name}: {exc}") from exc
                for start in range(0, batch.num_rows, self.batch_size):
                    self._put(batch.slice(start, self.batch_size))
            self._put(_DONE)
        except BaseException as exc:
            self._put(exc, force=True)
        finally:
            if fetch is not None:
                fetch.shutdown(wait=False, cancel_futures=True)

    def _put(self, item: object, force: bool = False) -> None:
        self._queue.put(item, force=force)

    def __iter__(self) -> Iterator[pa.RecordBatch]:
        if self._started:
            raise RuntimeError("a replay can be iterated once")
        self._started = True
        for t, (chunks, keep) in enumerate(self.jobs):
            w = threading.Thread(target=self._run, args=(t, chunks, keep), name=f"baseline-{t}", daemon=True)
            w.start()
            self._workers.append(w)
        running = len(self.jobs)
        while running:
            item = self._queue.get()
            if item is _DONE:
                running -= 1
            elif isinstance(item, BaseException):
                self.close()
                if isinstance(item, BaselineError):
                    raise item
                raise BaselineError(str(item)) from item
            else:
                self.records += item.num_rows
                yield item

    def close(self) -> None:
        """Stop all threads promptly; safe to call twice."""
        self._stop.set()
        self._queue.drain()
        for w in self._workers:
            w.join(timeout=5)

    def __enter__(self: _R) -> _R:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _keep_all(batch: pa.RecordBatch) -> pa.RecordBatch:
    return batch


class PerPartitionReplay(_BaselineReplay):
    """One reader per (topic, partition), its chunks in offset order: per-partition order,
    hence per-key order, for free, but no more parallelism than the topic has partitions."""

    def _jobs(self) -> list[tuple[list[SourceChunk], Callable[[pa.RecordBatch], pa.RecordBatch]]]:
        return [(self.index.chunks[k], _keep_all) for k in sorted(self.index.chunks)]


def time_ordered_chunks(index: ArchiveIndex) -> list[SourceChunk]:
    """All chunks, merged across partitions by their first timestamp so event time advances
    roughly together; each partition's chunks stay in offset order whatever their
    timestamps (a lazy merge only ever takes the head of a partition's list)."""
    lists = [index.chunks[k] for k in sorted(index.chunks)]
    return list(heapq.merge(*lists, key=lambda c: c.min_timestamp))


class ShardedReplay(_BaselineReplay):
    """N readers; reader i reads every chunk (time-merged, each partition in offset order)
    and keeps the records whose key routes to i. Routing is Flink's keyBy (a murmur hash of
    the key, then its key-group range; null keys by their partition), i.e. how a keyed job
    would shard; a key lives in one partition, so its order survives the filter."""

    def __init__(self, url: str, *, shards: int, **options: object) -> None:
        if shards < 1:
            raise ValueError("shards must be at least 1")
        self.shards = shards
        super().__init__(url, **options)

    def _jobs(self) -> list[tuple[list[SourceChunk], Callable[[pa.RecordBatch], pa.RecordBatch]]]:
        order = time_ordered_chunks(self.index)
        max_p = flink_default_max_parallelism(self.shards)

        def keeper(i: int) -> Callable[[pa.RecordBatch], pa.RecordBatch]:
            def keep(batch: pa.RecordBatch) -> pa.RecordBatch:
                if self.shards == 1:
                    return batch
                dest = consumer_indexes(batch, self.shards, max_p, key_type="bytes")
                return batch.filter(pa.array(dest == np.int32(i)))

            return keep

        return [(order, keeper(i)) for i in range(self.shards)]


class SeedPacedReplay(Replay):
    """The keyfill replay with the seed design's event-time control instead of a drift bound:
    after each decoded step a thread sleeps, longer for lighter groups (a batch of the
    heaviest group not at all, of an empty one `sleep_s`), hoping the heavy groups' threads
    keep up. The drift comparison's baseline; not part of the reader."""

    def __init__(self, url: str, *, sleep_s: float = 0.001, store=None, **options) -> None:
        super().__init__(url, store=store, options=ReplayOptions(**options))
        self._weights = self.plan.group_bytes
        self._heaviest = int(self._weights.max()) if len(self._weights) else 0
        self._sleep_s = sleep_s
        step_of = self._threads._step  # each thread's next decoded step, then the sleep

        def paced_step(fetcher, g):
            out = step_of(fetcher, g)
            if self._heaviest:
                time.sleep(len(out[0]) * self._sleep_s * (self._heaviest - int(self._weights[g])) / self._heaviest)
            return out

        self._threads._step = paced_step

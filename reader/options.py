"""The replay's options: one frozen value, checked once, so the threads can trust it."""

from __future__ import annotations

import os
from dataclasses import dataclass

from keygroups import bounds, layout
from keygroups.bounds import within
from keygroups.errors import OptionError


def default_threads() -> int:
    """Two reader threads a core, between 4 and 32. GETs in flight do not depend on it
    (`reader.fetch_pool.GET_THREADS`), so threads only decode, and past ~2 a core they contend
    for the CPU (measured: docs/performance.md#replay-threads-per-core)."""
    try:
        cores = len(os.sched_getaffinity(0))  # what a container or taskset grants, not the host
    except AttributeError:  # macOS and Windows
        cores = os.cpu_count() or 1
    return min(32, max(4, 2 * cores))


@dataclass(frozen=True)
class ReplayOptions:
    threads: int = default_threads()
    batch_size: int = 65_536  # records per emitted batch, at most
    watermark_bound_ms: int = 0  # B: the watermark after slice s is its end - B
    # Bytes fetched and not yet decoded plus decoded records not yet emitted, all threads
    # together (`reader.read_budget`); spans are read_ahead_bytes / (2 x groups), at most range_bytes.
    read_ahead_bytes: int = 2 << 30
    range_bytes: int = layout.GET_BYTES  # the largest GET; 0: a run in one GET, however long
    # decoded steps (one group's pieces, ~1 MiB read, a few MiB decoded) waiting for the consumer, shared among
    # the threads' FIFOs, at least one each (default: 2 x threads, at least 64)
    queue_batches: int | None = None
    max_drift_ms: int | None = None  # a thread ahead of the slowest active one by more than this pauses
    # a backfill bounded in time, as Spark's Kafka source means it (reader.time_bounds): per
    # partition from the first offset at or after this time (ms), up to the first at or after the end
    starting_timestamp: int | None = None
    ending_timestamp: int | None = None

    def __post_init__(self) -> None:
        within("threads", self.threads, 1, bounds.MAX_THREADS, "each is an OS thread with read-ahead of its own")
        within("batch_size", self.batch_size, 1, bounds.MAX_BATCH_ROWS)
        if self.max_drift_ms is not None and self.max_drift_ms < 0:
            raise OptionError(f"max_drift_ms={self.max_drift_ms}: must not be negative")
        if self.range_bytes < 0:
            raise OptionError(f"range_bytes={self.range_bytes}: must not be negative (0: one GET per file)")
        if self.read_ahead_bytes < 0:
            raise OptionError(f"read_ahead_bytes={self.read_ahead_bytes}: must not be negative")
        if self.watermark_bound_ms < 0:
            raise OptionError(
                f"watermark_bound_ms={self.watermark_bound_ms}: must not be negative: a watermark past a slice's "
                "end would declare the next slice's valid records late"
            )
        if self.queue_batches is not None and self.queue_batches < 1:
            raise OptionError(f"queue_batches={self.queue_batches}: must be at least 1")
        within("watermark_bound_ms", self.watermark_bound_ms, 0, bounds.MAX_DURATION_MS)
        if self.max_drift_ms is not None:
            within("max_drift_ms", self.max_drift_ms, 0, bounds.MAX_DURATION_MS)
        within("range_bytes", self.range_bytes, 0, bounds.MAX_RANGE_BYTES)
        within("read_ahead_bytes", self.read_ahead_bytes, 0, bounds.MAX_READ_AHEAD_BYTES)
        if self.queue_batches is not None:
            within("queue_batches", self.queue_batches, 1, 1 << 20)

    @property
    def queue_size(self) -> int:
        """At least 64: while the consumer cuts a round of steps into (slice, group) batches,
        threads with room for several steps each go on decoding, which ran faster up to 16
        steps a thread (docs/performance.md#decoded-steps-queued-for-the-consumer). A decoded
        step is 2-5 MB (8 MB when one piece is over a MiB read), so the queue holds ~300 MB at
        most, well under the read-ahead budget's default."""
        return self.queue_batches or max(64, 2 * self.threads)

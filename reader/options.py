"""The replay's options: one frozen value, checked once, so the threads can trust it."""

from __future__ import annotations

import os
from dataclasses import dataclass, field, fields
from typing import Any, TypeVar

from keygroups import bounds, layout
from keygroups.bounds import within

T = TypeVar("T")
MAX_COUNT = 1 << 62  # a whole-number option's bound where nothing smaller is meant


def bounded(default: T, low: int, high: int, why: str = "") -> T:
    """An option field and its limits, declared once: `check_bounds` holds a replay's options
    to them, the Spark source's parser (`reader.spark.options`) its option strings."""
    return field(default=default, metadata={"bounds": (low, high, why)})


def limits_of(options: type[Any], name: str) -> tuple[int, int, str]:
    """The (low, high, why) of a bounded field: how an option shared by two surfaces keeps one."""
    (f,) = (f for f in fields(options) if f.name == name)
    low, high, why = f.metadata["bounds"]
    return low, high, why


def check_bounds(options: Any) -> None:
    """OptionError for the first set field outside its declared limits."""
    for f in fields(options):
        value = getattr(options, f.name)
        if "bounds" in f.metadata and value is not None:
            within(f.name, value, *f.metadata["bounds"])


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
    threads: int = bounded(default_threads(), 1, bounds.MAX_THREADS, "each is an OS thread with read-ahead of its own")
    batch_size: int = bounded(65_536, 1, bounds.MAX_BATCH_ROWS)  # records per emitted batch, at most
    watermark_bound_ms: int = bounded(  # B: the watermark after slice s is its end - B
        0, 0, bounds.MAX_DURATION_MS, "a watermark past a slice's end would declare the next slice's valid records late"
    )
    # Bytes fetched and not yet decoded plus decoded records not yet emitted, all threads
    # together (`reader.read_budget`); spans are read_ahead_bytes / (2 x groups), at most range_bytes.
    read_ahead_bytes: int = bounded(2 << 30, 0, bounds.MAX_READ_AHEAD_BYTES)
    # the largest GET; 0: a span in one GET, however long
    range_bytes: int = bounded(layout.GET_BYTES, 0, bounds.MAX_RANGE_BYTES, "0: a span in one GET")
    # decoded steps (one group's pieces, ~1 MiB read, a few MiB decoded) waiting for the consumer, shared among
    # the threads' FIFOs, at least one each (default: 2 x threads, at least 64)
    queue_batches: int | None = bounded(None, 1, 1 << 20)
    # a thread ahead of the slowest active one by more than this pauses
    max_drift_ms: int | None = bounded(None, 0, bounds.MAX_DURATION_MS)
    # a backfill bounded in time, as Spark's Kafka source means it (reader.time_bounds): per
    # partition from the first offset at or after this time (ms), up to the first at or after the end
    starting_timestamp: int | None = bounded(None, -MAX_COUNT, MAX_COUNT)
    ending_timestamp: int | None = bounded(None, -MAX_COUNT, MAX_COUNT)

    def __post_init__(self) -> None:
        check_bounds(self)

    @property
    def queue_size(self) -> int:
        """At least 64: while the consumer cuts a round of steps into (slice, group) batches,
        threads with room for several steps each go on decoding, which ran faster up to 16
        steps a thread (docs/performance.md#decoded-steps-queued-for-the-consumer). A decoded
        step is 2-5 MB (8 MB when one piece is over a MiB read), so the queue holds ~300 MB at
        most, well under the read-ahead budget's default."""
        return self.queue_batches or max(64, 2 * self.threads)

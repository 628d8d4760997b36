"""Hypothesis strategies: topics as producers write them, and how keyfill backfills them.

`topic_archives()` draws what makes a backfill hard: hot keys beside a long tail, null
keys, event times out of order within a bounded jitter, records already late in their own
partition, idle partitions and stretches, headers. Keys go to partitions by Kafka's default
partitioner, so a key lives in one partition, as in a real topic.
"""

from __future__ import annotations

import contextlib
import functools
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TypeVar

from hypothesis import strategies as st

from keyfill.synth.kafka_partitioner import kafka_partition
from keyfill.synth.topic import LAYOUTS, Record, TopicArchive

START_MS = 1_767_225_600_000  # 2026-01-01T00:00:00Z
T = TypeVar("T")

# The strategies drawn once per record, made once: a strategy built inside the loop is
# validated and labelled again at every draw, a large share of a drawn topic's time
# (measured: docs/performance.md#test-strategies-built-once). Each is one choice, and its
# simplest value (what hypothesis' shrinker moves it to) is the plain case: no step, on
# time, no headers.
_STEP = st.sampled_from([0, 1, 100, 1_000, 1_000, 7_000, 600_000])  # 0 ms to a 10-minute idle stretch
_LATE_ROLL = st.integers(0, 24)  # 24: the record is late in its partition
_LATE_BY = st.integers(10_000, 120_000)
_HEADERS = st.sampled_from(
    [(), (), (), ()] + [(("trace", v),) for v in (None, b"", b"0", b"f00d")]
)  # half without headers, the other half's values from none to a few bytes


@contextlib.contextmanager
def untraced() -> Iterator[None]:
    """Pause hypothesis' line tracer. While it shrinks a failure, hypothesis traces every
    line a test runs (to name, afterwards, the lines only failing examples ran); drawing a
    topic and checking its backfill are most of those lines, tracing them made a search take
    about twice as long (docs/testing.md#how-long-a-search-takes), and lines of keyfill say
    nothing about the user's job, whose lines stay traced."""
    if hasattr(sys, "monitoring"):  # Python 3.12+: hypothesis registers a monitoring tool
        tool = next((i for i in range(6) if sys.monitoring.get_tool(i) == "scrutineer"), None)
        events = sys.monitoring.get_events(tool) if tool is not None else 0
        if events:
            sys.monitoring.set_events(tool, 0)
        try:
            yield
        finally:
            if events:
                sys.monitoring.set_events(tool, events)
        return
    trace = sys.gettrace()
    sys.settrace(None)
    try:
        yield
    finally:
        sys.settrace(trace)


_CHUNK = 8  # records drawn as one span: the shrinker tries dropping them all in one step


@st.composite
def _together(draw: st.DrawFn, body: Callable[[st.DrawFn], T]) -> T:
    """`body(draw)` as one span of choices: hypothesis' shrinker first tries each span at its
    simplest (every roll 0: the chunk's records dropped at once), so a failing topic loses
    its irrelevant records a chunk at a time, not one by one."""
    return body(draw)


@dataclass(frozen=True)
class BackfillSettings:
    """How one example compacts and replays: the compaction's groups, slice length and
    layout, the replay's threads, drift bound and batch size, the watermark bound (the
    job's out-of-orderness allowance), and after how many events it stops, checkpoints and
    resumes (each restart a new replay from the last checkpoint)."""

    layout: str = "envelope"
    groups: int = 3
    slice_duration: str = "10s"
    seal_all: bool = True  # publish the whole topic (False: only sealed slices, as a live topic's backfill)
    threads: int = 4
    batch_size: int = 1024
    max_drift_ms: int | None = None
    watermark_bound_ms: int = 0
    restarts: tuple[
        int, ...
    ] = ()  # events between checkpoints (a Spark query crashes once, after 1 + n % 3 micro-batches)
    slices_per_trigger: int | None = None  # the Spark source's maxSlicesPerTrigger (None: its default)
    interleaving: int = 0  # seeds the order `check_job` merges each slice's key groups in


@st.composite
def topic_archives(
    draw: st.DrawFn,
    *,
    partitions: st.SearchStrategy[int] = st.integers(1, 4),
    keys: st.SearchStrategy[int] = st.integers(1, 12),
    records: st.SearchStrategy[int] = st.integers(0, 120),
    values: st.SearchStrategy[bytes] | Callable[[bytes | None], st.SearchStrategy[bytes]] = st.binary(max_size=6),
    jitter_ms: st.SearchStrategy[int] = st.sampled_from([0, 500, 5_000]),
    null_keys: bool = True,
    headers: bool = True,
    topic: str = "events",
) -> TopicArchive:
    """Records of a topic (`records` of them drawn; while a failure shrinks, any but the
    first may be taken out). `values`: a strategy of value bytes, or a function of the key
    giving one (for jobs that parse values). Event time advances in steps (0 ms to a 10-minute
    idle stretch), each record drawn up to `jitter_ms` behind it, and now and then a record
    much later than that (late in its own partition for any small bound)."""
    with untraced():
        n_parts = draw(partitions)
        names = [b"hot"] + [b"k%d" % i for i in range(draw(keys))]
        hot = draw(st.integers(1, 20))  # the hot key's weight against 1 for each other key
        jitter = draw(jitter_ms)
        value_of = (lambda key: values) if isinstance(values, st.SearchStrategy) else values
        clock = [START_MS + draw(st.integers(0, 3)) * 60_000 for _ in range(n_parts)]  # partitions start apart
        idle = draw(st.sets(st.integers(0, n_parts - 1), max_size=n_parts - 1))  # partitions that go quiet early
        parts: list[list[Record]] = [[] for _ in range(n_parts)]
        # One roll picks the key: 0 drops the record (so the shrinker can take out any record,
        # not only the last ones: a failing topic shrinks in a few hundred runs, not thousands),
        # 1..hot the hot key, then one value per other key, then about 1 in 20 for a null key.
        keyed = hot + len(names) - 1
        nulls = -(-keyed // 19) if null_keys else 0
        roll_key, any_partition = st.integers(0, keyed + nulls), st.integers(0, n_parts - 1)
        first_key = st.integers(1, keyed + nulls)  # the first is never dropped: `records` at least 1 means 1
        behind_by = st.integers(0, jitter) if jitter else None
        partition_of = {key: kafka_partition(key, n_parts) for key in names}

        def record(draw: st.DrawFn, first: bool) -> None:
            roll = draw(first_key if first else roll_key)
            if roll == 0:
                return
            key = names[0] if roll <= hot else names[roll - hot] if roll <= keyed else None
            p = partition_of[key] if key is not None else draw(any_partition)
            if p in idle and len(parts[p]) >= 3:
                return  # the partition went quiet (its keys stay on it, as Kafka's partitioner keeps them)
            clock[p] += draw(_STEP)
            behind = draw(behind_by) if behind_by is not None else 0
            if draw(_LATE_ROLL) == 24:
                behind += draw(_LATE_BY)  # already late in its partition
            hdrs = draw(_HEADERS) if headers else ()
            parts[p].append(Record(p, len(parts[p]), max(0, clock[p] - behind), key, draw(value_of(key)), hdrs))

        n = draw(records)

        def records_from(draw: st.DrawFn, start: int) -> None:
            for i in range(start, min(n, start + _CHUNK)):
                record(draw, i == 0)

        for start in range(0, n, _CHUNK):
            draw(_together(functools.partial(records_from, start=start)))
        return TopicArchive(topic, tuple(tuple(ps) for ps in parts), draw(st.integers(5, 60)))


@st.composite
def backfill_settings(
    draw: st.DrawFn,
    *,
    layouts: tuple[str, ...] = LAYOUTS,
    watermark_bound_ms: st.SearchStrategy[int] = st.sampled_from([0, 2_000, 30_000]),
    seal_all: st.SearchStrategy[bool] = st.booleans(),
    slice_duration: st.SearchStrategy[str] = st.sampled_from(["1s", "10s", "1m", "10m"]),
) -> BackfillSettings:
    """How keyfill may compact and replay: any of these must give the same per-key outputs."""
    with untraced():
        return BackfillSettings(
            layout=draw(st.sampled_from(layouts)),
            groups=draw(st.integers(1, 9)),
            slice_duration=draw(slice_duration),
            seal_all=draw(seal_all),
            threads=draw(st.integers(1, 12)),
            batch_size=draw(st.integers(1, 64)),
            max_drift_ms=draw(st.sampled_from([None, 1_000])),
            watermark_bound_ms=draw(watermark_bound_ms),
            restarts=tuple(draw(st.lists(st.integers(1, 25), max_size=3))),
            slices_per_trigger=draw(st.sampled_from([None, 1, 2, 5])),
            interleaving=draw(st.integers(0, 2**32 - 1)),
        )

"""Hypothesis strategies: topics as producers write them, and how keyfill backfills them.

`topic_archives()` draws what makes a backfill hard: hot keys beside a long tail, null
keys, event times out of order within a bounded jitter, records already late in their own
partition, idle partitions and stretches, headers. Keys go to partitions by Kafka's default
partitioner, so a key lives in one partition, as in a real topic.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from hypothesis import strategies as st

from keyfill.synth.kafka_partitioner import kafka_partition
from keyfill.synth.topic import LAYOUTS, Record, TopicArchive

START_MS = 1_767_225_600_000  # 2026-01-01T00:00:00Z

# The strategies drawn once per record, made once: a strategy built inside the loop is
# validated and labelled again at every draw, a large share of a drawn topic's time
# (measured: docs/performance.md#test-strategies-built-once).
_STEP = st.sampled_from([0, 1, 100, 1_000, 1_000, 7_000, 600_000])  # 0 ms to a 10-minute idle stretch
_NULL_ROLL = st.integers(0, 19)
_LATE_ROLL = st.integers(0, 24)
_LATE_BY = st.integers(10_000, 120_000)
_TRACE = st.one_of(st.none(), st.text("abcdef0123", max_size=4).map(str.encode))


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


@st.composite
def topic_archives(
    draw,
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
    """Records of a topic. `values`: a strategy of value bytes, or a function of the key
    giving one (for jobs that parse values). Event time advances in steps (0 ms to a 10-minute
    idle stretch), each record drawn up to `jitter_ms` behind it, and now and then a record
    much later than that (late in its own partition for any small bound)."""
    n_parts = draw(partitions)
    names = [b"hot"] + [b"k%d" % i for i in range(draw(keys))]
    hot = draw(st.integers(1, 20))  # the hot key's weight against 1 for each other key
    jitter = draw(jitter_ms)
    value_of = (lambda key: values) if isinstance(values, st.SearchStrategy) else values
    clock = [START_MS + draw(st.integers(0, 3)) * 60_000 for _ in range(n_parts)]  # partitions start apart
    idle = draw(st.sets(st.integers(0, n_parts - 1), max_size=n_parts - 1))  # partitions that go quiet early
    parts: list[list[Record]] = [[] for _ in range(n_parts)]
    roll_key, any_partition = st.integers(0, hot + len(names) - 2), st.integers(0, n_parts - 1)
    behind_by = st.integers(0, jitter) if jitter else None
    partition_of = {key: kafka_partition(key, n_parts) for key in names}
    for _ in range(draw(records)):
        roll = draw(roll_key)
        key = names[0] if roll < hot else names[roll - hot + 1]
        if null_keys and draw(_NULL_ROLL) == 0:
            key = None
        p = partition_of[key] if key is not None else draw(any_partition)
        if p in idle and len(parts[p]) >= 3:
            continue  # the partition went quiet (its keys stay on it, as Kafka's partitioner keeps them)
        clock[p] += draw(_STEP)
        behind = draw(behind_by) if behind_by is not None else 0
        if draw(_LATE_ROLL) == 0:
            behind += draw(_LATE_BY)  # already late in its partition
        hdrs = ()
        if headers and draw(st.booleans()):
            hdrs = (("trace", draw(_TRACE)),)
        parts[p].append(Record(p, len(parts[p]), max(0, clock[p] - behind), key, draw(value_of(key)), hdrs))
    return TopicArchive(topic, tuple(tuple(ps) for ps in parts), draw(st.integers(5, 60)))


@st.composite
def backfill_settings(
    draw,
    *,
    layouts: tuple[str, ...] = LAYOUTS,
    watermark_bound_ms: st.SearchStrategy[int] = st.sampled_from([0, 2_000, 30_000]),
    seal_all: st.SearchStrategy[bool] = st.booleans(),
    slice_duration: st.SearchStrategy[str] = st.sampled_from(["1s", "10s", "1m", "10m"]),
) -> BackfillSettings:
    """How keyfill may compact and replay: any of these must give the same per-key outputs."""
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
    )

"""The live phase of `format("keyfill")`: the archive's topic, read from Kafka from the
archive's hand-off offsets on, so one streaming query backfills and then runs live.

Planning (end offsets, the data-loss check, ranges) runs on the driver; `read_range` runs
on the executors, one Kafka partition (or a piece of one, with `minPartitions`) per Spark
input partition, through confluent-kafka (librdkafka: a C client, no JVM jars, and the
throughput a Python loop over kafka-python does not reach; docs/kafka-live.md). The
records come out in the archive phase's schema, so the query sees one stream.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Generator
from contextlib import closing
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from keygroups.errors import KeyfillError
from reader.errors import DataLoss, KafkaReadError
from reader.spark.api import InputPartition
from reader.spark.rows import CREATE_TIME, HEADERS, LOG_APPEND_TIME, NO_TIMESTAMP_TYPE, TIMESTAMP, arrow_schema

LOG = logging.getLogger("keyfill.kafka")  # the client's own log lines (a retry each 50 ms when down): not on stderr
KAFKA_PREFIX = "kafka."  # options passed to the client with this prefix taken off
_ALWAYS = {  # the reader's own settings: it assigns partitions and never commits to a group
    "enable.auto.commit": False,
    "enable.auto.offset.store": False,
    "auto.offset.reset": "error",  # an offset past retention fails instead of skipping silently
    "enable.partition.eof": True,  # how a read learns it reached the end of what exists
}


# keys, partitions -> the key group of each record (`KeyAssignment.group_of`)
GroupOf = Callable[[pa.Array, np.ndarray], np.ndarray]


def client_module() -> Any:
    try:
        import confluent_kafka
    except ImportError:
        raise KeyfillError(
            "the keyfill source's kafka.* options need confluent-kafka on the driver and the executors: "
            "pip install 'keyfill[kafka]'"
        ) from None
    return confluent_kafka


@dataclass(frozen=True)
class KafkaOptions:
    """The live phase's settings, from the source's options."""

    client: dict[str, str]  # librdkafka settings (bootstrap.servers, security.protocol, ...)
    topic: str | None = None  # None: the archive's own topic
    min_partitions: int | None = None
    fail_on_data_loss: bool = True
    poll_timeout_ms: int = 120_000

    def config(self, **extra: Any) -> dict[str, Any]:
        return {"group.id": "keyfill-live", **self.client, **_ALWAYS, **extra}


@dataclass(frozen=True)
class KafkaRange(InputPartition):
    """Offsets [start, end) of one partition of a topic, read by one Spark task."""

    topic: str
    partition: int
    start: int
    end: int
    assignment: str = ""  # the archive's assignment file: the key group of each record


def partition_marks(options: KafkaOptions, topic: str) -> dict[int, tuple[int, int]]:
    """Every partition of the topic with its (earliest, end) offsets as the broker reports
    them now: the metadata and the offsets through one consumer (a planning step needs both)."""
    ck = client_module()
    consumer = ck.Consumer(options.config(), logger=LOG)
    deadline = time.monotonic() + options.poll_timeout_ms / 1000  # for all the requests together

    def left() -> float:
        return max(0.1, deadline - time.monotonic())

    try:
        meta = consumer.list_topics(topic, timeout=left()).topics.get(topic)
        if meta is None or meta.error is not None or not meta.partitions:
            raise KafkaReadError(f"topic {topic} is not on {options.client.get('bootstrap.servers')}")
        return {
            p: consumer.get_watermark_offsets(ck.TopicPartition(topic, p), timeout=left())
            for p in sorted(meta.partitions)
        }
    except ck.KafkaException as exc:
        raise KafkaReadError(
            f"{options.client.get('bootstrap.servers')}: topic {topic}: could not list partitions and offsets within "
            f"{options.poll_timeout_ms} ms (kafkaConsumer.pollTimeoutMs): {exc.args[0].str() if exc.args else exc}"
        ) from None
    finally:
        consumer.close()


def offsets_at_times(
    options: KafkaOptions, topic: str, times: dict[int, int], starts: dict[int, int], ends: dict[int, int]
) -> dict[int, int | None]:
    """Per partition, its first offset in [start, end) whose timestamp is at or after its time
    (None: none there), as Spark's Kafka source resolves startingTimestamp. Read from the
    records rather than asked of the broker (`offsets_for_times`): brokers that speak Kafka's
    protocol do not all answer it right (tansu 0.6 answers 0 for every time), and the part read
    is the topic's tail past the archive's hand-off, which is short."""
    found: dict[int, int | None] = {}
    schema = arrow_schema(False, ("offset", "timestamp"))
    for p, t in sorted(times.items()):
        found[p] = None
        if starts.get(p, 0) >= ends.get(p, 0):
            continue
        with closing(read_range(options, KafkaRange(topic, p, starts.get(p, 0), ends[p]), 10_000, schema)) as batches:
            for batch in batches:
                hit = np.flatnonzero(batch.column("timestamp").cast(pa.int64()).to_numpy() >= t * 1000)
                if len(hit):
                    found[p] = int(batch.column("offset")[int(hit[0])].as_py())
                    break
    return found


def check_available(
    topic: str, wanted: dict[int, int], marks: dict[int, tuple[int, int]], fail: bool
) -> dict[int, int]:
    """The offsets to read from: `wanted`, unless retention has passed one of them (the topic
    starts later: DataLoss, or with `fail` False the topic's earliest) or the topic ends
    before one (recreated, or another topic: always DataLoss, nothing to read could be right)."""
    out = dict(wanted)
    for p, start in sorted(wanted.items()):
        if p not in marks:
            raise DataLoss(
                f"{topic}[{p}]: the archive hands over at offset {start}, but the topic has no partition {p} "
                "(was the topic recreated, or is this another cluster's topic?)"
            )
        low, high = marks[p]
        if high < start:
            raise DataLoss(
                f"{topic}[{p}]: the archive hands over at offset {start}, but the partition ends at {high} "
                "(was the topic recreated, or is this another cluster's topic?)"
            )
        if low > start:
            if fail:
                raise DataLoss(
                    f"{topic}[{p}]: offsets {start} to {low - 1} are gone (the partition now starts at {low}; "
                    "retention passed them). Set failOnDataLoss=false to go on from the earliest offset."
                )
            out[p] = low
    return out


def cap_ends(start: dict[int, int], latest: dict[int, int], limit: int | None) -> dict[int, int]:
    """End offsets of the next trigger: `latest`, or at most `limit` records in all, split over
    the partitions in proportion to what each has waiting (largest remainders)."""
    lag = {p: max(0, latest[p] - start[p]) for p in start}
    total = sum(lag.values())
    if limit is None or total <= limit:
        return {p: start[p] + lag[p] for p in start}
    parts = sorted(lag)
    share = np.array([lag[p] for p in parts], np.float64) * limit / total
    take = np.floor(share).astype(np.int64)
    for i in np.argsort(-(share - take), kind="stable")[: limit - int(take.sum())]:
        take[i] += 1
    return {p: start[p] + int(n) for p, n in zip(parts, take.tolist())}


def plan_ranges(
    topic: str, start: dict[int, int], end: dict[int, int], min_partitions: int | None, assignment: str
) -> list[KafkaRange]:
    """One range per partition with records; with `min_partitions`, the largest are split at
    offsets until there are that many (a key's records in one partition may then be read by
    two tasks of one micro-batch: order across them is not kept, docs/kafka-live.md)."""
    ranges = [(p, start[p], end[p]) for p in sorted(end) if end[p] > start[p]]
    if min_partitions:
        while 0 < len(ranges) < min_partitions:
            i = max(range(len(ranges)), key=lambda j: ranges[j][2] - ranges[j][1])
            p, a, b = ranges[i]
            if b - a < 2:
                break
            mid = a + (b - a) // 2
            ranges[i : i + 1] = [(p, a, mid), (p, mid, b)]
    return [KafkaRange(topic, p, a, b, assignment) for p, a, b in ranges]


def read_range(
    options: KafkaOptions, r: KafkaRange, batch_rows: int, schema: pa.Schema, group_of: GroupOf | None = None
) -> Generator[pa.RecordBatch, None, None]:
    """The records of `r` in offset order, as batches of `schema` (the Spark source's), with
    slice null and key_group from `group_of(keys, partitions)` (None: null)."""
    ck = client_module()
    consumer = ck.Consumer(options.config(), logger=LOG)
    where = f"{options.client.get('bootstrap.servers')}: {r.topic}[{r.partition}] offsets {r.start} to {r.end - 1}"
    try:
        consumer.assign([ck.TopicPartition(r.topic, r.partition, r.start)])
        rows, position = [], r.start  # messages of the batch being filled
        deadline = time.monotonic() + options.poll_timeout_ms / 1000
        while position < r.end:
            # consume() waits until it has num_messages or the timeout passes: ask for no more
            # than the range still holds, and wait briefly (an offset gap ends in an EOF event)
            messages = consumer.consume(num_messages=max(1, min(batch_rows, r.end - position, 10_000)), timeout=0.2)
            if not messages and time.monotonic() > deadline:
                raise KafkaReadError(
                    f"{where}: nothing past offset {position} within {options.poll_timeout_ms} ms "
                    "(kafkaConsumer.pollTimeoutMs)"
                )
            for m in messages:
                err = m.error()
                if err is not None:
                    if err.code() == ck.KafkaError._PARTITION_EOF:
                        position = max(position, m.offset())  # the end: offsets up to it are settled
                        continue
                    if err.code() in (ck.KafkaError._AUTO_OFFSET_RESET, ck.KafkaError.OFFSET_OUT_OF_RANGE):
                        raise DataLoss(f"{where}: offset {position} is out of the partition's range ({err.str()})")
                    raise KafkaReadError(f"{where}: {err.str()}")
                if m.offset() >= r.end:
                    position = r.end
                    break
                rows.append(m)
                position = m.offset() + 1
            if messages:
                deadline = time.monotonic() + options.poll_timeout_ms / 1000
            if len(rows) >= batch_rows or (position >= r.end and len(rows)):
                yield _batch(rows, r.topic, r.partition, schema, group_of)
                rows = []
    finally:
        consumer.close()


def _batch(
    messages: list[Any], topic: str, partition: int, schema: pa.Schema, group_of: GroupOf | None
) -> pa.RecordBatch:
    """Messages as a batch of the source's schema (`reader.spark.rows`), or the columns of a
    query's: a column at a time (a comprehension per field costs less than appending each
    record's fields in turn)."""
    n = len(messages)
    keys = pa.array([m.key() for m in messages], pa.binary())
    parts = np.full(n, partition, np.int32)
    stamps = [m.timestamp() for m in messages]
    ck = client_module()
    kinds = {ck.TIMESTAMP_CREATE_TIME: CREATE_TIME, ck.TIMESTAMP_LOG_APPEND_TIME: LOG_APPEND_TIME}

    def groups() -> pa.Array:
        if group_of is None:
            return pa.nulls(n, pa.int32())
        found = group_of(keys, parts)
        return pa.array(found, pa.int32(), mask=found < 0)

    def headers() -> pa.Array:  # no headers: an empty list, as the archive has them
        return pa.array([[{"key": k, "value": v} for k, v in m.headers() or ()] for m in messages], HEADERS)

    make: dict[str, Callable[[], pa.Array]] = {  # a column is built only when the schema has it
        "key": lambda: keys,
        "value": lambda: pa.array([m.value() for m in messages], pa.binary()),
        "topic": lambda: pa.repeat(pa.scalar(topic, pa.string()), n),
        "partition": lambda: pa.array(parts),
        "offset": lambda: pa.array([m.offset() for m in messages], pa.int64()),
        "timestamp": lambda: pa.array(np.array([t for _, t in stamps], np.int64) * 1000, TIMESTAMP),
        "timestampType": lambda: pa.array([kinds.get(k, NO_TIMESTAMP_TYPE) for k, _ in stamps], pa.int32()),
        "headers": headers,
        "key_group": groups,
        "slice": lambda: pa.nulls(n, pa.int32()),
    }
    return pa.RecordBatch.from_arrays([make[name]() for name in schema.names], schema=schema)

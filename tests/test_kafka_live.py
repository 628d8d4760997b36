"""From the archive to the live topic in one query (`format("keyfill")` with kafka.* options),
against a real broker (tansu, started by `keyfill_kafka` on 127.0.0.1): the topic's records
each once, every key in offset order across the switch, no trigger with both phases, and
restarts from a checkpoint before, at and after the switch (docs/kafka-live.md)."""

from __future__ import annotations

import itertools
import json
import os
import time
import uuid
from collections import Counter
from pathlib import Path

import pytest
from hypothesis import HealthCheck, event, example, given, settings
from hypothesis import strategies as st
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows

from compactor.errors import NothingSealed
from compactor.job import CompactConfig, compact
from keyfill.synth.topic import Record, TopicArchive, write_archive
from keyfill.testing.strategies import topic_archives
from keygroups import compacted, handoff
from keygroups.storage import open_storage
from reader.errors import DataLoss
from reader.kafka_live import KafkaOptions, cap_ends, check_available, partition_marks, plan_ranges, read_range
from reader.spark import DataSourceOptionError, KeyfillBatchReader, KeyfillStreamReader, Options
from reader.spark.rows import CREATE_TIME, arrow_schema
from tests.connect_client import CONNECT


def produce(broker, topic: TopicArchive) -> str:
    """The topic's records on the broker, under a fresh name, at the offsets they carry."""
    name = f"{topic.topic}-{uuid.uuid4().hex[:8]}"
    broker.create_topic(name, len(topic.partitions))
    producer = broker.producer()
    for part in topic.partitions:
        for r in part:
            producer.produce(
                name, key=r.key, value=r.value, partition=r.partition, timestamp=r.timestamp, headers=list(r.headers)
            )
    assert producer.flush(30) == 0
    return name


def archived(topic: TopicArchive, cut: list[float], root, **compaction) -> str:
    """A compacted archive of the first `cut` share of each partition."""
    prefix = TopicArchive(
        topic.topic, tuple(part[: int(len(part) * c)] for part, c in zip(topic.partitions, cut)), topic.chunk_records
    )
    src, dest = str(root / "src"), str(root / "compacted")
    try:
        compact(CompactConfig(**write_archive(prefix, src), dest=dest, **compaction))
    except NothingSealed:  # too little for a sealed slice: all of it then
        compact(CompactConfig(source=src, source_format="envelope", dest=dest, **(compaction | {"seal_all": True})))
    return dest


def as_records(rows: list[dict]) -> list[Record]:
    return [
        Record(
            r["partition"],
            r["offset"],
            round(r["timestamp"].timestamp() * 1000),
            r["key"],
            r["value"],
            tuple((h["key"], h["value"]) for h in r["headers"]),
        )
        for r in rows
    ]


def run_stream(opts: dict, restarts: set[int], limit=None) -> list[tuple[str, list[dict]]]:
    """Spark's micro-batch loop over the source, driven by hand: offsets pass through JSON
    as the checkpoint keeps them; at a batch number in `restarts` the reader is dropped after
    planning (the batch in flight is lost) and a new one plans the same offsets again, as a
    restarted query does. Returns each batch's phase and rows."""
    opts = {"includeHeaders": "true", **opts}  # as_records compares headers
    reader = KeyfillStreamReader(Options.parse(opts))
    start = reader.initialOffset()
    batches = []
    for n in itertools.count():
        assert n < 500, "the stream does not end"
        end = json.loads(json.dumps(reader.latestOffset(start, limit or reader.getDefaultReadLimit())))
        if end == start:
            return batches
        parts = reader.partitions(start, end)
        if n in restarts:
            reader = KeyfillStreamReader(Options.parse(opts))  # from the checkpoint: the same start and end
            parts = reader.partitions(start, end)
        rows = [row for p in parts for b in reader.read(p) for row in b.to_pylist()]
        phases = {"live" if r["slice"] is None else "archive" for r in rows}
        assert len(phases) <= 1, f"batch {n} mixes the archive and the topic"
        batches.append((phases.pop() if phases else "empty", rows))
        start = end


@st.composite
def hand_overs(draw):
    topic = draw(topic_archives(partitions=st.integers(1, 3), records=st.integers(1, 80)))
    cut = [draw(st.sampled_from([0.0, 0.3, 0.7, 1.0])) for _ in topic.partitions]
    if not any(int(len(part) * c) for part, c in zip(topic.partitions, cut)):  # an archive holds a record
        cut[max(range(len(cut)), key=lambda p: len(topic.partitions[p]))] = 1.0
    return topic, cut


def planned_phases(opts: dict) -> list[str]:
    """The phase ("archive" or "live") of each batch a stream over `opts` plans, by planning
    alone (nothing read): where the switch is."""
    reader = KeyfillStreamReader(Options.parse(opts))
    start, phases = reader.initialOffset(), []
    while len(phases) < 500:
        end = json.loads(json.dumps(reader.latestOffset(start, reader.getDefaultReadLimit())))
        if end == start:
            return phases
        phases.append("live" if "kafka" in end else "archive")
        start = end
    raise AssertionError("the stream does not end")


def restart_batch(where: str, n: int, phases: list[str]) -> int | None:
    """The batch number of a restart drawn relative to the switch, the first live batch (the
    trigger planned from the archive's end): "at" it, `n` batches before the last archive
    batch, or `n` after the switch's batch (counted around the batches there are). None past
    the end (a topic with nothing past the hand-off, a single live batch): the stream ends."""
    switch = phases.index("live") if "live" in phases else len(phases)
    assert switch >= 1  # the archive holds a record: the stream begins there
    if where == "before":
        return switch - 1 - n % switch
    if where == "at":
        return switch if switch < len(phases) else None
    after = len(phases) - switch - 1
    return switch + 1 + n % after if after > 0 else None


# Two partitions, part archived and part live each (a key in one partition, as Kafka puts it):
# the explicit examples below restart at the switch, always.
AT_THE_SWITCH = TopicArchive(
    "events",
    tuple(
        tuple(Record(p, i, 2_500 * i + 300 * p, b"%d-%d" % (p, i % 3), b"v%d" % i) for i in range(12)) for p in range(2)
    ),
    5,
)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    case=hand_overs(),
    seal_all=st.booleans(),
    slices=st.sampled_from([1, 3]),
    per_trigger=st.sampled_from([None, 7, 40]),
    # restarts where the switch is (and "at" first: the simplest example restarts there)
    restarts=st.lists(st.tuples(st.sampled_from(["at", "before", "after"]), st.integers(0, 6)), min_size=1, max_size=3),
)
@example(case=(AT_THE_SWITCH, [0.5, 0.3]), seal_all=True, slices=1, per_trigger=None, restarts=[("at", 0)])
@example(case=(AT_THE_SWITCH, [0.5, 0.3]), seal_all=False, slices=3, per_trigger=7, restarts=[("at", 0)])
def test_the_archive_then_the_topic_each_record_once_in_key_order(
    keyfill_kafka, tmp_path_factory, case, seal_all, slices, per_trigger, restarts
):
    topic, cut = case
    name = produce(keyfill_kafka, topic)
    dest = archived(topic, cut, tmp_path_factory.mktemp("a"), groups=3, slice_duration="10s", seal_all=seal_all)
    opts = {"path": dest, "kafka.bootstrap.servers": keyfill_kafka.bootstrap, "subscribe": name}
    opts["maxSlicesPerTrigger"] = str(slices)
    if per_trigger:
        opts["maxOffsetsPerTrigger"] = str(per_trigger)
    phases = planned_phases(opts)
    at = set()
    for where, n in restarts:
        batch = restart_batch(where, n, phases)
        event(f"a restart {where} the switch" + (" (past the end: none)" if batch is None else ""))
        at |= {batch} - {None}
    batches = run_stream(opts, at)
    assert [phase for phase, _ in batches] == phases  # as planned: a restart plans the same batches

    got = [r for _, rows in batches for r in as_records(rows)]
    assert sorted(got) == sorted(topic.records)  # each record once, as the topic holds it
    assert phases == sorted(phases)  # every archive batch before the first live one ("archive" < "live")
    handed = handoff.offsets(compacted.load_manifest(open_storage(dest)))
    for phase, rows in batches:
        for r in rows:  # the archive below the hand-off, the topic from it on
            assert (r["offset"] < handed.get(r["partition"], 0)) == (phase == "archive")
        if phase == "live" and per_trigger:
            assert len(rows) <= per_trigger
    by_key: dict = {}
    for r in got:  # a key's records in offset order: within a batch its rows come from one input partition
        by_key.setdefault((r.key, r.partition if r.key is None else None), []).append(r.offset)
    assert all(offsets == sorted(offsets) for offsets in by_key.values())


def test_the_live_phase_reads_what_a_plain_consumer_reads(keyfill_kafka, tmp_path):
    """The broker as the tests rely on it (docs/kafka-live.md): with one record per batch,
    end offsets are exact, and records come back with their offsets, times, keys, values
    and headers."""
    parts = tuple(
        tuple(
            Record(p, i, 1_000 + 7 * i, b"k%d" % (i % 3) if i % 5 else None, b"v%d" % i, (("h", b"x"),))
            for i in range(n)
        )
        for p, n in enumerate([0, 9, 31])
    )
    topic = TopicArchive("t", parts)
    name = produce(keyfill_kafka, topic)
    k = KafkaOptions({"bootstrap.servers": keyfill_kafka.bootstrap})
    assert partition_marks(k, name) == {0: (0, 0), 1: (0, 9), 2: (0, 31)}
    from reader.kafka_live import KafkaRange

    rows = [r for b in read_range(k, KafkaRange(name, 2, 4, 20), 5, arrow_schema(True)) for r in b.to_pylist()]
    assert as_records(rows) == list(parts[2][4:20])
    assert {(r["topic"], r["timestampType"]) for r in rows} == {(name, CREATE_TIME)}
    plain = [b for b in read_range(k, KafkaRange(name, 2, 4, 20), 5, arrow_schema(False))]
    assert "headers" not in plain[0].schema.names and sum(b.num_rows for b in plain) == 16
    asked = ("value", "offset", "headers")  # a query's schema: those columns, in its order
    few = [r for b in read_range(k, KafkaRange(name, 2, 4, 20), 5, arrow_schema(False, asked)) for r in b.to_pylist()]
    assert few == [{c: r[c] for c in asked} for r in rows]


def test_retention_past_the_hand_off_fails_naming_partition_and_offsets():
    """tansu cannot delete records (no DeleteRecords, no retention), so the check itself:
    offsets the query needs that the topic no longer holds."""
    marks = {0: (0, 100), 1: (40, 90)}
    with pytest.raises(DataLoss, match=r"events\[1\]: offsets 25 to 39 are gone"):
        check_available("events", {0: 10, 1: 25}, marks, fail=True)
    assert check_available("events", {0: 10, 1: 25}, marks, fail=False) == {0: 10, 1: 40}
    with pytest.raises(DataLoss, match=r"events\[0\]: the archive hands over at offset 120, but the partition ends"):
        check_available("events", {0: 120, 1: 50}, marks, fail=False)
    with pytest.raises(DataLoss, match=r"events\[2\]: the archive hands over at offset 5, but the topic has no"):
        check_available("events", {0: 10, 2: 5}, marks, fail=False)


def test_a_topic_that_ends_before_the_hand_off_fails_the_query(keyfill_kafka, tmp_path):
    parts = tuple(tuple(Record(p, i, 1_000 * i, b"k", b"v") for i in range(20)) for p in range(2))
    topic = TopicArchive("t", parts, 5)
    dest = archived(topic, [1.0, 1.0], tmp_path, groups=2, slice_duration="5s", seal_all=True)
    shorter = produce(keyfill_kafka, TopicArchive("t", tuple(p[:10] for p in parts)))  # recreated, say
    reader = KeyfillStreamReader(
        Options.parse({"path": dest, "kafka.bootstrap.servers": keyfill_kafka.bootstrap, "subscribe": shorter})
    )
    start = reader.initialOffset()
    start = reader.latestOffset(start, ReadAllAvailable())  # the whole archive
    with pytest.raises(
        DataLoss, match=rf"{shorter}\[0\]: the archive hands over at offset 20, but the partition ends at 10"
    ):
        reader.latestOffset(start, ReadAllAvailable())


def test_a_batch_read_is_the_archive_then_the_topic(keyfill_kafka, tmp_path):
    parts = tuple(tuple(Record(p, i, 1_000 * i, b"k%d" % (i % 4), b"v%d" % i) for i in range(30)) for p in range(2))
    topic = TopicArchive("t", parts, 7)
    name = produce(keyfill_kafka, topic)
    dest = archived(topic, [0.5, 0.8], tmp_path, groups=2, slice_duration="5s", seal_all=True)
    reader = KeyfillBatchReader(
        Options.parse(
            {
                "path": dest,
                "kafka.bootstrap.servers": keyfill_kafka.bootstrap,
                "subscribe": name,
                "includeHeaders": "true",
            }
        )
    )
    rows = [r for p in reader.partitions() for b in reader.read(p) for r in b.to_pylist()]
    assert sorted(as_records(rows)) == sorted(topic.records)
    # the Kafka source's topic column: the archive's topic, then the one subscribed to
    assert {(r["slice"] is None, r["topic"]) for r in rows} == {(False, "t"), (True, name)}
    # a query's schema of two columns: the same rows, archive and topic, only those columns
    few = KeyfillBatchReader(reader.opts.with_schema([("offset", "bigint", True), ("slice", "int", True)]))
    got = [r for p in few.partitions() for b in few.read(p) for r in b.to_pylist()]
    assert sorted(got, key=str) == sorted(({"offset": r["offset"], "slice": r["slice"]} for r in rows), key=str)


def test_admission_splits_a_trigger_over_partitions_by_what_each_has_waiting():
    assert cap_ends({0: 0, 1: 10}, {0: 100, 1: 20}, None) == {0: 100, 1: 20}
    end = cap_ends({0: 0, 1: 10}, {0: 100, 1: 20}, 22)
    assert sum(end[p] - s for p, s in {0: 0, 1: 10}.items()) == 22 and end == {0: 20, 1: 12}
    assert cap_ends({0: 5}, {0: 5}, 3) == {0: 5}


def test_min_partitions_splits_the_largest_ranges():
    ranges = plan_ranges("t", {0: 0, 1: 0}, {0: 100, 1: 10}, 4, "")
    assert [(r.partition, r.start, r.end) for r in ranges] == [(0, 0, 25), (0, 25, 50), (0, 50, 100), (1, 0, 10)]


def test_live_options_are_checked():
    with pytest.raises(DataSourceOptionError, match="minPartitions is for the live phase"):
        Options.parse({"path": "x", "minPartitions": "10"})
    assert Options.parse({"path": "x", "maxOffsetsPerTrigger": "10"}).max_offsets_per_trigger == 10  # archive too
    with pytest.raises(DataSourceOptionError, match="failOnDataLoss='maybe'"):
        Options.parse({"path": "x", "kafka.bootstrap.servers": "h:1", "failOnDataLoss": "maybe"})
    with pytest.raises(DataSourceOptionError, match="needs kafka.bootstrap.servers"):
        Options.parse({"path": "x", "kafka.security.protocol": "SSL"})
    opts = Options.parse({"path": "x", "kafka.bootstrap.servers": "h:1", "kafka.client.id": "me", "minPartitions": "4"})
    assert opts.kafka.client == {"bootstrap.servers": "h:1", "client.id": "me"} and opts.kafka.min_partitions == 4


def test_a_row_limit_caps_the_live_phase(keyfill_kafka, tmp_path):
    parts = (tuple(Record(0, i, 1_000 * i, b"k", b"v") for i in range(50)),)
    topic = TopicArchive("t", parts, 10)
    name = produce(keyfill_kafka, topic)
    dest = archived(topic, [0.4], tmp_path, groups=1, slice_duration="5s", seal_all=True)
    opts = {"path": dest, "kafka.bootstrap.servers": keyfill_kafka.bootstrap, "subscribe": name}
    batches = run_stream(opts, set(), ReadMaxRows(8))
    live = [len(rows) for phase, rows in batches if phase == "live"]
    assert live == [8, 8, 8, 6]


class Crash(RuntimeError):
    pass


def test_a_windowed_query_keeps_its_state_across_the_switch_and_restarts(spark, keyfill_kafka, tmp_path):
    """One stateful query over the archive, then the topic: its windowed counts equal a batch
    count over the whole topic, though it crashes (and restarts from its checkpoint) in the
    archive phase, in the first live batch and in a later one."""
    import random

    from pyspark.sql import functions as F

    import reader.spark

    reader.spark.register(spark)
    rng = random.Random(3)
    parts = []
    for p in range(3):
        clock = 1_700_000_000_000 + p * 500
        rows = []
        for i in range(160):
            clock += rng.randrange(0, 800)
            ts = clock - rng.randrange(0, 2_000)  # up to 2 s behind its partition's clock
            rows.append(Record(p, i, ts, b"k%d" % rng.randrange(6), b"v", ()))
        parts.append(tuple(rows))
    topic = TopicArchive("pay", tuple(parts), 20)
    name = produce(keyfill_kafka, topic)
    dest = archived(topic, [0.5, 0.6, 0.4], tmp_path, groups=3, slice_duration="10s")
    ck = str(tmp_path / "ck")
    final: dict = {}
    crash_at = {1, 3, 5}

    def keep(batch, batch_id):
        rows = batch.collect()
        if batch_id in crash_at:
            crash_at.discard(batch_id)
            raise Crash(f"crash in batch {batch_id}")
        for r in rows:
            final[(int(r["window"]["start"].timestamp() * 1000), r["key"])] = r["count"]

    starts = 0
    while True:
        starts += 1
        query = (
            spark.readStream.format("keyfill")
            .option("kafka.bootstrap.servers", keyfill_kafka.bootstrap)
            .option("subscribe", name)
            .option("maxSlicesPerTrigger", "1")
            .option("maxOffsetsPerTrigger", "60")
            .load(dest)
            .withWatermark("timestamp", "15 seconds")  # a slice and the topic's 2 s of disorder
            .groupBy(F.window("timestamp", "20 seconds"), "key")
            .count()
            .writeStream.outputMode("update")
            .foreachBatch(keep)
            .option("checkpointLocation", ck)
            .trigger(availableNow=True)
            .start()
        )
        try:
            query.awaitTermination()
            break
        except Exception as exc:
            assert "crash in batch" in str(exc), exc
            assert starts < 5
    assert starts == 4 and not crash_at
    phases = []
    for n in sorted(int(f) for f in os.listdir(os.path.join(ck, "offsets")) if f.isdigit()):
        with open(os.path.join(ck, "offsets", str(n))) as f:
            phases.append("live" if "kafka" in f.read().splitlines()[-1] else "archive")
    assert phases[1] == "archive" and phases[3] == "live" and phases[2] == "archive" and phases[5] == "live"
    expected = Counter(((r.timestamp - r.timestamp % 20_000), r.key) for r in topic.records)
    assert final == dict(expected)


def test_the_fraud_example_goes_on_live_in_one_query(spark, keyfill_kafka, tmp_path):
    """jobs/fraud_backfill.py --kafka --until-now: the archive of the first part of a payments
    topic, then the topic: every window equal to a count over the whole topic."""
    import argparse

    from jobs.fraud_backfill import job, parse_args
    from keyfill.synth.generate import GeneratorConfig, generate
    from tests.test_reader import source_table
    from tests.test_spark_source import assert_closed_windows

    src = str(tmp_path / "generated")
    generate(
        GeneratorConfig(out=src, records=6_000, keys=50, partitions=2, chunk_records=1_000, rate=50.0, seed=2),
        progress=False,
    )
    table = source_table(src).sort_by([("partition", "ascending"), ("offset", "ascending")])
    records = as_records(table.to_pylist())  # the generator's records, as the topic will hold them
    topic = TopicArchive("payments", tuple(tuple(r for r in records if r.partition == p) for p in range(2)), 500)
    name = produce(keyfill_kafka, topic)
    dest = archived(topic, [0.6, 0.5], tmp_path, groups=4, slice_duration="30s")
    args = parse_args(
        [dest, "--out", str(tmp_path / "fraud"), "--kafka", keyfill_kafka.bootstrap, "--topic", name]
        + ["--until-now", "--max-offsets-per-trigger", "1000", "--max-slices-per-trigger", "4"]
    )
    assert isinstance(args, argparse.Namespace)
    result = job(spark, args)
    assert result["records"] == len(records) and result["dropped_late"] == 0
    assert_closed_windows(spark, result["windows_dir"], table, minimum=50)


KAFKA_QUERY = """
    SELECT CAST(key AS STRING) AS user, topic, partition, offset, timestamp, timestampType, headers
    FROM events WHERE timestampType = 0
"""


def test_a_query_for_the_kafka_source_runs_unchanged_from_a_time_into_the_topic(spark, keyfill_kafka, tmp_path):
    """A query written for format("kafka") (its option map, its columns, includeHeaders and
    startingTimestamp), with only the format and the path changed: from the first offset at or
    after the time in each partition, over the archive and on into the topic. Partition 1's
    archived records all fall before the time: it starts in the topic, where the broker says."""
    import reader.spark

    reader.spark.register(spark)
    kafka_query_from_a_time(spark, *topic_from_a_time(keyfill_kafka, str(tmp_path)))


@CONNECT
def test_a_kafka_query_from_a_time_into_the_topic_over_spark_connect(connect, keyfill_kafka, tmp_path):
    """The same query from a Spark Connect client: the live phase reads the broker from the
    server's executors."""
    connect.run(kafka_query_from_a_time, *topic_from_a_time(keyfill_kafka, str(tmp_path)))


def topic_from_a_time(broker, work: str) -> tuple:
    """The topic of the query above, produced and part archived: (its records by partition,
    the topic's name, the archive, the hand-off, the time, the broker, a scratch folder)."""
    parts = tuple(
        tuple(
            Record(p, i, 1_000_000 + 1_000 * i + (700 if p else 0), b"u%d" % (i % 4), b"v", (("h", b"%d" % i),))
            for i in range(40)
        )
        for p in range(2)
    )
    topic = TopicArchive("pay", parts, 10)
    name = produce(broker, topic)
    dest = archived(topic, [0.75, 0.25], Path(work), groups=2, slice_duration="5s", seal_all=True)
    hand = handoff.offsets(compacted.load_manifest(open_storage(dest)))
    t = 1_000_000 + 1_000 * 20 + 300  # partition 0: offset 21 on (in the archive); 1: 20 on (past its hand-off)
    assert hand[1] <= 20 < hand[0]
    return parts, name, dest, hand, t, broker.bootstrap, work


def kafka_query_from_a_time(spark, parts, name: str, dest: str, hand: dict, t: int, bootstrap: str, work: str) -> None:
    options = {  # as a Kafka query sets them
        "kafka.bootstrap.servers": bootstrap,
        "subscribe": name,
        "startingTimestamp": str(t),
        "includeHeaders": "true",
        "failOnDataLoss": "true",
        "maxOffsetsPerTrigger": "15",
    }
    stream = spark.readStream.format("keyfill").options(**options).load(dest)
    stream.createOrReplaceTempView("events")
    sink = f"events_{uuid.uuid4().hex[:8]}"  # a memory sink: a Connect client's foreachBatch runs on the server
    (
        spark.sql(KAFKA_QUERY)
        .writeStream.format("memory")
        .queryName(sink)
        .option("checkpointLocation", f"{work}/ck")
        .trigger(availableNow=True)
        .start()
        .awaitTermination()
    )
    got = spark.table(sink).collect()
    want = [r for part in parts for r in part if r.offset >= next(q.offset for q in part if q.timestamp >= t)]
    assert sorted((r["partition"], r["offset"]) for r in got) == sorted((r.partition, r.offset) for r in want)
    assert {r["topic"] for r in got if r["offset"] < hand[r["partition"]]} <= {"pay"}
    assert {r["topic"] for r in got if r["offset"] >= hand[r["partition"]]} == {name}
    assert all(r["headers"] == [("h", str(r["offset"]).encode())] for r in got)
    assert all(r["user"] == f"u{r['offset'] % 4}" for r in got)


def test_an_ending_time_past_the_hand_off_stops_each_partition_in_the_topic(keyfill_kafka, tmp_path):
    parts = tuple(tuple(Record(p, i, 1_000 * i + 10 * p, b"k", b"v") for i in range(50)) for p in range(2))
    topic = TopicArchive("t", parts, 10)
    name = produce(keyfill_kafka, topic)
    dest = archived(topic, [0.4, 0.4], tmp_path, groups=1, slice_duration="5s", seal_all=True)
    opts = {"path": dest, "kafka.bootstrap.servers": keyfill_kafka.bootstrap, "subscribe": name}
    # partition 0 ends in the topic at offset 30, partition 1 within the archive at 12 (12,010 ms)
    by_partition = opts | {"endingOffsetsByTimestamp": json.dumps({name: {"0": 30_000, "1": 12_005}})}
    batches = run_stream(by_partition | {"maxOffsetsPerTrigger": "9"}, {2})
    got = sorted(as_records([r for _, rows in batches for r in rows]))
    assert got == sorted(r for r in topic.records if r.offset < (30 if r.partition == 0 else 12))
    assert [phase for phase, _ in batches][-1] == "live"
    batches = run_stream(opts | {"endingTimestamp": "30005"}, set())  # partition 0: 31 (30,000 ms is before)
    got = sorted(as_records([r for _, rows in batches for r in rows]))
    assert got == sorted(r for r in topic.records if r.offset < (31 if r.partition == 0 else 30))


@pytest.mark.kafka  # a broker of its own
def test_a_broker_gone_fails_the_switch_and_a_live_read_in_bounded_time_naming_it(tmp_path):
    """The broker stops after the archive has been planned: the switch's planning, and a live
    read planned before, each fail within kafkaConsumer.pollTimeoutMs (2 s here; the bound
    asserted, 30 s, is a liveness margin for a loaded machine), in one line naming the
    broker and the topic (and the partition, for a read)."""
    from keyfill.testing.kafka_broker import start_broker
    from reader.errors import KafkaReadError
    from reader.kafka_live import KafkaRange

    broker = start_broker()
    try:
        parts = (tuple(Record(0, i, 1_000 * i, b"k", b"v") for i in range(30)),)
        topic = TopicArchive("t", parts, 10)
        name = produce(broker, topic)
        dest = archived(topic, [0.5], tmp_path, groups=1, slice_duration="5s", seal_all=True)
        opts = {"path": dest, "kafka.bootstrap.servers": broker.bootstrap, "subscribe": name}
        opts["kafkaConsumer.pollTimeoutMs"] = "2000"
        reader = KeyfillStreamReader(Options.parse(opts))
        start = reader.initialOffset()
        archive_end = reader.latestOffset(start, ReadAllAvailable())
        assert "kafka" not in archive_end  # the archive first
        live = KafkaRange(name, 0, 15, 30, compacted.load_manifest(open_storage(dest)).assignment)
    finally:
        broker.process.kill()
        broker.process.wait()
    for attempt in (lambda: reader.latestOffset(archive_end, ReadAllAvailable()), lambda: list(reader.read(live))):
        began = time.monotonic()
        with pytest.raises(KafkaReadError) as failed:
            attempt()
        assert time.monotonic() - began < 30
        message = str(failed.value)
        assert broker.bootstrap in message and name in message and "\n" not in message, message
    assert f"{name}[0] offsets 15 to 29" in message


def keyed_partitions(sizes: list[int]) -> tuple[tuple[Record, ...], ...]:
    """Partitions of these sizes, four keys each, a record a second."""
    return tuple(
        tuple(Record(p, i, 1_000 * i + p, b"k%d" % (i % 4), b"v%d-%d" % (p, i)) for i in range(n))
        for p, n in enumerate(sizes)
    )


def live_reader(broker, name: str, topic: TopicArchive, root, **options: str) -> KeyfillStreamReader:
    """A stream reader over an archive of 30% of each partition, then `name` on `broker`, in
    live batches of at most 30 records read 4 at a time, polls waiting up to 30 s."""
    dest = archived(topic, [0.3] * len(topic.partitions), root, groups=2, slice_duration="5s", seal_all=True)
    opts = {"path": dest, "kafka.bootstrap.servers": broker.bootstrap, "subscribe": name}
    opts |= {"batchSize": "4", "maxOffsetsPerTrigger": "30", "kafkaConsumer.pollTimeoutMs": "30000", **options}
    return KeyfillStreamReader(Options.parse(opts))


def each_key_in_offset_order(rows: list[dict]) -> bool:
    by_key: dict[tuple, list[int]] = {}
    for r in rows:
        by_key.setdefault((r["key"], r["partition"]), []).append(r["offset"])
    return all(offsets == sorted(offsets) for offsets in by_key.values())


@pytest.mark.kafka  # a broker of its own
def test_the_live_phase_reads_each_record_once_across_dropped_and_stalled_connections(tmp_path):
    """The broker keeps its data while the network between it and keyfill breaks: every
    connection reset between planning and reading, every third batch read, and once all
    traffic held for a second (within kafkaConsumer.pollTimeoutMs). The archive and then
    the topic, each record exactly once and each partition in offset order."""
    import threading

    from keyfill.testing.kafka_broker import start_broker

    parts = keyed_partitions([70, 45])
    topic = TopicArchive("t", parts, 10)
    with start_broker(proxied=True) as broker:
        name = produce(broker, topic)
        rdr = live_reader(broker, name, topic, tmp_path, includeHeaders="true")
        start, rows, read, reset = rdr.initialOffset(), [], 0, 0
        for _ in range(100):
            end = json.loads(json.dumps(rdr.latestOffset(start, rdr.getDefaultReadLimit())))
            if end == start:
                break
            planned = rdr.partitions(start, end)
            reset += broker.proxy.drop()  # between planning and reading
            for part in planned:
                for batch in rdr.read(part):
                    rows += batch.to_pylist()
                    read += 1
                    if read % 3 == 0:
                        reset += broker.proxy.drop()
                    if read == 10:  # held, both ways, for a second
                        broker.proxy.stall()
                        threading.Timer(1.0, broker.proxy.resume).start()
            start = end
    assert reset >= 5  # the faults happened while the live phase read
    assert Counter((r["partition"], r["offset"]) for r in rows) == Counter(
        (r.partition, r.offset) for p in parts for r in p
    )
    assert each_key_in_offset_order(rows)
    assert sorted(as_records(rows), key=lambda r: (r.partition, r.offset)) == [r for p in parts for r in p]


@pytest.mark.kafka  # a broker of its own
def test_the_live_phase_reads_each_record_once_across_broker_restarts(s3_server, tmp_path):
    """A broker that keeps its log (tansu on the S3 server) killed and started again: at the
    switch (the archive read, its live batches not yet planned) and in the middle of a live
    batch's read (back a second later, within kafkaConsumer.pollTimeoutMs). The reader goes on with
    no restart of its own: the archive and then the topic, each record exactly once and each
    key in offset order."""
    import threading

    from keyfill.testing.kafka_broker import start_broker

    parts = keyed_partitions([60, 40])
    topic = TopicArchive("t", parts, 10)
    with start_broker(on_s3=s3_server) as broker:
        name = produce(broker, topic)
        broker.fence(name, len(parts))  # ListOffsets exact on this engine (keyfill.testing.kafka_broker)
        rdr = live_reader(broker, name, topic, tmp_path)
        start, rows, read, restarts, live = rdr.initialOffset(), [], 0, 0, False
        for _ in range(100):
            if rows and not live:  # the archive is read (one batch at the defaults): the switch is next
                assert "kafka" not in json.dumps(start)
                broker.restart()
                restarts, live = restarts + 1, True
            end = json.loads(json.dumps(rdr.latestOffset(start, rdr.getDefaultReadLimit())))
            if end == start:
                break
            for part in rdr.partitions(start, end):
                for batch in rdr.read(part):
                    rows += batch.to_pylist()
                    read += 1
                    if live and restarts == 1 and read % 2 == 0:  # mid-read: back a second later
                        broker.process.kill()
                        threading.Timer(1.0, broker.restart).start()
                        restarts += 1
            start = end
    assert restarts == 2 and live
    fences = [(p, len(part)) for p, part in enumerate(parts)]
    got = Counter((r["partition"], r["offset"]) for r in rows)
    assert got == Counter([(r.partition, r.offset) for p in parts for r in p] + fences)
    assert each_key_in_offset_order(rows)


@pytest.mark.kafka  # a broker of its own
def test_a_query_goes_on_across_broker_restarts(spark, s3_server, tmp_path):
    """The same broker restarts under a Spark query (availableNow, foreachBatch): after the
    archive's batch (the switch planned next, against the restarted broker) and after the
    first live batch, killed and back a second later, so the next batch is planned while it
    is away. The query goes on with no restart of its own: each record once, each key in
    offset order, and its checkpoint says archive first, then live batches."""
    import threading

    import reader.spark
    from keyfill.testing.kafka_broker import start_broker

    reader.spark.register(spark)
    parts = keyed_partitions([60, 40])
    topic = TopicArchive("t", parts, 10)
    rows: list[dict] = []
    restarts = []

    with start_broker(on_s3=s3_server) as broker:
        name = produce(broker, topic)
        broker.fence(name, len(parts))  # ListOffsets exact on this engine (keyfill.testing.kafka_broker)
        dest = archived(topic, [0.3, 0.3], tmp_path, groups=2, slice_duration="5s", seal_all=True)

        def keep(batch, batch_id):
            rows.extend(r.asDict() for r in batch.collect())
            if batch_id == 0:
                broker.restart()
                restarts.append(batch_id)
            elif batch_id == 1:
                broker.process.kill()
                threading.Timer(1.0, broker.restart).start()
                restarts.append(batch_id)

        ck = str(tmp_path / "ck")
        query = (
            spark.readStream.format("keyfill")
            .option("kafka.bootstrap.servers", broker.bootstrap)
            .option("subscribe", name)
            .option("maxOffsetsPerTrigger", "30")
            .option("kafkaConsumer.pollTimeoutMs", "30000")
            .load(dest)
            .select("partition", "offset", "key")
            .writeStream.foreachBatch(keep)
            .option("checkpointLocation", ck)
            .trigger(availableNow=True)
            .start()
        )
        query.awaitTermination(240)
        assert not query.isActive and query.exception() is None
    assert restarts == [0, 1]
    phases = []
    for n in sorted(int(f) for f in os.listdir(os.path.join(ck, "offsets")) if f.isdigit()):
        with open(os.path.join(ck, "offsets", str(n))) as f:
            phases.append("live" if "kafka" in f.read().splitlines()[-1] else "archive")
    assert phases[0] == "archive" and phases[1:] == ["live"] * (len(phases) - 1) and len(phases) >= 3
    fences = [(p, len(part)) for p, part in enumerate(parts)]
    got = Counter((r["partition"], r["offset"]) for r in rows)
    assert got == Counter([(r.partition, r.offset) for p in parts for r in p] + fences)
    assert each_key_in_offset_order(rows)


def test_progress_says_how_far_behind_the_latest_the_query_is(keyfill_kafka, tmp_path):
    parts = (tuple(Record(0, i, 1_000 * i, b"k", b"v") for i in range(50)),)
    topic = TopicArchive("t", parts, 10)
    name = produce(keyfill_kafka, topic)
    dest = archived(topic, [0.4], tmp_path, groups=1, slice_duration="5s", seal_all=True)  # 20 records, 4 slices
    opts = {"path": dest, "kafka.bootstrap.servers": keyfill_kafka.bootstrap, "subscribe": name}
    reader = KeyfillStreamReader(Options.parse(opts | {"maxSlicesPerTrigger": "1", "maxOffsetsPerTrigger": "8"}))
    start = reader.initialOffset()
    end = reader.latestOffset(start, reader.getDefaultReadLimit())
    latest = reader.reportLatestOffset()
    assert latest["slice"] == 4 and latest["progress"] == {
        "slicesBehind": 3,
        "eventTimeReached": "1970-01-01T00:00:05+00:00",
    }
    while "kafka" not in end:
        end = reader.latestOffset(end, reader.getDefaultReadLimit())
    progress = reader.reportLatestOffset()["progress"]  # 8 of the topic's 30 live records planned
    assert progress["slicesBehind"] == 0 and progress["maxOffsetsBehindLatest"] == 22

"""The live phase of format("keyfill") against the client it is built on, in one run.

    python -m bench.bench_live                  # 1M records of 200 B: ~1 minute
    python -m bench.bench_live --records 3000000 --skip switch

1. **Throughput**: a topic of --records records on the test broker (tansu, in memory, on
   127.0.0.1), read from offset 0 to the end (a) by a plain confluent-kafka consumer loop
   that touches each record's value (the floor: what the client delivers to Python) and (b)
   by the live phase's reader (`reader.kafka_live.read_range`: the same client, records
   into Arrow batches of the source's schema, key groups looked up). Best of --rounds,
   interleaved; records/s and (b)/(a).
2. **The switch**: a query over an archive of the topic's first part, then the topic, on a
   processing-time trigger of --trigger seconds: the time from the end of the last archive
   batch to the start of the first live one, against the trigger interval.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
import time


def _produce(broker, topic: str, records: int, value_bytes: int) -> None:
    from confluent_kafka import Producer

    broker.create_topic(topic, 1)
    producer = Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 20, "batch.num.messages": 10_000})
    value = os.urandom(value_bytes)
    for i in range(records):
        while True:
            try:
                producer.produce(topic, key=b"user-%d" % (i % 50_000), value=value, timestamp=1_700_000_000_000 + i)
                break
            except BufferError:
                producer.poll(0.05)
    producer.flush(120)


def _plain(bootstrap: str, topic: str, records: int) -> float:
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "bench", "enable.auto.commit": False})
    consumer.assign([TopicPartition(topic, 0, 0)])
    t = time.perf_counter()
    seen = nbytes = 0
    while seen < records:
        for m in consumer.consume(num_messages=min(10_000, records - seen), timeout=0.2):
            if m.error() is None:
                seen += 1
                nbytes += len(m.value())
    seconds = time.perf_counter() - t
    consumer.close()
    return seconds


def _ours(bootstrap: str, topic: str, records: int, group_of) -> float:
    from reader.kafka_live import KafkaOptions, KafkaRange, read_range
    from reader.spark.rows import arrow_schema

    k = KafkaOptions({"bootstrap.servers": bootstrap})
    t = time.perf_counter()
    n = sum(b.num_rows for b in read_range(k, KafkaRange(topic, 0, 0, records), 65_536, arrow_schema(), group_of))
    assert n == records, n
    return time.perf_counter() - t


def _assignment():
    """A bucketed assignment of 50K keys over 64 groups, as a large archive has."""
    import numpy as np
    import pyarrow as pa

    from keygroups.assignment import KeyAssignment, bucket_count, bucket_rows

    b = bucket_count(64)
    rows = bucket_rows(
        pa.table(
            {
                "bucket": pa.array(np.arange(b, dtype=np.int32)),
                "bytes": np.ones(b, np.int64),
                "records": np.ones(b, np.int64),
                "keys": np.ones(b, np.int64),
            }
        ),
        np.arange(b, dtype=np.int32) % 64,
    )
    return KeyAssignment.from_table(rows).group_of


def _switch(spark, broker, root: str, trigger_s: float) -> tuple[float, float]:
    """Seconds from the end of the last archive batch to the start of the first live batch,
    and the trigger interval's median gap between archive batches for comparison."""
    from compactor.job import CompactConfig, compact
    from keyfill.synth.topic import Record, TopicArchive, write_archive

    name = f"switch-{int(time.time())}"
    parts = (tuple(Record(0, i, 1_700_000_000_000 + 100 * i, b"k%d" % (i % 97), b"v" * 100) for i in range(20_000)),)
    broker.create_topic(name, 1)
    producer = broker.producer()
    for r in parts[0]:
        producer.produce(name, key=r.key, value=r.value, partition=0, timestamp=r.timestamp)
    producer.flush(120)
    src, dest = os.path.join(root, "switch-src"), os.path.join(root, "switch-compacted")
    prefix = TopicArchive(name, (parts[0][:12_000],), 2_000)
    compact(CompactConfig(**write_archive(prefix, src), dest=dest, groups=4, slice_duration="60s", seal_all=True))
    ends = []

    def keep(batch, batch_id):
        batch.count()
        ends.append(time.time())

    query = (
        spark.readStream.format("keyfill")
        .option("kafka.bootstrap.servers", broker.bootstrap)
        .option("subscribe", name)
        .option("maxSlicesPerTrigger", "4")
        .load(dest)
        .writeStream.foreachBatch(keep)
        .option("checkpointLocation", os.path.join(root, "switch-ck"))
        .trigger(processingTime=f"{trigger_s} seconds")
        .start()
    )
    deadline = time.time() + 300
    while time.time() < deadline:
        done = [p for p in query.recentProgress if p["numInputRows"]]
        offsets = [json.loads(p["sources"][0]["endOffset"]) for p in done]
        if offsets and "kafka" in offsets[-1]:
            break
        time.sleep(0.5)
    query.stop()
    progress = [p for p in query.recentProgress if p["numInputRows"]]
    phase = ["kafka" in json.loads(p["sources"][0]["endOffset"]) for p in progress]
    first_live = phase.index(True)
    starts = [_epoch(p["timestamp"]) for p in progress]
    ended_last_archive = starts[first_live - 1] + progress[first_live - 1]["durationMs"]["triggerExecution"] / 1000
    return starts[first_live] - ended_last_archive, trigger_s


def _epoch(stamp: str) -> float:
    from datetime import datetime

    return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--records", type=int, default=1_000_000)
    ap.add_argument("--value-bytes", type=int, default=200)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--trigger", type=float, default=2.0, help="processing-time trigger of the switch part, seconds")
    ap.add_argument("--skip", default="", help="parts to skip: throughput,switch")
    args = ap.parse_args()
    skip = set(filter(None, args.skip.split(",")))

    from keyfill.testing.kafka_broker import start_broker

    root = tempfile.mkdtemp(prefix="keyfill-bench-live-")
    with start_broker() as broker:
        if "throughput" not in skip:
            print(f"1. reading {args.records:,} records of {args.value_bytes} B from one partition (tansu, 127.0.0.1)")
            _produce(broker, "bench", args.records, args.value_bytes)
            group_of = _assignment()
            plain, ours = [], []
            for _ in range(args.rounds):
                plain.append(_plain(broker.bootstrap, "bench", args.records))
                ours.append(_ours(broker.bootstrap, "bench", args.records, group_of))
            a, b = args.records / min(plain), args.records / min(ours)
            print(f"  plain consumer loop   {a / 1e6:6.2f}M records/s")
            print(f"  live phase read_range {b / 1e6:6.2f}M records/s ({b / a:.2f}x the plain loop)")
        if "switch" not in skip:
            import reader.spark
            from compactor.spark_session import local_spark

            spark = local_spark("local[2]", app="bench-live", progress=False)
            spark.sparkContext.setLogLevel("ERROR")
            reader.spark.register(spark)
            gap, interval = _switch(spark, broker, root, args.trigger)
            print(f"2. the switch: first live batch {gap:.2f} s after the last archive batch (trigger {interval} s)")
            spark.stop()
    shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()

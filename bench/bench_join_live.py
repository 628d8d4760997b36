"""The join state of two paced keyfill sources across the switch to their live topics (issue
44, item 3): jobs/fraud_join.py's join over payments and logins, each source first replaying
its archive (the first part of its topic) paced in event time, then reading its topic on a
real broker (tansu on 127.0.0.1) from its own hand-off, in one query.

    python -m bench.bench_join_live            # 40K payments (4/5 archived), ~3K logins (1/2 archived)
    python -m bench.bench_join_live --quick    # 10K payments

Prints each micro-batch: each source's phase (archive, live, or idle when it did not move)
and rows, and the join's state (rows over both sides) after it; then the peak state in the
archive phase, in the batches where one source is live and the other still replays, and
when both are live.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import pyarrow as pa

from compactor.job import CompactConfig, compact
from compactor.sources.envelope import build_index, read_chunk
from keyfill.synth.generate import GeneratorConfig, generate
from keyfill.synth.topic import Record, TopicArchive, write_archive
from keyfill.testing.kafka_broker import start_broker
from keygroups.storage import open_storage

ARCHIVED = {"payments": 0.8, "logins": 0.5}  # of each partition: the logins go live well before the payments


def topic_of(url: str, name: str) -> TopicArchive:
    store = open_storage(url)
    table = pa.Table.from_batches([read_chunk(store, c) for c in build_index(store).all_chunks()])
    parts: dict[int, list[Record]] = {}
    for p, o, ts, k, v in zip(
        table.column("partition").to_pylist(),
        table.column("offset").to_pylist(),
        table.column("timestamp").cast(pa.int64()).to_pylist(),
        table.column("key").to_pylist(),
        table.column("value").to_pylist(),
    ):
        parts.setdefault(p, []).append(Record(p, o, ts, k, v))
    return TopicArchive(name, tuple(tuple(sorted(parts[p])) for p in sorted(parts)), 2_000)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    records = 10_000 if args.quick else 40_000
    root = Path(tempfile.mkdtemp(prefix="bench-join-live-"))
    generate(
        GeneratorConfig(
            out=str(root / "payments"),
            records=records,
            keys=500,
            partitions=3,
            rate=100.0,
            seed=3,
            logins_out=str(root / "logins"),
            logins_after_ms=60_000,
        ),
        progress=False,
    )
    topics = [topic_of(str(root / t), t) for t in ("payments", "logins")]
    broker = start_broker()
    try:
        names = []
        for t in topics:
            name = f"{t.topic}-{int(time.time())}"
            broker.create_topic(name, len(t.partitions))
            producer = broker.producer()
            for r in t.records:
                producer.produce(name, key=r.key, value=r.value, partition=r.partition, timestamp=r.timestamp)
            assert producer.flush(60) == 0
            names.append(name)
        urls = []
        for t, d in zip(topics, ("10s", "5s")):
            prefix = TopicArchive(t.topic, tuple(p[: int(len(p) * ARCHIVED[t.topic])] for p in t.partitions), 2_000)
            dest = str(root / f"{t.topic}-compacted")
            compact(
                CompactConfig(
                    **write_archive(prefix, str(root / f"{t.topic}-src")), dest=dest, groups=4, slice_duration=d
                )
            )
            urls.append(dest)
        run(broker.bootstrap, urls, names, min(r.timestamp for t in topics for r in t.records))
    finally:
        broker.stop()


def run(bootstrap: str, urls: list[str], names: list[str], start: int) -> None:
    import reader.spark
    from compactor.spark_session import local_spark
    from jobs.fraud_join import fraud_join

    spark = local_spark("local[2]", app="bench-join-live", driver_memory="2g", progress=False)
    spark.conf.set("spark.sql.shuffle.partitions", "2")
    reader.spark.register(spark)
    options = {"maxEventTimePerTrigger": "20 seconds", "startingTimestamp": str(start)}
    sources = [
        spark.readStream.format("keyfill")
        .options(**options, **{"kafka.bootstrap.servers": bootstrap, "subscribe": name})
        .load(url)
        for url, name in zip(urls, names)
    ]
    joined = fraud_join(*sources, within="30 seconds", watermark_delay="10 seconds")
    ck = tempfile.mkdtemp(prefix="bench-join-live-ck-")
    started = time.perf_counter()
    query = joined.writeStream.format("noop").option("checkpointLocation", ck).trigger(availableNow=True).start()
    query.awaitTermination()
    seconds = time.perf_counter() - started
    peaks: dict[str, int] = {}
    print(f"{'batch':>5}  {'payments':>16}  {'logins':>16}  {'state rows':>10}")
    for p in query.recentProgress:
        phases = []
        for s in p["sources"]:
            a, e = (json.loads(o) if isinstance(o, str) else o for o in (s["startOffset"], s["endOffset"]))
            moved = a != e
            phases.append(("live" if "kafka" in (e or {}) else "archive") if moved else "idle")
            phases[-1] += f" {s['numInputRows']:>8,}"
        state = sum(op.get("numRowsTotal", 0) for op in p.get("stateOperators", []))
        live = sum("live" in ph for ph in phases)
        kind = ("replaying", "one live", "both live")[live]
        if any(not ph.startswith("idle") for ph in phases):
            peaks[kind] = max(peaks.get(kind, 0), state)
        print(f"{p['batchId']:>5}  {phases[0]:>16}  {phases[1]:>16}  {state:>10,}")
    dropped = sum(
        op.get("numRowsDroppedByWatermark", 0) for p in query.recentProgress for op in p.get("stateOperators", [])
    )
    print(
        f"{seconds:.1f} s; rows dropped as late: {dropped}; peak join state rows: "
        + ", ".join(f"{k} {v:,}" for k, v in peaks.items())
    )
    spark.stop()


if __name__ == "__main__":
    main()

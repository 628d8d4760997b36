"""A small topic of given records, and its source archive written in a layout keyfill reads:
what `keyfill warm` compiles the decoders on, what the testing kit's drawn topics are, and
what tests and benchmarks build archives from.

A `TopicArchive` is the topic's records per partition in offset order, cut into chunk
files of `chunk_records`. `write_archive` writes it as keyfill's envelope archive, as the
Kafka Connect S3 sink writes (Avro values, keys and headers files), or as a broker's log
segments (kafka-python's record batches: the testing extra), and returns the compaction
options that read it back. The layouts are named as the source registry names them.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple

import pyarrow as pa

from compactor.sources.delta import DeltaSource
from compactor.sources.envelope import EnvelopeSource, write_chunk
from compactor.sources.kafka_connect import KafkaConnectSource
from compactor.sources.kafka_segments import KafkaSegmentsSource
from keygroups import envelope
from keygroups.storage import Storage, open_storage

LAYOUTS = (EnvelopeSource.format, KafkaConnectSource.format, KafkaSegmentsSource.format, DeltaSource.format)

# What the Connect layout stores as a record's value: Connect keeps no Kafka timestamp, so
# the value carries it (`timestamp_field`), with the payload as text.
CONNECT_VALUE_SCHEMA = {
    "type": "record",
    "name": "Value",
    "namespace": "keyfill.testing",
    "fields": [{"name": "timestamp", "type": "long"}, {"name": "value", "type": ["null", "string"]}],
}


class Record(NamedTuple):
    """One record of the topic: what a Kafka consumer sees, and what the replay emits."""

    partition: int
    offset: int
    timestamp: int  # ms
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes | None], ...] = ()


@dataclass(frozen=True)
class TopicArchive:
    topic: str
    partitions: tuple[tuple[Record, ...], ...]  # per partition, in offset order
    chunk_records: int = 50  # records per source file

    @property
    def records(self) -> list[Record]:
        return [r for part in self.partitions for r in part]

    def __repr__(self) -> str:  # what hypothesis prints for a shrunk archive: short and whole
        lines = [f"TopicArchive({self.topic!r}, chunk_records={self.chunk_records}):"]
        for p, recs in enumerate(self.partitions):
            shown = ", ".join(f"{r.offset}@{r.timestamp}:{r.key!r}" for r in recs)
            lines.append(f"  partition {p}: [{shown}]")
        return "\n".join(lines)


def _envelope_batch(
    records: list[Record], value: Callable[[Record], bytes | None] = lambda r: r.value
) -> pa.RecordBatch:
    return envelope.batch_from_records(
        [
            {
                "partition": r.partition,
                "offset": r.offset,
                "timestamp": r.timestamp,
                "key": r.key,
                "value": value(r),
                "headers": [{"key": k, "value": v} for k, v in r.headers],
            }
            for r in records
        ]
    )


def _chunks(archive: TopicArchive) -> list[list[Record]]:
    n = archive.chunk_records
    return [list(part[i : i + n]) for part in archive.partitions for i in range(0, len(part), n)]


def write_archive(archive: TopicArchive, url: str | Storage, layout: str = EnvelopeSource.format) -> dict[str, Any]:
    """Write `archive` under `url` in `layout`; returns the `CompactConfig` options that read
    it (`source`, `source_format` and, for Connect, `source_options`)."""
    store = open_storage(url) if isinstance(url, str) else url
    if layout == EnvelopeSource.format:
        for chunk in _chunks(archive):
            write_chunk(store, _envelope_batch(chunk), archive.topic, codec="null")
        return {"source": store.url, "source_format": layout}
    if layout == KafkaConnectSource.format:
        from keyfill.synth.kafka_connect import write_connect_archive

        def as_json(r: Record) -> bytes:
            text = r.value.decode("latin-1") if r.value is not None else None  # every byte a character
            return json.dumps({"timestamp": r.timestamp, "value": text}).encode()

        write_connect_archive(
            [_envelope_batch(list(part), as_json) for part in archive.partitions if part],
            store,
            topic=archive.topic,
            key_type="bytes",
            value_schema=CONNECT_VALUE_SCHEMA,
            to_value=json.loads,
            records_per_file=archive.chunk_records,
        )
        connect = {"timestamp_field": "timestamp"}
        return {"source": store.url, "source_format": layout, "source_options": connect}
    if layout == KafkaSegmentsSource.format:
        for chunk in _chunks(archive):
            base = chunk[0].offset
            store.write(f"{archive.topic}-{chunk[0].partition}/{base:020d}.log", _segment(chunk))
        return {"source": store.url, "source_format": layout}
    if layout == DeltaSource.format:
        _write_delta(archive, store)
        return {"source": store.url, "source_format": layout}
    raise ValueError(f"layout must be one of {', '.join(LAYOUTS)}, not {layout!r}")


def _write_delta(archive: TopicArchive, store: Storage) -> None:
    """A bronze table as a streaming job writes it: commits of `chunk_records` rows in
    event-time order, each holding rows of every partition, in the Kafka source's columns.
    delta-rs writes it on local disk; the files are then copied to the store."""
    import tempfile

    from deltalake import write_deltalake

    rows = sorted((r for part in archive.partitions for r in part), key=lambda r: (r.timestamp, r.partition, r.offset))
    header = pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))
    with tempfile.TemporaryDirectory(prefix="keyfill-delta-") as folder:
        for at in range(0, len(rows), max(1, archive.chunk_records)):
            some = rows[at : at + max(1, archive.chunk_records)]
            table = pa.table(
                {
                    "key": pa.array([r.key for r in some], pa.binary()),
                    "value": pa.array([r.value for r in some], pa.binary()),
                    "topic": pa.array([archive.topic] * len(some)),
                    "partition": pa.array([r.partition for r in some], pa.int32()),
                    "offset": pa.array([r.offset for r in some], pa.int64()),
                    "timestamp": pa.array([r.timestamp * 1000 for r in some], pa.timestamp("us", tz="UTC")),
                    "headers": pa.array([[{"key": k, "value": v} for k, v in r.headers] for r in some], header),
                }
            )
            write_deltalake(folder, table, mode="append")
        local = open_storage(folder)
        for o in local.list():
            store.write(o.key, local.read(o.key))


def _segment(records: list[Record], per_batch: int = 7) -> bytes:
    """A log segment of v2 record batches, built by kafka-python's batch builder (an
    implementation of Kafka's record format independent of keyfill's reader); a batch
    holds consecutive offsets."""
    from kafka.record.default_records import DefaultRecordBatchBuilder

    out = b""
    i = 0
    while i < len(records):
        batch = [records[i]]
        while len(batch) < per_batch and i + len(batch) < len(records):
            nxt = records[i + len(batch)]
            if nxt.offset != batch[-1].offset + 1:
                break
            batch.append(nxt)
        b = DefaultRecordBatchBuilder(
            magic=2,
            compression_type=0,
            is_transactional=False,
            producer_id=-1,
            producer_epoch=-1,
            base_sequence=-1,
            batch_size=1 << 30,
        )
        for j, r in enumerate(batch):
            b.append(j, timestamp=r.timestamp, key=r.key, value=r.value, headers=list(r.headers))
        buf = bytearray(b.build())
        buf[0:8] = struct.pack(">q", batch[0].offset)  # the base offset the broker assigns
        out += bytes(buf)
        i += len(batch)
    return out

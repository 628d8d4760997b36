"""Source archives as the compactor sees them: a list of chunks, each a contiguous offset
range of one partition, and a way to read one chunk as envelope records.

Two formats implement it: keyfill's envelope archive (bounds in the file headers) and the
Kafka Connect S3 sink layout (bounds known only after reading). The compactor never trusts
header bounds for correctness: its statistics pass measures every chunk.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

import pyarrow as pa

from keygroups.errors import OptionError
from keygroups.storage import Storage, open_storage

FORMATS = ("envelope", "kafka-connect")


@dataclass(frozen=True)
class SourceChunk:
    """One chunk file. Fields after `size` come from file headers where the format has
    them, else None until the chunk is read."""

    key: str  # relative to the source root
    topic: str
    partition: int
    first_offset: int
    size: int
    last_offset: int | None = None
    records: int | None = None
    min_timestamp: int | None = None
    max_timestamp: int | None = None


class SourceArchive(ABC):
    """A source archive; picklable, so Spark tasks can read chunks themselves."""

    store: Storage

    @property
    def url(self) -> str:
        return self.store.url

    @abstractmethod
    def list_chunks(self) -> list[SourceChunk]:
        """All chunks, sorted by (topic, partition, first offset)."""

    @abstractmethod
    def read(self, chunk: SourceChunk) -> pa.RecordBatch:
        """The chunk's records as `keygroups.envelope.ARROW_SCHEMA`, in offset order.
        Raises CorruptFile naming the object (and offset where known) on bad data."""


class EnvelopeSource(SourceArchive):
    def __init__(self, store: Storage, *, threads: int = 16):
        self.store = store
        self.threads = threads

    def list_chunks(self) -> list[SourceChunk]:
        from compactor.envelope_archive import build_index

        index = build_index(self.store, threads=self.threads)
        return [
            SourceChunk(
                key=c.key,
                topic=c.topic,
                partition=c.partition,
                first_offset=c.first_offset,
                size=c.size,
                last_offset=c.last_offset,
                records=c.records,
                min_timestamp=c.min_timestamp,
                max_timestamp=c.max_timestamp,
            )
            for c in index.all_chunks()
        ]

    def read(self, chunk: SourceChunk) -> pa.RecordBatch:
        from compactor.envelope_archive import ChunkInfo, read_chunk

        info = ChunkInfo(
            key=chunk.key,
            size=chunk.size,
            topic=chunk.topic,
            partition=chunk.partition,
            first_offset=chunk.first_offset,
            last_offset=chunk.last_offset,
            min_timestamp=chunk.min_timestamp,
            max_timestamp=chunk.max_timestamp,
            records=chunk.records,
        )
        return read_chunk(self.store, info)


def open_source(
    url: str,
    *,
    format: str = "envelope",
    key_field: str | None = None,
    timestamp_field: str | None = None,
    threads: int = 16,
) -> SourceArchive:
    """The source archive at `url` in the given layout."""
    store = open_storage(url, threads=threads)
    if format == "envelope":
        return EnvelopeSource(store, threads=threads)
    if format == "kafka-connect":
        from compactor.kafka_connect import KafkaConnectSource

        return KafkaConnectSource(store, key_field=key_field, timestamp_field=timestamp_field, threads=threads)
    raise OptionError(f"unknown source format {format!r}; choose one of {', '.join(FORMATS)}")

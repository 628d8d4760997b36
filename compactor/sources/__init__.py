"""Source archives, one module per layout, chosen by `--format` from `FORMATS`:

- `envelope`: keyfill's own partition-ordered archive (`compactor.sources.envelope`);
- `kafka-connect`: the Kafka Connect S3 sink's layout, Avro, JSON or Parquet files
  (`compactor.sources.kafka_connect`);
- `kafka-segments`: Kafka's own log segments, a broker's log directory
  (`compactor.sources.kafka_segments`), or tiered storage as the Aiven
  RemoteStorageManager uploads it (`compactor.sources.kafka_tiered`);
- `iceberg`: a topic materialised as an Iceberg table, Redpanda Iceberg Topics' schema
  (`compactor.sources.iceberg`).

Each yields `SourceChunk`s and reads them as envelope records (`compactor.sources.base`).
"""

from __future__ import annotations

from compactor.sources.base import ArchiveError, SourceArchive, SourceChunk
from compactor.sources.envelope import EnvelopeSource
from compactor.sources.iceberg import IcebergSource
from compactor.sources.kafka_connect import KafkaConnectSource
from compactor.sources.kafka_segments import KafkaSegmentsSource
from keygroups.errors import OptionError
from keygroups.storage import open_storage

FORMATS: dict[str, type[SourceArchive]] = {
    "envelope": EnvelopeSource,
    "kafka-connect": KafkaConnectSource,
    "kafka-segments": KafkaSegmentsSource,
    "iceberg": IcebergSource,
}

__all__ = ["FORMATS", "ArchiveError", "SourceArchive", "SourceChunk", "open_source"]


def open_source(
    url: str,
    *,
    format: str = "envelope",
    key_field: str | None = None,
    timestamp_field: str | None = None,
    allow_dropped: bool = False,
    threads: int = 16,
) -> SourceArchive:
    """The source archive at `url` in the given layout."""
    if format not in FORMATS:
        raise OptionError(f"unknown source format {format!r}; choose one of {', '.join(FORMATS)}")
    if not FORMATS[format].storage_url:  # the source opens its URL itself
        return FORMATS[format](url, threads=threads)
    store = open_storage(url, threads=threads)
    if format == "kafka-connect":
        return KafkaConnectSource(
            store, key_field=key_field, timestamp_field=timestamp_field, allow_dropped=allow_dropped, threads=threads
        )
    return FORMATS[format](store, threads=threads)

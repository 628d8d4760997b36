"""`--format kafka-connect`: a topic archived by the Kafka Connect S3 sink (docs/kafka-connect-source.md).

`source` lists the layout and reads a chunk; `file_formats` picks a file's decoder by its
extension, from `avro` (with `avro_keys_headers`, the compiled decoders of keys and headers
files), `json_lines` and `parquet`; `records` is what every decoder hands back. The source's
names are re-exported here, where they were before the format became a package.
"""

from __future__ import annotations

from compactor.sources.kafka_connect.source import (
    HEADERS_SUFFIX,
    KEYS_SUFFIX,
    ConnectChunk,
    KafkaConnectOptions,
    KafkaConnectSource,
)

__all__ = ["KafkaConnectSource", "KafkaConnectOptions", "ConnectChunk", "KEYS_SUFFIX", "HEADERS_SUFFIX"]

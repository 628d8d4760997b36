"""`--format kafka-segments`: Kafka's own log segments (docs/kafka-segments-source.md).

`source` lists a broker's log directory or tiered storage and reads a segment as a chunk;
`tiered` reads the Aiven RemoteStorageManager's uploads; `record_batches` decodes the record
batches both hold. The source is re-exported here, where it was before the format became a
package.
"""

from __future__ import annotations

from compactor.sources.kafka_segments.source import KafkaSegmentsSource

__all__ = ["KafkaSegmentsSource"]

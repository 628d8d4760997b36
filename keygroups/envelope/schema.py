"""The envelope record's schemas, Avro and Arrow, and what every codec needs of them."""

from __future__ import annotations

from typing import Any

import fastavro
import numpy as np
import pyarrow as pa

from keygroups.errors import OptionError

AVRO_SCHEMA = {
    "type": "record",
    "name": "Envelope",
    "namespace": "keyfill",
    "doc": "One Kafka record: where it was (partition, offset), when (timestamp) and what.",
    "fields": [
        {"name": "partition", "type": "int"},
        {"name": "offset", "type": "long"},
        {"name": "timestamp", "type": {"type": "long", "logicalType": "timestamp-millis"}},
        {"name": "key", "type": ["null", "bytes"], "default": None},
        {"name": "value", "type": ["null", "bytes"], "default": None},
        {
            "name": "headers",
            "type": {
                "type": "array",
                "items": {
                    "type": "record",
                    "name": "Header",
                    "fields": [
                        {"name": "key", "type": "string"},
                        {"name": "value", "type": ["null", "bytes"], "default": None},
                    ],
                },
            },
            "default": [],
        },
    ],
}
PARSED_SCHEMA = fastavro.parse_schema(AVRO_SCHEMA)

HEADER_TYPE = pa.struct([pa.field("key", pa.string(), nullable=False), ("value", pa.binary())])
ARROW_SCHEMA = pa.schema(
    [
        pa.field("partition", pa.int32(), nullable=False),
        pa.field("offset", pa.int64(), nullable=False),
        pa.field("timestamp", pa.timestamp("ms", tz="UTC"), nullable=False),
        ("key", pa.binary()),
        ("value", pa.binary()),
        pa.field("headers", pa.list_(HEADER_TYPE), nullable=False),
    ]
)

# The records as the compaction moves them: what it sorts and groups by, the weight packing
# balances (`record_bytes`), and each record's Avro encoding, which is what a piece's blocks
# hold (`encode_records`): the value and headers travel inside it, never as columns.
ENCODED_SCHEMA = pa.schema(
    [
        pa.field("partition", pa.int32(), nullable=False),
        pa.field("offset", pa.int64(), nullable=False),
        pa.field("timestamp", pa.timestamp("ms", tz="UTC"), nullable=False),
        ("key", pa.binary()),
        pa.field("bytes", pa.int64(), nullable=False),
        pa.field("record", pa.large_binary(), nullable=False),
    ]
)

CODECS = ("null", "deflate", "snappy")
DEFAULT_BLOCK_BYTES = 256 * 1024


def empty_batch() -> pa.RecordBatch:
    return pa.RecordBatch.from_pylist([], schema=ARROW_SCHEMA)


def batch_from_records(records: list[dict[str, Any]]) -> pa.RecordBatch:
    """Arrow batch from fastavro-style dicts (timestamp as int ms or aware datetime)."""
    return pa.RecordBatch.from_pylist(records, schema=ARROW_SCHEMA)


def conform(batch: pa.RecordBatch | pa.Table) -> pa.RecordBatch:
    """`batch` with exactly ARROW_SCHEMA's columns and types (extra columns dropped)."""
    if isinstance(batch, pa.Table):
        batch = batch.combine_chunks().to_batches()[0] if batch.num_rows else empty_batch()
    cols = []
    for field in ARROW_SCHEMA:
        try:
            col = batch.column(field.name)
        except KeyError:
            raise OptionError(f"record batch has no {field.name!r} column") from None
        if col.type != field.type:
            col = col.cast(field.type)
        cols.append(col)
    return pa.RecordBatch.from_arrays(cols, schema=ARROW_SCHEMA)


def record_bytes(batch: pa.RecordBatch) -> np.ndarray:
    """Payload bytes per record (key + value + header keys and values): the weight that
    key-group packing balances."""
    import pyarrow.compute as pc

    def lengths(arr: pa.Array) -> np.ndarray:
        out: np.ndarray = pc.binary_length(arr).fill_null(0).to_numpy(zero_copy_only=False).astype(np.int64)
        return out

    total: np.ndarray = lengths(batch.column("key")) + lengths(batch.column("value"))
    headers = batch.column("headers")
    items = pc.list_flatten(headers)
    if len(items):
        per_item = lengths(items.field("key").cast(pa.binary())) + lengths(items.field("value"))
        parents = pc.list_parent_indices(headers).to_numpy(zero_copy_only=False)
        total += np.bincount(parents, weights=per_item, minlength=batch.num_rows).astype(np.int64)
    return total


def normal_type(t: Any) -> Any:
    """A schema with docs, defaults, namespaces and record names stripped, for comparison."""
    if isinstance(t, list):
        return [normal_type(x) for x in t]
    if isinstance(t, dict):
        if t.get("type") == "record":
            return ("record", tuple((f["name"], normal_type(f["type"])) for f in t["fields"]))
        if t.get("type") == "array":
            return ("array", normal_type(t["items"]))
        return (t["type"], t.get("logicalType"))
    return t


ENVELOPE_SHAPE = normal_type(AVRO_SCHEMA)

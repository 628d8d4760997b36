"""Write envelope records in the Kafka Connect S3 sink layout, for tests and demos: it turns
a `keyfill generate` archive (JSON payments) into what the Confluent S3 sink with
`format.class=AvroFormat`, `store.kafka.keys=true` and `store.kafka.headers=true` writes,
so the `kafka-connect` source can be exercised without a Kafka cluster.

Where the connector would refuse a record, the writer writes a superset instead and says so:
the connector rejects null keys when it stores keys and records without headers when it
stores headers, and cannot store a null header value; here the keys schema is nullable, an
empty headers array is written, and the header value schema becomes ["null", "string"] in
files that need it. A file is also cut at every offset gap, since offsets in this layout are
positions.
"""

from __future__ import annotations

import hashlib
import io
import json
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import fastavro
import pyarrow as pa

from compactor.sources.base import SourceArchive
from compactor.sources.kafka_connect.source import HEADERS_SUFFIX, KEYS_SUFFIX, TOPICS_DIR
from keygroups.envelope import conform
from keygroups.storage import Storage, open_storage

__all__ = ["payment_schema", "write_connect_archive", "KEY_SCHEMAS", "headers_schema"]

TS_TYPES = ("long", "timestamp-millis", "timestamp-micros")
# What Connect's AvroData makes of the optional key schemas of StringConverter and
# ByteArrayConverter.
KEY_SCHEMAS = {"string": ["null", "string"], "bytes": ["null", "bytes"]}
# An Avro record schema, or an Avro datum of one, as fastavro takes them (parsed JSON).
AvroRecord = dict[str, Any]
# A record waiting for its file: offset, key, value, headers ({"key", "value"} each).
_Row = tuple[int, bytes | None, bytes | None, list[dict[str, Any]]]


def payment_schema(ts_type: str = "timestamp-millis") -> AvroRecord:
    """Avro value schema of the payments `keyfill generate` writes as JSON."""
    if ts_type not in TS_TYPES:
        raise ValueError(f"ts_type must be one of {', '.join(TS_TYPES)}, not {ts_type!r}")
    ts: Any = "long" if ts_type == "long" else {"type": "long", "logicalType": ts_type}
    return {
        "type": "record",
        "name": "Payment",
        "namespace": "keyfill.example",
        "fields": [
            {"name": "user", "type": ["null", "string"], "default": None},
            {"name": "amount", "type": "double"},
            {"name": "merchant", "type": "string"},
            {"name": "currency", "type": "string"},
            {"name": "ts", "type": ts},
        ],
    }


def headers_schema(nullable_values: bool = False) -> dict[str, Any]:
    """The connector's headers view: an array of {key, value} structs, values as strings
    (Values.convertToString). AvroData names such an unnamed struct ConnectDefault."""
    return {
        "type": "array",
        "items": {
            "type": "record",
            "name": "ConnectDefault",
            "namespace": "io.confluent.connect.avro",
            "fields": [
                {"name": "key", "type": "string"},
                {"name": "value", "type": ["null", "string"] if nullable_values else "string"},
            ],
        },
    }


def _payment_decoder(schema: AvroRecord) -> Callable[[bytes], AvroRecord]:
    """JSON payment -> Avro datum; a timestamp-micros `ts` is scaled from the JSON's ms."""
    ts = next((f["type"] for f in schema.get("fields", []) if f["name"] == "ts"), None)
    scale = 1000 if isinstance(ts, dict) and ts.get("logicalType") == "timestamp-micros" else 1

    def decode(value: bytes) -> AvroRecord:
        doc: AvroRecord = json.loads(value)
        if scale != 1:
            doc["ts"] *= scale
        return doc

    return decode


def _batches(
    source: SourceArchive | Iterable[pa.RecordBatch], topic: str | None
) -> Iterator[tuple[str, pa.RecordBatch]]:
    if isinstance(source, SourceArchive):
        for chunk in source.list_chunks():
            yield chunk.topic, source.read(chunk)
        return
    if not topic:
        raise ValueError("write_connect_archive needs topic= when given record batches")
    for batch in source:
        yield topic, conform(batch)


def write_connect_archive(
    source: SourceArchive | Iterable[pa.RecordBatch],
    dest: Storage | str,
    *,
    topic: str | None = None,
    with_keys: bool = True,
    with_headers: bool = True,
    records_per_file: int = 1000,
    pad: int = 10,
    key_type: str = "string",
    value_schema: AvroRecord | None = None,
    to_value: Callable[[bytes], Any] | None = None,
    topics_dir: str = TOPICS_DIR,
    codec: str = "null",
) -> list[str]:
    """Write `source` (a SourceArchive, or envelope record batches of one `topic`, each
    partition in offset order) under `dest` in the Connect layout; returns the keys written.

    Files hold at most `records_per_file` records of one contiguous offset range; names pad
    the start offset to `pad` digits (the connector's default is 10). Values are decoded by
    `to_value` (default: JSON payments) into `value_schema` (default: `payment_schema()`),
    which becomes ["null", schema] in files holding a tombstone. Keys are Avro strings
    (`key_type="string"`, UTF-8 required) or bytes. `topics_dir=""` writes the topic
    folders straight under `dest`. Existing files of the same names are replaced.
    """
    if records_per_file < 1:
        raise ValueError("records_per_file must be at least 1")
    if key_type not in KEY_SCHEMAS:
        raise ValueError(f"key_type must be one of {', '.join(KEY_SCHEMAS)}, not {key_type!r}")
    store = open_storage(dest) if isinstance(dest, str) else dest
    value_schema = value_schema or payment_schema()
    to_value = to_value or _payment_decoder(value_schema)
    prefix = f"{topics_dir.strip('/')}/" if topics_dir.strip("/") else ""
    written: list[str] = []
    # Per (topic, partition): rows not yet written, as (offset, key, value, headers).
    pending: dict[tuple[str, int], list[_Row]] = {}
    last: dict[tuple[str, int], int] = {}  # last offset seen per (topic, partition)

    def flush(name: str, partition: int, rows: list[_Row]) -> None:
        stem = f"{prefix}{name}/partition={partition}/{name}+{partition}+{rows[0][0]:0{pad}d}"
        where = f"{name} partition {partition}"
        values = [to_value(r[2]) if r[2] is not None else None for r in rows]
        schema: Any = value_schema if all(v is not None for v in values) else ["null", value_schema]
        written.append(_write(store, stem + ".avro", schema, values, codec))
        if with_keys:
            keys: list[str | bytes | None] = [r[1] for r in rows]
            if key_type == "string":
                keys = [_text(r[1], f"{where} offset {r[0]}: key") for r in rows]
            written.append(_write(store, stem + KEYS_SUFFIX, KEY_SCHEMAS[key_type], keys, codec))
        if with_headers:
            headers = [
                [
                    {"key": h["key"], "value": _text(h["value"], f"{where} offset {r[0]}: header {h['key']!r}")}
                    for h in r[3]
                ]
                for r in rows
            ]
            nullable = any(h["value"] is None for hs in headers for h in hs)
            written.append(_write(store, stem + HEADERS_SUFFIX, headers_schema(nullable), headers, codec))

    for topic_name, batch in _batches(source, topic):
        parts, offsets, b_keys, b_values, b_headers = (
            batch.column(c).to_pylist() for c in ("partition", "offset", "key", "value", "headers")
        )
        for i in range(batch.num_rows):
            key = (topic_name, parts[i])
            rows = pending.setdefault(key, [])
            if key in last and offsets[i] <= last[key]:
                raise ValueError(f"{topic_name} partition {parts[i]}: offset {offsets[i]} follows {last[key]}")
            last[key] = offsets[i]
            if rows and (offsets[i] != rows[-1][0] + 1 or len(rows) >= records_per_file):
                flush(*key, rows)
                rows = pending[key] = []
            rows.append((offsets[i], b_keys[i], b_values[i], b_headers[i]))
    for (topic_name, partition), rows in sorted(pending.items()):
        if rows:
            flush(topic_name, partition, rows)
    return written


def _text(value: bytes | None, what: str) -> str | None:
    if value is None:
        return None
    try:
        return value.decode("utf-8")
    except UnicodeDecodeError:
        raise ValueError(f"{what} is not UTF-8; the connector stores it as an Avro string") from None


def _write(store: Storage, key: str, schema: Any, records: list[Any], codec: str) -> str:
    """One Avro file; the sync marker comes from the key, so same input, same bytes."""
    out = io.BytesIO()
    marker = hashlib.blake2b(key.encode(), digest_size=16).digest()
    fastavro.writer(out, fastavro.parse_schema(schema), records, codec=codec, sync_marker=marker)
    store.write(key, out.getvalue())
    return key

"""Reading the Kafka Connect S3 sink's Avro files, generic path: values (and keys or headers
of shapes without a compiled decoder) through fastavro, with logical types read raw, and
the rules that turn Connect values into key bytes."""

from __future__ import annotations

import base64
import io
import json
import math
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

import fastavro
import pyarrow as pa

from keygroups.envelope import HEADER_TYPE, CorruptFile, framing
from keygroups.errors import HeaderTruncated

_AVRO_HEADER = fastavro.parse_schema(
    {
        "type": "record",
        "name": "org.apache.avro.file.Header",
        "fields": [
            {"name": "magic", "type": {"type": "fixed", "name": "Magic", "size": 4}},
            {"name": "meta", "type": {"type": "map", "values": "bytes"}},
            {"name": "sync", "type": {"type": "fixed", "name": "Sync", "size": 16}},
        ],
    }
)
# Logical types read as their underlying Avro value: fastavro would build a datetime/date/
# time/UUID object per field, which costs time and hides the unit of a timestamp.
_RAW_LOGICAL = {
    "timestamp-millis",
    "timestamp-micros",
    "timestamp-nanos",
    "local-timestamp-millis",
    "local-timestamp-micros",
    "local-timestamp-nanos",
    "date",
    "time-millis",
    "time-micros",
    "uuid",
}


# --- values to bytes -------------------------------------------------------------------


def _json_default(obj: Any) -> Any:
    if isinstance(obj, (bytes, bytearray, memoryview)):
        # What Connect's JsonConverter does with BYTES: base64 text.
        return base64.b64encode(obj).decode("ascii")
    if isinstance(obj, Decimal):
        return str(obj)  # exact; a JSON number would round through a double
    raise TypeError(f"cannot encode {type(obj).__name__} as JSON")


_ENCODE = json.JSONEncoder(
    ensure_ascii=False, separators=(",", ":"), allow_nan=False, check_circular=False, default=_json_default
).encode


def _finite(obj: Any) -> Any:
    """`obj` with NaN and infinities as the strings Jackson writes for them by default."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return "NaN" if obj != obj else ("Infinity" if obj > 0 else "-Infinity")
    if isinstance(obj, dict):
        return {k: _finite(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_finite(v) for v in obj]
    return obj


def encode_json(obj: Any) -> str:
    """Compact JSON text of a decoded Avro datum (field order kept, non-ASCII kept, bytes as
    base64, decimals as exact strings, NaN/Infinity as strings)."""
    try:
        return _ENCODE(obj)
    except ValueError:  # allow_nan=False: only non-finite floats get here
        return _ENCODE(_finite(obj))


def scalar_bytes(obj: Any) -> str | bytes | None:
    """A key as bytes (str is encoded as UTF-8 by Arrow): strings as their UTF-8 text, bytes
    and fixed as they are, null as null, anything else as its compact JSON text."""
    if obj is None or isinstance(obj, (str, bytes)):
        return obj
    return encode_json(obj)


def binary_array(items: list[Any]) -> pa.Array:
    try:  # str, bytes and None convert in C; anything else takes the per-item rule
        return pa.array(items, pa.binary())
    except (pa.ArrowTypeError, pa.ArrowInvalid, TypeError):
        return pa.array([scalar_bytes(x) for x in items], pa.binary())


def header_array(items: list[list[dict[str, Any]] | None]) -> pa.Array:
    """Headers records ({key, value} dicts per record, None for none) as the envelope's
    list<header>: string and bytes values as they are, others by the key rule."""
    lists = [h if h is not None else [] for h in items]
    try:
        return pa.array(lists, pa.list_(HEADER_TYPE))
    except (pa.ArrowTypeError, pa.ArrowInvalid, TypeError):  # non-string values: the key rule
        return pa.array(
            [[{"key": x["key"], "value": scalar_bytes(x["value"])} for x in h] for h in lists],
            pa.list_(HEADER_TYPE),
        )


# --- schemas ----------------------------------------------------------------------------


def _raw_logical(schema: Any) -> tuple[Any, bool]:
    """`schema` without the logical types in _RAW_LOGICAL, and whether any was removed."""
    if isinstance(schema, list):
        out = [_raw_logical(s) for s in schema]
        return [s for s, _ in out], any(c for _, c in out)
    if not isinstance(schema, dict):
        return schema, False
    changed = False
    new = dict(schema)
    if new.get("logicalType") in _RAW_LOGICAL:
        del new["logicalType"]
        changed = True
    for key in ("type", "items", "values"):
        if isinstance(new.get(key), (dict, list)):
            new[key], c = _raw_logical(new[key])
            changed |= c
    if isinstance(new.get("fields"), list):
        fields = []
        for f in new["fields"]:
            t, c = _raw_logical(f.get("type"))
            fields.append({**f, "type": t})
            changed |= c
        new["fields"] = fields
    return new, changed


def branches(schema: Any) -> list[Any]:
    """The non-null branches of a union, or [schema]."""
    if isinstance(schema, list):
        return [s for s in schema if s != "null" and s != {"type": "null"}]
    return [schema]


def is_record(schema: Any) -> bool:
    return isinstance(schema, dict) and schema.get("type") in ("record", "error")


def short_schema(schema: Any) -> str:
    text = json.dumps(schema)
    return text if len(text) <= 120 else text[:117] + "..."


@dataclass(frozen=True)
class Avro:
    """One decoded Avro file: its schema as written (logical types intact) and its data."""

    schema: Any
    records: list[Any]


def file_schema(data: bytes, name: str) -> tuple[Any, dict[str, Any], int]:
    """(schema as written, header, header length) of an Avro object container file."""
    try:
        meta, sync, end = framing.read_header(memoryview(data), name)
        return json.loads(meta["avro.schema"]), {"magic": framing.MAGIC, "meta": meta, "sync": sync}, end
    except (HeaderTruncated, KeyError, ValueError) as exc:
        raise CorruptFile(f"{name}: not a readable Avro object container file ({exc})") from None


def read_avro(data: bytes, name: str, first_offset: int) -> Avro:
    """All records of one file, logical types read raw. Raises CorruptFile naming the file
    and the first offset that could not be read."""
    schema, head, head_end = file_schema(data, name)
    raw, changed = _raw_logical(schema)
    if changed:  # same block bytes, a header whose schema fastavro reads without conversion
        meta = dict(head["meta"], **{"avro.schema": json.dumps(raw).encode()})
        out = io.BytesIO()
        fastavro.schemaless_writer(out, _AVRO_HEADER, {**head, "meta": meta})
        data = out.getvalue() + data[head_end:]
    records: list[Any] = []
    try:
        records.extend(fastavro.reader(io.BytesIO(data), return_record_name=False))
    except Exception as exc:
        raise _truncation(name, first_offset, len(records), exc) from None
    return Avro(schema, records)


def _truncation(name: str, first_offset: int, done: int, exc: Exception) -> CorruptFile:
    return CorruptFile(
        f"{name}: truncated or corrupt Avro data after {done} records (at offset {first_offset + done}): "
        f"{type(exc).__name__}: {exc}"
    )


def unwrap(avro: Avro, field: str, struct: str) -> tuple[Any, list[Any]]:
    """Newer connector versions can write keys/headers "enveloped" in a one-field record
    (RecordKey{key} / RecordHeaders{headers}); give back the inner schema and data."""
    schema = avro.schema
    one = branches(schema)
    if len(one) == 1 and is_record(one[0]):
        fields = one[0].get("fields", [])
        if one[0].get("name", "").rpartition(".")[2] == struct and [f["name"] for f in fields] == [field]:
            return fields[0]["type"], [r[field] if r is not None else None for r in avro.records]
    return schema, avro.records

"""The Kafka Connect S3 sink's file formats, told apart by extension: how a values, keys or
headers file of AvroFormat, JsonFormat or ParquetFormat is decoded to Arrow, and the
checks a value schema must pass for `timestamp_field` and `key_field`."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Concatenate, ParamSpec, TypeVar

import pyarrow as pa

from compactor.sources.kafka_connect.avro import (
    Avro,
    binary_array,
    branches,
    encode_json,
    file_schema,
    header_array,
    is_record,
    read_avro,
    short_schema,
    unwrap,
)
from compactor.sources.kafka_connect.avro_keys_headers import (
    fast_headers,
    fast_keys,
    header_null_branch,
    key_null_branch,
)
from compactor.sources.kafka_connect.json_lines import gunzip, json_headers, json_keys, json_values
from compactor.sources.kafka_connect.parquet import parquet_headers, parquet_keys, parquet_values
from compactor.sources.kafka_connect.records import Values
from keygroups.envelope import CorruptFile
from keygroups.errors import OptionError

# Divisor from the timestamp field's unit to milliseconds.
_TS_DIVISOR = {
    None: 1,
    "timestamp-millis": 1,
    "local-timestamp-millis": 1,
    "timestamp-micros": 1_000,
    "local-timestamp-micros": 1_000,
    "timestamp-nanos": 1_000_000,
    "local-timestamp-nanos": 1_000_000,
}


def _avro_values(data: bytes, name: str, first: int, ts_field: str, key_field: str | None) -> Values:
    """Values by fastavro's generic reader (Connect values have arbitrary schemas)."""
    avro = read_avro(data, name, first)
    divisor = _check_value_schema(avro.schema, name, ts_field, key_field)
    values = avro.records
    try:
        texts = pa.array([encode_json(v) if v is not None else None for v in values], pa.binary())
    except TypeError as exc:
        raise CorruptFile(f"{name}: a value cannot be encoded as JSON: {exc}") from None
    ts = pa.array([v[ts_field] if v is not None else None for v in values], pa.int64())
    keys = binary_array([v[key_field] if v is not None else None for v in values]) if key_field else None
    return Values(texts, ts, divisor, keys)


def _avro_keys(data: bytes, name: str, first: int) -> pa.Array:
    null_branch = key_null_branch(file_schema(data, name)[0])
    if null_branch is not None:
        return fast_keys(data, name, first, null_branch)
    return binary_array(unwrap(read_avro(data, name, first), "key", "RecordKey")[1])


def _avro_headers(data: bytes, name: str, first: int) -> pa.Array:
    null_branch = header_null_branch(file_schema(data, name)[0])
    if null_branch is not None:
        return fast_headers(data, name, first, null_branch)
    return _generic_headers(read_avro(data, name, first), name)


@dataclass(frozen=True)
class FileFormat:
    """How one of the connector's formats (`format.class`, `keys.format.class`,
    `headers.format.class`) is decoded: (data, url, first offset, ...) -> Arrow."""

    values: Callable[[bytes, str, int, str, str | None], Values]
    keys: Callable[[bytes, str, int], pa.Array]
    headers: Callable[[bytes, str, int], pa.Array]


_Args = ParamSpec("_Args")
_Out = TypeVar("_Out")


def _gunzip_first(fn: Callable[Concatenate[bytes, str, _Args], _Out]) -> Callable[Concatenate[bytes, str, _Args], _Out]:
    """`fn` for gzipped files: their bytes decompressed before `fn` reads them."""

    def read(data: bytes, name: str, /, *args: _Args.args, **kwargs: _Args.kwargs) -> _Out:
        return fn(gunzip(data, name), name, *args, **kwargs)

    return read


AVRO = FileFormat(_avro_values, _avro_keys, _avro_headers)
JSON = FileFormat(json_values, json_keys, json_headers)
JSON_GZ = FileFormat(_gunzip_first(json_values), _gunzip_first(json_keys), _gunzip_first(json_headers))
PARQUET = FileFormat(parquet_values, parquet_keys, parquet_headers)
# Extensions exactly as the connector writes them: AvroFormat ".avro" (the codec lives in
# the file); JsonFormat ".json" + the s3.compression.type suffix ("" or ".gz"); ParquetFormat
# the parquet.codec's extension (parquet-mr's CompressionCodecName) + ".parquet". Keys and
# headers files put ".keys" / ".headers" before the extension.
EXTENSIONS: dict[str, FileFormat] = {
    ".avro": AVRO,
    ".json": JSON,
    ".json.gz": JSON_GZ,
    **{
        codec + ".parquet": PARQUET for codec in ("", ".snappy", ".gz", ".lzo", ".br", ".lz4hadoop", ".zstd", ".lz4raw")
    },
}


def _check_value_schema(schema: Any, name: str, ts_field: str, key_field: str | None) -> int:
    """The timestamp unit divisor; OptionError unless every record branch of the Avro value
    schema has the timestamp field (of a usable type) and the key field."""
    records = branches(schema)
    if not records or not all(is_record(r) for r in records):
        raise OptionError(
            f"{name}: timestamp_field {ts_field!r} needs record values; the value schema is {short_schema(schema)}"
        )
    divisors: set[int | None] = set()
    for rec in records:
        fields = {f["name"]: f["type"] for f in rec.get("fields", [])}
        for which, field in (("timestamp_field", ts_field), ("key_field", key_field)):
            if field is not None and field not in fields:
                raise OptionError(
                    f"{name}: {which} {field!r} is not a field of the value schema "
                    f"{rec.get('name', '?')} (fields: {', '.join(fields) or 'none'})"
                )
        divisors.add(_ts_divisor(fields[ts_field]))
    divisor = divisors.pop() if len(divisors) == 1 else None
    if divisor is None:
        types = [next(f["type"] for f in r["fields"] if f["name"] == ts_field) for r in records]
        raise OptionError(
            f"{name}: timestamp_field {ts_field!r} must be an int/long of epoch "
            f"milliseconds or a timestamp-millis/-micros/-nanos long; it is {' / '.join(map(short_schema, types))}"
        )
    return divisor


def _generic_headers(avro: Avro, hname: str) -> pa.Array:
    schema, items = unwrap(avro, "headers", "RecordHeaders")
    arrays = branches(schema)
    ok = (
        len(arrays) == 1
        and isinstance(arrays[0], dict)
        and arrays[0].get("type") == "array"
        and all(is_record(r) for r in branches(arrays[0].get("items")))
        and all({"key", "value"} <= {f["name"] for f in r["fields"]} for r in branches(arrays[0]["items"]))
    )
    if not ok:
        raise CorruptFile(
            f"{hname}: not a Kafka Connect headers file (an array of {{key, value}} records); "
            f"schema {short_schema(avro.schema)}"
        )
    return header_array(items)


def _ts_divisor(ftype: Any) -> int | None:
    """Divisor to milliseconds for a timestamp field type, None if it is not one."""
    one = branches(ftype)
    if len(one) != 1:
        return None
    t = one[0]
    if isinstance(t, str):
        return 1 if t in ("int", "long") else None
    if isinstance(t, dict) and t.get("type") in ("int", "long"):
        return _TS_DIVISOR.get(t.get("logicalType"))
    return None

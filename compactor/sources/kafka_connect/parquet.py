"""Reading the Kafka Connect S3 sink's ParquetFormat files (parquet-avro writing AvroData's
translation of the Connect schema; `parquet.codec` picks the compression) with pyarrow.

A value becomes compact JSON by the rules of the Avro path (`kafka_connect.avro`): columns
in file order, logical types as their underlying value (timestamps as epoch integers in
their own unit, dates as days, times as ms/µs of day), decimals as exact strings, bytes as
base64, maps as objects. Arrow columns are first cast to those plain types, so no datetime
or Decimal objects are built per value (`compactor.sources.plain_values`, shared with the
iceberg format); pyarrow has no JSON writer, so the text is made by `encode_json` row by
row.
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from compactor.sources.kafka_connect.avro import binary_array, encode_json, header_array
from compactor.sources.kafka_connect.records import Values
from compactor.sources.plain_values import UNIT_DIVISOR, plain
from keygroups.envelope import HEADER_TYPE, CorruptFile
from keygroups.errors import OptionError


def read_parquet(data: bytes, name: str) -> pa.RecordBatch:
    try:
        table = pq.read_table(pa.BufferReader(data), use_threads=False)
    except (pa.ArrowException, OSError) as exc:
        raise CorruptFile(f"{name}: not a readable Parquet file ({type(exc).__name__}: {exc})") from None
    return pa.RecordBatch.from_arrays([c.combine_chunks() for c in table.columns], schema=table.schema)


def _has_map(t: pa.DataType) -> bool:
    if pa.types.is_map(t):
        return True
    return any(_has_map(t.field(i).type) for i in range(t.num_fields)) if hasattr(t, "num_fields") else False


def _maps_as_objects(value: Any, t: pa.DataType) -> Any:
    """pyarrow gives a map as a list of (key, value) pairs: an object when keys are strings
    (Avro maps), else the pairs as arrays, as Connect's JsonConverter writes them."""
    if value is None:
        return None
    if pa.types.is_map(t):
        pairs = [(k, _maps_as_objects(v, t.item_type)) for k, v in value]
        return dict(pairs) if all(isinstance(k, str) for k, _ in pairs) else [list(p) for p in pairs]
    if pa.types.is_struct(t):
        return {f.name: _maps_as_objects(value[f.name], f.type) for f in t}
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        return [_maps_as_objects(v, t.value_type) for v in value]
    return value


def _pylist(arr: pa.Array) -> list[Any]:
    cast = plain(arr)
    items: list[Any] = cast.to_pylist()
    if _has_map(cast.type):
        items = [_maps_as_objects(v, cast.type) for v in items]
    return items


def _column(table: pa.RecordBatch, field: str, option: str, name: str) -> pa.Array:
    if field not in table.column_names:
        raise OptionError(
            f"{name}: {option} {field!r} is not a field of the value schema "
            f"(fields: {', '.join(table.column_names) or 'none'})"
        )
    return table.column(field)


def parquet_values(data: bytes, name: str, first: int, ts_field: str, key_field: str | None) -> Values:
    """Rows as compact JSON; parquet-avro cannot write a null record, so no tombstones."""
    table = read_parquet(data, name)
    ts = _column(table, ts_field, "timestamp_field", name)
    if pa.types.is_timestamp(ts.type):
        divisor = UNIT_DIVISOR[ts.type.unit]
    elif pa.types.is_integer(ts.type):
        divisor = 1
    else:
        raise OptionError(
            f"{name}: timestamp_field {ts_field!r} must be an integer of epoch milliseconds or a "
            f"timestamp (millis/micros/nanos); it is {ts.type}"
        )
    keys = _key_bytes(_column(table, key_field, "key_field", name)) if key_field else None
    texts = [encode_json(r) for r in _pylist(table.to_struct_array())]
    try:
        values = pa.array(texts, pa.binary())
    except TypeError as exc:
        raise CorruptFile(f"{name}: a value cannot be encoded as JSON: {exc}") from None
    return Values(values, ts.cast(pa.int64()), divisor, keys)


def _only_column(table: pa.RecordBatch, field: str, what: str, name: str) -> pa.Array:
    """The enveloped column (`RecordKey {key}` / `RecordHeaders {headers}`: the connector
    always envelopes keys and headers in Parquet), or a file's single column."""
    if field in table.column_names:
        return table.column(field)
    if table.num_columns == 1:
        return table.column(0)
    else:
        raise CorruptFile(
            f"{name}: not a Kafka Connect {what} file (one column {field!r}); columns: {', '.join(table.column_names)}"
        )


def _key_bytes(col: pa.Array) -> pa.Array:
    """A column by the key rule: strings as UTF-8, bytes as they are, others as compact JSON."""
    if pa.types.is_string(col.type) or pa.types.is_large_string(col.type) or pa.types.is_binary(col.type):
        return col.cast(pa.binary())
    return binary_array(_pylist(col))


def parquet_keys(data: bytes, name: str, first: int) -> pa.Array:
    """Keys by the key rule: strings as UTF-8, bytes as they are, others as compact JSON."""
    return _key_bytes(_only_column(read_parquet(data, name), "key", "keys", name))


def parquet_headers(data: bytes, name: str, first: int) -> pa.Array:
    """Headers: a list of {key, value} structs per record, values as UTF-8 (or bytes)."""
    col = _only_column(read_parquet(data, name), "headers", "headers", name)
    out = pa.list_(HEADER_TYPE)
    item = col.type.value_type if pa.types.is_list(col.type) or pa.types.is_large_list(col.type) else None
    if item is None or not pa.types.is_struct(item) or [f.name for f in item] != ["key", "value"]:
        raise CorruptFile(
            f"{name}: not a Kafka Connect headers file (a list of {{key, value}} structs); it is {col.type}"
        )
    try:
        return col.fill_null([]).cast(out) if col.null_count else col.cast(out)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError):  # other value types: the key rule
        return header_array(_pylist(col))

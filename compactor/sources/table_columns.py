"""Columns of a table source (Iceberg, Delta) as envelope columns: times as epoch
milliseconds, keys and values as bytes, a value decoded into columns as the JSON the Kafka
Connect source writes, a list of header structs (or a map) as envelope headers; and a read
table's rows as envelope records, wherever its layout keeps each field."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from compactor.sources.kafka_connect.avro import binary_array, encode_json
from compactor.sources.plain_values import UNIT_DIVISOR, plain
from compactor.sources.table_layouts import ColumnLayout, column
from keygroups.envelope import ARROW_SCHEMA, HEADER_TYPE, CorruptFile


def millis(ts: pa.Array) -> np.ndarray:
    """Epoch milliseconds, floored (writers store Kafka's milliseconds as micro- or nanoseconds;
    an integer column holds them as they are)."""
    if pa.types.is_integer(ts.type):
        as_is: np.ndarray = ts.cast(pa.int64()).to_numpy()
        return as_is
    ms: np.ndarray = ts.cast(pa.int64()).to_numpy() // UNIT_DIVISOR[ts.type.unit]
    return ms


def binary(a: pa.Array) -> pa.Array:
    """Bytes as they are, text as its UTF-8; a key or value decoded into another type (a
    struct, a number) as its compact JSON text, as the Kafka Connect source gives keys."""
    if pa.types.is_binary(a.type) or pa.types.is_string(a.type):
        return a.cast(pa.binary())
    if pa.types.is_large_binary(a.type) or pa.types.is_large_string(a.type):
        return a.cast(pa.large_binary()).cast(pa.binary())
    return binary_array(plain(a).to_pylist())


def json_values(table: pa.Table) -> pa.Array:
    """Value-schema mode: each row's value columns as the compact JSON object the Kafka
    Connect source writes (compactor.sources.kafka_connect.avro.encode_json)."""
    cols = {name: plain(table.column(name).combine_chunks()) for name in table.column_names}
    rows = pa.table(cols).to_pylist()
    return pa.array([encode_json(r).encode() for r in rows], pa.binary())


def envelope_headers(h: pa.Array, where: str) -> pa.Array:
    """A list<struct<key, value>> column as envelope headers: null lists as empty, keys as
    text (older Redpanda wrote them as binary: UTF-8); `where` names the data files in errors.
    A map<key, value> column (writers that keep headers as a map) reads as its entries in order."""
    if pa.types.is_map(h.type):
        entries = pa.StructArray.from_arrays([h.keys, h.items], names=["key", "value"])
        h = pa.ListArray.from_arrays(h.offsets, entries, mask=h.is_null())
    lengths = pc.list_value_length(h).fill_null(0).to_numpy()
    offsets = np.zeros(len(lengths) + 1, np.int32)
    np.cumsum(lengths, out=offsets[1:])
    values = pc.list_flatten(h)
    hk = pc.struct_field(values, "key")
    if hk.null_count:
        raise CorruptFile(f"{where}: {hk.null_count} headers without a key")
    try:
        hk = hk.cast(pa.string())
    except pa.ArrowInvalid as exc:
        raise CorruptFile(f"{where}: a header key is not UTF-8 text: {exc}") from None
    has_value = values.type.get_field_index("value") >= 0
    hv = binary(pc.struct_field(values, "value")) if has_value else pa.nulls(len(values), pa.binary())
    struct = pa.StructArray.from_arrays([hk, hv], fields=list(HEADER_TYPE))
    return pa.ListArray.from_arrays(pa.array(offsets), struct)


def without_views(table: pa.Table) -> pa.Table:
    """The table with Arrow's view types as their plain forms: writers that keep an Arrow
    schema in the Parquet footer (delta-rs after a DELETE or MERGE) give binary_view and
    string_view columns, which this pyarrow cannot take or sort."""

    def plain_type(t: pa.DataType) -> pa.DataType:
        if t == pa.binary_view():
            return pa.binary()
        if t == pa.string_view():
            return pa.string()
        if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_list_view(t):
            return pa.list_(pa.field(t.value_field.name, plain_type(t.value_type), t.value_field.nullable))
        if pa.types.is_struct(t):
            return pa.struct([pa.field(f.name, plain_type(f.type), f.nullable) for f in t])
        return t

    schema = pa.schema([pa.field(f.name, plain_type(f.type), f.nullable, f.metadata) for f in table.schema])
    return table if schema.equals(table.schema) else table.cast(schema)


def envelope_batch(table: pa.Table, layout: ColumnLayout, values: list[str], p: int, where: str) -> pa.RecordBatch:
    """A read table's rows, in the order given, as envelope records: each field from the
    column `layout` names; without a value column, the JSON of the `values` columns."""
    n = table.num_rows
    ts = column(table, layout.timestamp)
    if ts.null_count:
        raise CorruptFile(f"{where}: {ts.null_count} rows of partition {p} without a timestamp ({layout.timestamp})")

    def either(path: str | None) -> pa.Array:
        return binary(column(table, path)) if path is not None else pa.nulls(n, pa.binary())

    value = either(layout.value) if layout.value is not None else json_values(table.select(values))
    headers = (
        envelope_headers(column(table, layout.headers), where)
        if layout.headers is not None
        else pa.array([[]] * n, pa.list_(HEADER_TYPE))
    )
    return pa.RecordBatch.from_arrays(
        [
            column(table, layout.partition).cast(pa.int32()),
            column(table, layout.offset).cast(pa.int64()),
            pa.array(millis(ts), pa.timestamp("ms", tz="UTC")),
            either(layout.key),
            value,
            headers,
        ],
        schema=ARROW_SCHEMA,
    )

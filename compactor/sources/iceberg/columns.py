"""Redpanda Iceberg Topics' columns as `--format iceberg` reads them: the types the
`redpanda` struct must have, and the conversions of its columns and the value's to envelope
columns."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from compactor.sources.kafka_connect.avro import encode_json
from compactor.sources.plain_values import UNIT_DIVISOR, plain
from keygroups.envelope import HEADER_TYPE, CorruptFile

if TYPE_CHECKING:  # pyiceberg is imported where a table is opened
    from pyiceberg.schema import Schema
    from pyiceberg.table import FileScanTask
    from pyiceberg.types import NestedField, StructType

RP = "redpanda"


def needed_types() -> dict[str, tuple[type, ...]]:
    from pyiceberg.types import (
        IntegerType,
        LongType,
        TimestampNanoType,
        TimestampType,
        TimestamptzNanoType,
        TimestamptzType,
    )

    times = (TimestamptzType, TimestampType, TimestamptzNanoType, TimestampNanoType)  # older Redpanda: timestamp
    return {"partition": (IntegerType, LongType), "offset": (LongType, IntegerType), "timestamp": times}


def struct_field(struct: StructType, name: str) -> NestedField | None:
    try:
        return struct.field_by_name(name)
    except (AttributeError, ValueError):
        return None


def millis(ts: pa.Array) -> np.ndarray:
    """Epoch milliseconds, floored (Redpanda writes Kafka's milliseconds as microseconds;
    _check_schema admits only timestamp types)."""
    ms: np.ndarray = ts.cast(pa.int64()).to_numpy() // UNIT_DIVISOR[ts.type.unit]
    return ms


def slim(task: FileScanTask) -> FileScanTask:
    """A scan task without the manifest's per-column statistics (less than half the pickled size)."""
    from pyiceberg.manifest import DataFile, DataFileContent
    from pyiceberg.table import FileScanTask

    f = task.file
    slim = DataFile.from_args(
        content=DataFileContent.DATA,
        file_path=f.file_path,
        file_format=f.file_format,
        partition=f.partition,
        record_count=f.record_count,
        file_size_in_bytes=f.file_size_in_bytes,
    )
    slim.spec_id = f.spec_id
    return FileScanTask(slim)


def parquet_paths(file_schema: pa.Schema, schema: Schema) -> dict[str, str]:
    """Parquet column path -> "partition" / "offset", matched by Iceberg field id (a renamed
    column keeps its id), or by the table's names when the file carries no ids."""
    ids = {schema.find_field(f"{RP}.{name}").field_id: name for name in ("partition", "offset")}
    rp_id = schema.find_field(RP).field_id

    def field_id(field: pa.Field) -> int | None:
        raw = (field.metadata or {}).get(b"PARQUET:field_id")
        return int(raw) if raw is not None else None

    out: dict[str, str] = {}
    for top in file_schema:
        if field_id(top) == rp_id and pa.types.is_struct(top.type):
            out.update({f"{top.name}.{c.name}": ids[i] for c in top.type if (i := field_id(c)) in ids})
    return out or {f"{RP}.{name}": name for name in ids.values()}


def binary(a: pa.Array) -> pa.Array:
    return a.cast(pa.binary())


def json_values(table: pa.Table) -> pa.Array:
    """Value-schema mode: each row's value columns as the compact JSON object the Kafka
    Connect source writes (compactor.sources.kafka_connect.avro.encode_json)."""
    cols = {name: plain(table.column(name).combine_chunks()) for name in table.column_names}
    rows = pa.table(cols).to_pylist()
    return pa.array([encode_json(r).encode() for r in rows], pa.binary())


def envelope_headers(h: pa.Array, where: str) -> pa.Array:
    """A list<struct<key, value>> column as envelope headers: null lists as empty, keys as
    text (older Redpanda wrote them as binary: UTF-8); `where` names the data files in errors."""
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

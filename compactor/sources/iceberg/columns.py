"""Redpanda Iceberg Topics' columns as `--format iceberg` reads them: the types the
`redpanda` struct must have, and where its partition and offset lie in a Parquet file
(the conversions to envelope columns are `compactor.sources.table_columns`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pyarrow as pa

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

"""An Iceberg table's columns as `--format iceberg` reads them: a scan task made light enough
to travel to every task, and where the layout's partition and offset columns lie in a Parquet
file (found by field id, so a renamed column is still found)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pyarrow as pa

if TYPE_CHECKING:  # pyiceberg is imported where a table is opened
    from pyiceberg.schema import Schema
    from pyiceberg.table import FileScanTask

    from compactor.sources.table_layouts import ColumnLayout


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


def parquet_paths(file_schema: pa.Schema, schema: Schema, layout: ColumnLayout) -> dict[str, str]:
    """Parquet column path -> "partition" / "offset", matched by Iceberg field id (a renamed
    column keeps its id), or by the table's names when the file carries no ids."""
    ids = {schema.find_field(getattr(layout, name)).field_id: name for name in ("partition", "offset")}

    def field_id(field: pa.Field) -> int | None:
        raw = (field.metadata or {}).get(b"PARQUET:field_id")
        return int(raw) if raw is not None else None

    out: dict[str, str] = {}

    def walk(fields: list[pa.Field], prefix: str) -> None:
        for f in fields:
            if (i := field_id(f)) in ids:
                out[prefix + f.name] = ids[i]
            elif pa.types.is_struct(f.type):
                walk(list(f.type), f"{prefix}{f.name}.")

    walk(list(file_schema), "")
    return out or {getattr(layout, name): name for name in ids.values()}

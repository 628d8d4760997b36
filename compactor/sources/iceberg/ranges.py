"""Where an Iceberg data file's rows lie, from its manifest entry's bounds (the chunks are
cut by `compactor.sources.offset_ranges`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pyiceberg is imported where a table is opened
    from pyiceberg.types import IcebergType


@dataclass(frozen=True)
class DataFileBounds:
    """One data file and where its rows lie: partitions plo..phi, offsets olo..ohi."""

    index: int  # into IcebergSource._tasks
    plo: int
    phi: int
    olo: int
    ohi: int
    records: int
    size: int


def int_bound(column_type: IcebergType, raw: bytes) -> int:
    """A manifest's lower or upper bound of a data file's partition or offset column: an int
    or a long (`IcebergSource._check_schema` admits no other type)."""
    from pyiceberg.conversions import from_bytes
    from pyiceberg.types import PrimitiveType

    assert isinstance(column_type, PrimitiveType), column_type
    return int(from_bytes(column_type, raw))  # typed as giving any literal type; an int column's is an int

"""The rows `format("keyfill")` hands to Spark: the schema of Spark's Kafka source, so a query
written for `format("kafka")` runs unchanged, then keyfill's own two columns.

    key, value, topic, partition, offset, timestamp, timestampType, [headers], key_group, slice

`headers` is there only with `includeHeaders=true`, as in the Kafka source: a nested column
costs every query that carries it, read or not. `timestampType` is 0 (CreateTime) in the
archive phase (the archive keeps no timestamp type) and what the broker says in the live phase.
"""

from __future__ import annotations

from collections.abc import Iterator
from functools import cache

import numpy as np
import pyarrow as pa

CREATE_TIME = 0  # Kafka's TimestampType ids, as Spark's Kafka source gives them
LOG_APPEND_TIME = 1
NO_TIMESTAMP_TYPE = -1
HEADERS = pa.list_(pa.field("element", pa.struct([("key", pa.string()), ("value", pa.binary())])))

_KAFKA_FIELDS = [  # Spark refuses batches whose Arrow types differ (timestamps in microseconds, int32 for int)
    ("key", pa.binary(), "binary"),
    ("value", pa.binary(), "binary"),
    ("topic", pa.string(), "string"),
    ("partition", pa.int32(), "int"),
    ("offset", pa.int64(), "long"),
    ("timestamp", pa.timestamp("us", tz="UTC"), "timestamp"),
    ("timestampType", pa.int32(), "int"),
]
_HEADERS_FIELD = ("headers", HEADERS, "array<struct<key: string, value: binary>>")
_OWN_FIELDS = [("key_group", pa.int32(), "int"), ("slice", pa.int32(), "int")]


def _fields(include_headers: bool) -> list[tuple[str, pa.DataType, str]]:
    return _KAFKA_FIELDS + ([_HEADERS_FIELD] if include_headers else []) + _OWN_FIELDS


@cache  # one per setting: every batch handed to Spark is built against it
def arrow_schema(include_headers: bool = False) -> pa.Schema:
    """What read() yields, field for field."""
    return pa.schema([pa.field(name, t) for name, t, _ in _fields(include_headers)])


def schema_ddl(include_headers: bool = False) -> str:
    """The same schema as Spark's DDL string (what `DataSource.schema` returns)."""
    return ", ".join(f"`{name}` {ddl}" for name, _, ddl in _fields(include_headers))


class Constants:
    """Columns whose every row holds one value (the topic, timestampType, a step's group):
    one array per value, grown to the longest batch asked for, handed out as zero-copy
    slices, so a batch pays nothing per row for them."""

    def __init__(self) -> None:
        self._arrays: dict[tuple[object, pa.DataType], pa.Array] = {}

    def column(self, value: object, kind: pa.DataType, n: int) -> pa.Array:
        have = self._arrays.get((value, kind))
        if have is None or len(have) < n:
            have = pa.repeat(pa.scalar(value, kind), max(n, 2 * len(have) if have is not None else n))
            self._arrays[(value, kind)] = have
        return have.slice(0, n)


def to_spark_batches(
    batch: pa.RecordBatch,
    topic: str,
    group: int,
    s: int | np.ndarray,
    rows: int,
    include_headers: bool = False,
    constants: Constants | None = None,
) -> Iterator[pa.RecordBatch]:
    """An envelope batch of the archive as the source's schema (`s`: the slice of every
    record, or one per record), in batches of at most `rows` records; `constants`: the
    caller's, kept from batch to batch."""
    n = batch.num_rows
    const = constants or Constants()
    columns = [
        batch.column("key"),
        batch.column("value"),
        const.column(topic, pa.string(), n),
        batch.column("partition"),
        batch.column("offset"),
        batch.column("timestamp").cast(pa.timestamp("us", tz="UTC")),
        const.column(CREATE_TIME, pa.int32(), n),
    ]
    if include_headers:
        columns.append(batch.column("headers").cast(HEADERS))
    columns.append(const.column(group, pa.int32(), n))
    columns.append(const.column(s, pa.int32(), n) if np.ndim(s) == 0 else pa.array(np.asarray(s, np.int32)))
    out = pa.RecordBatch.from_arrays(columns, schema=arrow_schema(include_headers))
    for start in range(0, n, rows):
        yield out.slice(start, rows)

"""The rows `format("keyfill")` hands to Spark: the schema of Spark's Kafka source, so a query
written for `format("kafka")` runs unchanged, then keyfill's own two columns.

    key, value, topic, partition, offset, timestamp, timestampType, [headers], key_group, slice

`headers` is there only with `includeHeaders=true`, as in the Kafka source: a nested column
costs every query that carries it, read or not. `timestampType` is 0 (CreateTime) in the
archive phase (the archive keeps no timestamp type) and what the broker says in the live phase.

A query may give the source a schema of fewer of these columns, in any order (`projection`):
PySpark tells a Python source no column a query leaves unused, and each one handed over
costs the JVM per row.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from functools import cache

import numpy as np
import pyarrow as pa

from keygroups.batch_join import join_batches
from reader.errors import DataSourceOptionError

CREATE_TIME = 0  # Kafka's TimestampType ids, as Spark's Kafka source gives them
LOG_APPEND_TIME = 1
NO_TIMESTAMP_TYPE = -1
TIMESTAMP = pa.timestamp("us", tz="UTC")  # how Spark takes a timestamp column from Arrow
HEADERS = pa.list_(pa.field("element", pa.struct([("key", pa.string()), ("value", pa.binary())])))

# Spark refuses batches whose Arrow types differ (timestamps in microseconds, int32 for int).
# The third item is the Spark type as DDL, written as Spark prints it (`DataType.simpleString`).
_KAFKA_FIELDS = [
    ("key", pa.binary(), "binary"),
    ("value", pa.binary(), "binary"),
    ("topic", pa.string(), "string"),
    ("partition", pa.int32(), "int"),
    ("offset", pa.int64(), "bigint"),
    ("timestamp", TIMESTAMP, "timestamp"),
    ("timestampType", pa.int32(), "int"),
]
_HEADERS_FIELD = ("headers", HEADERS, "array<struct<key:string,value:binary>>")
_OWN_FIELDS = [("key_group", pa.int32(), "int"), ("slice", pa.int32(), "int")]


def _fields(include_headers: bool) -> list[tuple[str, pa.DataType, str]]:
    return _KAFKA_FIELDS + ([_HEADERS_FIELD] if include_headers else []) + _OWN_FIELDS


@cache  # one per setting: every batch handed to Spark is built against it
def arrow_schema(include_headers: bool = False, columns: tuple[str, ...] | None = None) -> pa.Schema:
    """What read() yields, field for field: every column, or those of a query's schema."""
    types = {name: t for name, t, _ in _fields(True)}
    names = columns if columns is not None else [name for name, _, _ in _fields(include_headers)]
    return pa.schema([pa.field(name, types[name]) for name in names])


def projection(given: Sequence[tuple[str, str, bool]], include_headers: bool) -> tuple[str, ...] | None:
    """The columns a query's schema asks for: `given` is its (name, Spark type as
    `simpleString`, nullable) fields. None when they are the source's own (no schema given);
    a field the source has not, of another type or NOT NULL is refused by name."""
    ours = {name: ddl for name, _, ddl in _fields(True)}
    if [(name, ddl) for name, ddl, _ in given] == [(n, d) for n, _, d in _fields(include_headers)]:
        return None
    for name, ddl, nullable in given:
        if name not in ours:
            like = [n for n in ours if n.lower() == name.lower()]
            raise DataSourceOptionError(
                f"schema: the keyfill source has no column {name!r}"
                + (f" (it has {like[0]!r}: names are as the source spells them)" if like else "")
                + f"; a schema names some of {', '.join(ours)}, in any order"
            )
        if ddl != ours[name]:
            raise DataSourceOptionError(f"schema: column {name} is {ours[name]} in the keyfill source, not {ddl}")
        if not nullable:
            raise DataSourceOptionError(
                f"schema: column {name} NOT NULL: the keyfill source's columns are nullable, as the Kafka source's are"
            )
    names = tuple(name for name, _, _ in given)
    if not names:
        raise DataSourceOptionError(f"schema: no column; a schema names some of {', '.join(ours)}")
    if len(set(names)) < len(names):
        raise DataSourceOptionError(f"schema: a column named twice in {', '.join(names)}")
    return names


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
    columns: tuple[str, ...] | None = None,
) -> Iterator[pa.RecordBatch]:
    """An envelope batch of the archive as the source's schema (`s`: the slice of every
    record, or one per record), in batches of at most `rows` records; `constants`: the
    caller's, kept from batch to batch; `columns`: a query's schema's, built alone."""
    n = batch.num_rows
    const = constants or Constants()
    make: dict[str, Callable[[], pa.Array]] = {
        "key": lambda: batch.column("key"),
        "value": lambda: batch.column("value"),
        "topic": lambda: const.column(topic, pa.string(), n),
        "partition": lambda: batch.column("partition"),
        "offset": lambda: batch.column("offset"),
        "timestamp": lambda: batch.column("timestamp").cast(TIMESTAMP),
        "timestampType": lambda: const.column(CREATE_TIME, pa.int32(), n),
        "headers": lambda: batch.column("headers").cast(HEADERS),
        "key_group": lambda: const.column(group, pa.int32(), n),
        "slice": lambda: const.column(s, pa.int32(), n) if np.ndim(s) == 0 else pa.array(np.asarray(s, np.int32)),
    }
    schema = arrow_schema(include_headers, columns)
    out = pa.RecordBatch.from_arrays([make[name]() for name in schema.names], schema=schema)
    for start in range(0, n, rows):
        yield out.slice(start, rows)


# Decoded bytes a batch handed to Spark gathers at most, whatever `batchSize` allows: a task
# holds one such batch beyond its read-ahead (`reader.read_budget`), so records of 1 MB keep it small.
HANDOFF_BYTES = 16 << 20
# Compressed bytes of pieces a Spark task decodes at once (the replay's threads: 1 MiB,
# `reader.fetched_span.DECODE_BYTES`): ~64K records of a typical topic, so a decode step is
# about a hand-off batch and `coalesced` seldom copies steps together. The 10M-record
# source-only query took 0.86-0.91x the time it took with 1 MiB steps
# (docs/performance.md#hand-off-batches).
STEP_BYTES = 4 << 20


def coalesced(batches: Iterable[pa.RecordBatch], rows: int, max_bytes: int = HANDOFF_BYTES) -> Iterator[pa.RecordBatch]:
    """Consecutive batches joined, in order, into batches of at most `rows` rows (and
    `max_bytes`, but one batch at least); empty ones dropped. The JVM takes each batch at a
    cost of its own (0.74 us of JVM CPU a row in batches of 16K rows, 0.55 in batches of 64K:
    docs/performance.md#hand-off-batches), and a decode step can fall short of `rows`: the
    end of a group, a filter, pieces larger than STEP_BYTES."""
    pending: list[pa.RecordBatch] = []
    n = size = 0
    for b in batches:
        if not b.num_rows:
            continue  # nothing to hand over (and Arrow joins no rows into no batch at all)
        if pending and (n + b.num_rows > rows or size + b.nbytes > max_bytes):
            yield join_batches(pending)
            pending, n, size = [], 0, 0
        pending.append(b)
        n, size = n + b.num_rows, size + b.nbytes
    if pending:
        yield join_batches(pending)

"""Which of the filters Spark pushes to a batch read (`DataSourceReader.pushFilters`, PySpark
>= 4.1 with `spark.sql.python.filterPushdown.enabled`) the archive can use, and how.

Spark hands over the conjuncts of a query's filter it can express (`partition = 1`,
`key_group IN (2, 3)`, `timestamp >= ...`, their `IS NOT NULL`); a filter the source keeps is
not evaluated again, so a kept filter must hold exactly: every row the source yields matches
it, and every row of the read that matches it is yielded. Column by column:

- `key_group` (=, <=>, IN, <, <=, >, >=, NOT = and NOT IN, IS NOT NULL): a piece is one
  group's records of one slice, so the pieces of other groups are not read. Exact for the
  archive; records of the live phase carry the group by the archive's assignment (null for a
  key it lacks), so there the filter is a row filter.
- `slice` (the same): a piece is one slice, so skipping pieces is exact. Records of the live
  phase have a null slice, which no comparison matches: a query that filters on `slice`
  has no live phase.
- `partition` (the same): a piece holds every partition's records, so a row filter in
  `read()`; a live range is one partition: dropped whole.
- `topic` (=, <=>, IN, NOT = and NOT IN, IS NOT NULL): the archive phase's rows all hold the
  archive's topic, the live phase's the topic read, so each phase is read whole or not at all.
- `timestamp` (<, <=, >, >=, =, <=>, IN): each piece's index row holds its records' least and
  greatest timestamp, so a piece that cannot hold a match is not read. That skips
  pieces but leaves rows that do not match, so the filter goes back to Spark. Planning
  also starts late enough for a lower bound T: a record sits in the slice of its partition's
  running maximum of timestamps, so a record at or after T is in a slice ending after T.
  An upper bound moves no slice: a late record's timestamp can lie far below its slice's
  start, so a record before T can be in any later slice (only the pieces' least timestamps
  tell).

Everything else (`key`, `value`, `offset`, `headers`, string matching, a NOT of anything
else, values of another type) goes back to Spark unused.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from keygroups import compacted
from reader.spark.api import (  # stand-ins before Spark 4.1, where nothing is ever pushed
    EqualNullSafe,
    EqualTo,
    Filter,
    GreaterThan,
    GreaterThanOrEqual,
    In,
    IsNotNull,
    LessThan,
    LessThanOrEqual,
    Not,
)

# the columns whose filters the source applies exactly, and the type their values must have
EXACT = {"key_group": int, "slice": int, "partition": int, "topic": str}
COMPARE = {
    EqualTo: pc.equal,
    EqualNullSafe: pc.equal,  # the same where the value is not null: the columns' rows with null never match it
    GreaterThan: pc.greater,
    GreaterThanOrEqual: pc.greater_equal,
    LessThan: pc.less,
    LessThanOrEqual: pc.less_equal,
}
ORDERED = (GreaterThan, GreaterThanOrEqual, LessThan, LessThanOrEqual)
EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)


def _column(f: Filter) -> str | None:
    path: tuple[str, ...] = getattr(f, "attribute", ())
    return path[0] if len(path) == 1 else None


def _values(f: Filter) -> list[Any]:
    return list(f.value) if isinstance(f, In) else [_value(f)]


def _value(f: Filter) -> Any:
    """The value of a comparison (a key of COMPARE), which pyspark's Filter base class lacks."""
    return f.value  # type: ignore[attr-defined]  # callers pass only COMPARE's filters, which mypy cannot see


def _exact(f: Filter) -> str | None:
    """The column of a filter the source can apply exactly, else None."""
    inner = f.child if isinstance(f, Not) else f
    column = _column(inner)
    if column is None:
        return None
    kind = EXACT.get(column)
    if kind is None:
        return None
    if isinstance(inner, IsNotNull):
        return None if inner is not f else column
    if inner is not f and not isinstance(inner, (EqualTo, In)):  # NOT (a <=> v) holds for a null a
        return None
    if not isinstance(inner, (In, *COMPARE)) or (kind is str and isinstance(inner, ORDERED)):
        return None
    values = _values(inner)
    return column if values and all(type(v) is kind for v in values) else None


def holds(f: Filter, values: pa.Array | pa.ChunkedArray) -> pa.Array | pa.ChunkedArray:
    """Where an exact filter holds over a column's values, as SQL has it: a null value never
    matches (a NOT of a comparison with null is null too)."""
    inner = f.child if isinstance(f, Not) else f
    if isinstance(inner, IsNotNull):
        return pc.is_valid(values)
    if values.type != pa.string():
        values = values.cast(pa.int64())
    if isinstance(inner, In):
        match = pc.is_in(values, value_set=pa.array(inner.value, values.type))
    else:
        match = COMPARE[type(inner)](values, pa.scalar(_value(inner), values.type))
    if inner is not f:
        match = pc.invert(match)
    return pc.fill_null(pc.and_(match, pc.is_valid(values)), False)


def _micros(t: object) -> int | None:
    """A timestamp filter's value in microseconds since the epoch (None: not an aware datetime)."""
    if not isinstance(t, datetime) or t.tzinfo is None:
        return None
    return (t - EPOCH) // timedelta(microseconds=1)


def _time_range(f: Filter) -> tuple[int | None, int | None] | None:
    """The least and greatest timestamp (us, inclusive; None: open) a row matching a timestamp
    filter can have; None: a filter this cannot bound."""
    if _column(f) != "timestamp" or not isinstance(f, (In, *COMPARE)):
        return None
    found = [_micros(v) for v in _values(f)]
    us = [u for u in found if u is not None]
    if not us or len(us) < len(found):
        return None
    if isinstance(f, (GreaterThan, GreaterThanOrEqual)):
        return us[0] + isinstance(f, GreaterThan), None
    if isinstance(f, (LessThan, LessThanOrEqual)):
        return None, us[0] - isinstance(f, LessThan)
    return min(us), max(us)


@dataclass(frozen=True)
class RowFilter:
    """Exact filters applied to the rows a task reads (column, filter)."""

    filters: tuple[tuple[str, Filter], ...]

    def keep(self, batch: pa.RecordBatch) -> np.ndarray:
        mask = np.ones(batch.num_rows, bool)
        for column, f in self.filters:
            mask &= holds(f, batch.column(column)).to_numpy(zero_copy_only=False)
        return mask

    def apply(self, batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            kept = batch.filter(self.keep(batch))
            if kept.num_rows:
                yield kept


@dataclass(frozen=True)
class Pushdown:
    """The filters a batch read takes (none by default): exact ones by column, and the
    bounds on timestamps (us, inclusive) that only skip pieces."""

    exact: tuple[tuple[str, Filter], ...] = ()
    times: tuple[tuple[int | None, int | None], ...] = ()

    def on(self, *columns: str) -> tuple[tuple[str, Filter], ...]:
        return tuple((c, f) for c, f in self.exact if c in columns)

    def _all(self, column: str, value: object, kind: pa.DataType) -> bool:
        return all(holds(f, pa.array([value], kind))[0].as_py() for _, f in self.on(column))

    def has_topic(self, topic: str) -> bool:
        """The rows of a phase whose rows all hold `topic` can match."""
        return self._all("topic", topic, pa.string())

    def has_partition(self, partition: int) -> bool:
        """Records of this Kafka partition can match."""
        return self._all("partition", partition, pa.int64())

    def live(self, topic: str) -> bool:
        """Records of the live phase can match (their slice is null)."""
        return not self.on("slice") and self.has_topic(topic)

    def slice_range(self, first: int, end: int, manifest: compacted.Manifest) -> tuple[int, int]:
        """Slices [first, end) narrowed to those the filters on `slice` and the lower bounds
        on `timestamp` let in (a record at or after T lies in a slice ending after T)."""
        lo, hi = first, end
        for _, f in self.on("slice"):
            if isinstance(f, (EqualTo, EqualNullSafe, In)):
                lo, hi = max(lo, min(_values(f))), min(hi, max(_values(f)) + 1)
            elif isinstance(f, (GreaterThan, GreaterThanOrEqual)):
                lo = max(lo, f.value + isinstance(f, GreaterThan))
            elif isinstance(f, (LessThan, LessThanOrEqual)):
                hi = min(hi, f.value + isinstance(f, LessThanOrEqual))
        d, base = manifest.slice_duration_ms, manifest.base
        for least, _ in self.times:
            if least is not None:
                lo = max(lo, -(-least // 1000) // d - base)  # the slice holding the first ms at or after it
        lo = min(max(lo, first), end)
        return lo, max(lo, min(hi, end))

    def pieces(self, table: pa.Table) -> pa.Table:
        """The piece index rows whose pieces can hold a match."""
        mask = np.ones(table.num_rows, bool)
        for column, f in self.on("key_group", "slice"):
            mask &= holds(f, table.column("group" if column == "key_group" else "slice")).to_numpy()
        least = table.column("min_timestamp").to_numpy() * 1000
        most = table.column("max_timestamp").to_numpy() * 1000
        for lo, hi in self.times:
            if lo is not None:
                mask &= most >= lo
            if hi is not None:
                mask &= least <= hi
        return table.filter(mask)

    def rows(self, *columns: str) -> RowFilter | None:
        """The exact filters on these columns, as a row filter (None: none)."""
        on = self.on(*columns)
        return RowFilter(on) if on else None


def push(filters: list[Filter]) -> tuple[Pushdown, list[Filter]]:
    """What the source takes of Spark's pushed filters, and the filters Spark must still
    evaluate (the same objects, as pushFilters must return them)."""
    exact, times, rest = [], [], []
    for f in filters:
        column = _exact(f)
        if column is not None:
            exact.append((column, f))
            continue
        bounds = _time_range(f)
        if bounds is not None:
            times.append(bounds)
        rest.append(f)
    return Pushdown(tuple(exact), tuple(times)), rest

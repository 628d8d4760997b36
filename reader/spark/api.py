"""What the running PySpark's Python Data Source API offers, found by feature, not by version:
the Spark source imports its classes from here, so that it imports on every supported Spark.

- `DATA_SOURCES`: the API itself (`pyspark.sql.datasource`, streaming readers included):
  Spark 4.0, and Databricks' 3.5 runtimes that backported it (15.3 and later). Open-source 3.5
  has none: `format("keyfill")` is refused there (`require_data_sources`).
- `FILTER_PUSHDOWN`: `Filter` and its subclasses, which a batch reader's `pushFilters` takes
  (Spark 4.1).
- `ADMISSION_CONTROL`: `pyspark.sql.streaming.datasource` (Spark 4.2, SPARK-55304): Spark
  passes `latestOffset(start, limit)` its read limits and runs Trigger.AvailableNow in as
  many micro-batches as the limits make (`SupportsTriggerAvailableNow`). Before it, Spark
  calls `latestOffset()` with no arguments and runs Trigger.AvailableNow as ONE micro-batch.

A class the running PySpark lacks is an inert stand-in of the same name: Spark cannot hand
the source an object of it, so its `isinstance` tests are false and its subclasses are plain
classes. The read limits are the exception: before 4.2 the source makes its own default
limit (`reader.spark.admission.default_read_limit`) and reads it as 4.2's admission control
does, so their stand-ins keep the one field each has in PySpark. Code that needs a feature
asks its flag first."""

from __future__ import annotations

import dataclasses
import importlib
from typing import TYPE_CHECKING, Any

from reader.errors import DataSourceUnavailable

_API_MODULE = "pyspark.sql.datasource"
_STREAMING = "pyspark.sql.streaming.datasource"
_CORE = ["DataSource", "DataSourceReader", "DataSourceStreamReader", "InputPartition"]
_FILTERS = [
    "Filter",
    "EqualNullSafe",
    "EqualTo",
    "GreaterThan",
    "GreaterThanOrEqual",
    "In",
    "IsNotNull",
    "LessThan",
    "LessThanOrEqual",
    "Not",
]
_LIMITS = [
    "ReadLimit",
    "ReadAllAvailable",
    "ReadMaxBytes",
    "ReadMaxFiles",
    "ReadMaxRows",
    "SupportsTriggerAvailableNow",
]


def _absent(name: str, module: str) -> type:
    """A stand-in for a class the running PySpark lacks (the module's docstring)."""

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        pass

    return type(name, (), {"__init__": __init__, "__doc__": f"{module}.{name}, absent from this PySpark"})


def _limit(name: str, field: str | None) -> type:
    """A stand-in for one of PySpark 4.2's read limits: a frozen dataclass of its one field."""
    fields = [(field, int)] if field else []
    return dataclasses.make_dataclass(name, fields, frozen=True)


# the read limits' fields, as PySpark 4.2 declares them (pyspark/sql/streaming/datasource.py)
_LIMIT_FIELDS = {
    "ReadAllAvailable": None,
    "ReadMaxBytes": "max_bytes",
    "ReadMaxFiles": "max_files",
    "ReadMaxRows": "max_rows",
}


def _found(module: str, names: list[str]) -> dict[str, type]:
    try:
        loaded: Any = importlib.import_module(module)
    except ImportError:
        loaded = None
    absent = {n: _limit(n, _LIMIT_FIELDS[n]) if n in _LIMIT_FIELDS else _absent(n, module) for n in names}
    return {n: getattr(loaded, n, None) or absent[n] for n in names}


def _has(module: str, names: list[str]) -> bool:
    try:
        loaded = importlib.import_module(module)
    except ImportError:
        return False
    return all(hasattr(loaded, n) for n in names)


DATA_SOURCES = _has(_API_MODULE, _CORE)
FILTER_PUSHDOWN = DATA_SOURCES and _has(_API_MODULE, _FILTERS)
ADMISSION_CONTROL = DATA_SOURCES and _has(_STREAMING, _LIMITS)

if TYPE_CHECKING:  # the type checker sees the newest PySpark's classes
    from pyspark.sql.datasource import (
        DataSource,
        DataSourceReader,
        DataSourceStreamReader,
        EqualNullSafe,
        EqualTo,
        Filter,
        GreaterThan,
        GreaterThanOrEqual,
        In,
        InputPartition,
        IsNotNull,
        LessThan,
        LessThanOrEqual,
        Not,
    )
    from pyspark.sql.streaming.datasource import (
        ReadAllAvailable,
        ReadLimit,
        ReadMaxBytes,
        ReadMaxFiles,
        ReadMaxRows,
        SupportsTriggerAvailableNow,
    )
else:
    globals().update(_found(_API_MODULE, _CORE + _FILTERS) | _found(_STREAMING, _LIMITS))


__all__ = [  # _CORE, _FILTERS and _LIMITS as the type checker sees them, and the flags
    "DataSource",
    "DataSourceReader",
    "DataSourceStreamReader",
    "InputPartition",
    "Filter",
    "EqualNullSafe",
    "EqualTo",
    "GreaterThan",
    "GreaterThanOrEqual",
    "In",
    "IsNotNull",
    "LessThan",
    "LessThanOrEqual",
    "Not",
    "ReadLimit",
    "ReadAllAvailable",
    "ReadMaxBytes",
    "ReadMaxFiles",
    "ReadMaxRows",
    "SupportsTriggerAvailableNow",
    "ADMISSION_CONTROL",
    "DATA_SOURCES",
    "FILTER_PUSHDOWN",
    "require_data_sources",
]


def require_data_sources(spark: Any) -> None:
    """One line, where the session's Spark cannot register a Python data source."""
    if DATA_SOURCES and getattr(spark, "dataSource", None) is not None:
        return
    version = getattr(spark, "version", "unknown")
    raise DataSourceUnavailable(
        f'format("keyfill") needs PySpark\'s Python Data Source API, which this Spark ({version}) lacks: '
        "Spark 4.0 or later, or Databricks Runtime 15.3 or later. The compaction, `keyfill replay` and the "
        "Python replay API (reader.replay) work here"
    )

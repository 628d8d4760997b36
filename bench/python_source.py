"""The ceiling of PySpark's Python Data Source path for `bench.bench_spark_source`: a
streaming source that yields prebuilt Arrow batches and does nothing else. A module of its
own that imports only pyarrow and pyspark, so the Python process Spark starts to plan each
streaming query pays no import of keyfill's."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import pyarrow as pa
from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import SupportsTriggerAvailableNow

SCHEMA = (  # format("keyfill")'s, without headers
    "`key` binary, `value` binary, `topic` string, `partition` int, `offset` long, `timestamp` timestamp, "
    "`timestampType` int, `key_group` int, `slice` int"
)


@dataclass(frozen=True)
class Prebuilt(InputPartition):
    path: str  # an Arrow IPC file of this partition's records
    rows: int  # rows a batch


class PrebuiltStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """One micro-batch, a partition per file; each yields its file's records,
    memory-mapped (no copy), in batches of `rows`. It takes Trigger.AvailableNow as keyfill
    and Spark's file source do: without, Spark runs no batch after the last with data, so a
    windowed query would never emit its windows (nor evict their state), and do less work."""

    def __init__(self, options: dict[str, str]):
        self.files = options["files"].split(",")
        self.rows = int(options["rows"])

    def initialOffset(self) -> dict:
        return {"batch": 0}

    def latestOffset(self, start: dict, limit: object) -> dict:
        return {"batch": 1}

    def partitions(self, start: dict, end: dict) -> list[InputPartition]:
        return [Prebuilt(f, self.rows) for f in self.files] if start != end else []

    def read(self, partition: Prebuilt) -> Iterator[pa.RecordBatch]:
        with pa.memory_map(partition.path) as f:
            table = pa.ipc.open_file(f).read_all()
        return iter(table.to_batches(max_chunksize=partition.rows))

    def prepareForTriggerAvailableNow(self) -> None:
        pass  # everything is there from the start

    def commit(self, end: dict) -> None:
        pass


class PrebuiltDataSource(DataSource):
    @classmethod
    def name(cls) -> str:
        return "prebuilt"

    def schema(self) -> str:
        return SCHEMA

    def streamReader(self, schema) -> PrebuiltStreamReader:
        return PrebuiltStreamReader(dict(self.options))

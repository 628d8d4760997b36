"""The ceiling of PySpark's Python Data Source path for `bench.bench_spark_source`: a
streaming source that yields prebuilt Arrow batches and does nothing else. A module of its
own that imports only pyarrow and pyspark, so the Python process Spark starts to plan each
streaming query pays no import of keyfill's.

With the `decode` option (a pickle of keyfill's input partitions, one per file) each task
also reads and decodes its partition's pieces through keyfill's task side, as it goes, and
drops them: the ceiling of a source that must decode this archive."""

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
    decode: str = ""  # keyfill's input partitions, pickled: decode the `index`th
    index: int = 0
    url: str = ""


class PrebuiltStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """One micro-batch, a partition per file; each yields its file's records,
    memory-mapped (no copy), in batches of `rows`. It takes Trigger.AvailableNow as keyfill
    and Spark's file source do: without, Spark runs no batch after the last with data, so a
    windowed query would never emit its windows (nor evict their state), and do less work."""

    def __init__(self, options: dict[str, str]):
        self.files = options["files"].split(",")
        self.rows = int(options["rows"])
        self.decode, self.url = options.get("decode", ""), options.get("url", "")

    def initialOffset(self) -> dict:
        return {"batch": 0}

    def latestOffset(self, start: dict, limit: object) -> dict:
        return {"batch": 1}

    def partitions(self, start: dict, end: dict) -> list[InputPartition]:
        if start == end:
            return []
        return [Prebuilt(f, self.rows, self.decode, i, self.url) for i, f in enumerate(self.files)]

    def read(self, partition: Prebuilt) -> Iterator[pa.RecordBatch]:
        with pa.memory_map(partition.path) as f:
            table = pa.ipc.open_file(f).read_all()
        batches = table.to_batches(max_chunksize=partition.rows)
        return iter(batches) if not partition.decode else _decoding(partition, batches)

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


def _decoding(partition: Prebuilt, batches: list[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """`batches`, each after decoding about as many of keyfill's records (then the rest)."""
    import pickle

    from reader.spark.options import Options
    from reader.spark.split_reader import read_archive

    with open(partition.decode, "rb") as f:
        mine = pickle.load(f)[partition.index]
    decoded = read_archive(Options.parse({"path": partition.url}), mine)
    have = 0
    for batch in batches:
        while have < batch.num_rows:
            got = next(decoded, None)
            if got is None:
                break
            have += got.num_rows
        have -= batch.num_rows
        yield batch
    for _ in decoded:
        pass

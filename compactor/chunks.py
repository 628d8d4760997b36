"""Source chunks as the Spark passes see them: a small DataFrame of chunk indexes (the
chunks themselves travel in the task closure), and a read that refuses empty chunks."""

from __future__ import annotations

import pyarrow as pa

from compactor.sources import SourceArchive, SourceChunk
from keygroups import envelope

CHUNK_COLUMNS = "idx int, prefix_max long"


def chunk_frame(spark, chunks: list[SourceChunk], prefix_max: dict[str, int] | None = None):
    """One row per chunk: its index and the running maximum timestamp of its partition
    before it (the rewrite pass needs it to slice the chunk's records)."""
    sc = spark.sparkContext
    parallel = max(1, min(len(chunks), sc.defaultParallelism * 4))
    rows = [(i, (prefix_max or {}).get(c.key, 0)) for i, c in enumerate(chunks)]
    return spark.createDataFrame(sc.parallelize(rows, parallel), CHUNK_COLUMNS)


def read_checked(source: SourceArchive, chunk: SourceChunk) -> pa.RecordBatch:
    batch = source.read(chunk)
    if batch.num_rows == 0:
        raise envelope.CorruptFile(f"{source.store.url_for(chunk.key)}: chunk holds no records")
    return batch

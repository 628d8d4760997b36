"""`--format iceberg`: a topic materialised as an Iceberg table (docs/iceberg-source.md).

`source` pins the snapshot, lists chunks and reads them; `table` opens the table by the
name it is given; `ranges` cuts chunks as offset ranges over the data files' bounds;
`columns` checks and converts Redpanda's columns. The source's names are re-exported here,
where they were before the format became a package (`DEFAULT_CHUNK_RECORDS` is read from
`source`: set it there).
"""

from __future__ import annotations

from compactor.sources.iceberg.source import DEFAULT_CHUNK_RECORDS, IcebergSource

__all__ = ["IcebergSource", "DEFAULT_CHUNK_RECORDS"]

"""`--format iceberg`: a topic materialised as an Iceberg table (docs/iceberg-source.md).

`source` pins the snapshot, lists chunks and reads them; `table` opens the table by the
name it is given; `file_io` reads tables on GCS and Azure through keyfill's storage layer;
`ranges` gives a data file's bounds; `columns` finds the partition and offset columns in a
Parquet file. `DEFAULT_CHUNK_RECORDS` is read from `source`: set it there.
"""

from __future__ import annotations

from compactor.sources.iceberg.source import DEFAULT_CHUNK_RECORDS, IcebergOptions, IcebergSource

__all__ = ["IcebergSource", "IcebergOptions", "DEFAULT_CHUNK_RECORDS"]

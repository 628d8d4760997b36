"""The key assignment of a compacted archive: which group every key belongs to.

Stored as `assignments/<run>.parquet` (the manifest names it) (docs/compacted-archive.md), written by
the compactor after packing, read by the rewrite pass (to route records) and by verify (to
check every record sits in its key's group).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from keygroups.storage import Storage

ASSIGNMENT_SCHEMA = pa.schema(
    [
        ("key", pa.binary()),  # null for the null-key pseudo-keys
        pa.field("null_key_partition", pa.int32()),  # the partition of a null-key pseudo-key, else null
        pa.field("group", pa.int32(), nullable=False),
        pa.field("records", pa.int64(), nullable=False),
        pa.field("bytes", pa.int64(), nullable=False),
    ]
)


def write_assignment(store: Storage, key: str, table: pa.Table) -> None:
    import pyarrow.parquet as pq

    sink = pa.BufferOutputStream()
    pq.write_table(table, sink, compression="zstd", row_group_size=1 << 20)
    store.write(key, sink.getvalue().to_pybytes())


def load_assignment(store: Storage, key: str) -> pa.Table:
    import pyarrow.parquet as pq

    return pq.read_table(pa.BufferReader(store.read(key)), schema=ASSIGNMENT_SCHEMA)


MISSING = -1  # group_of: a key the assignment does not know


@dataclass
class KeyAssignment:
    """The assignment as a lookup: keyed records by key, null-key records by partition."""

    keys: pa.Array
    groups: np.ndarray
    null_groups: dict[int, int]

    @classmethod
    def from_table(cls, t: pa.Table) -> KeyAssignment:
        keyed = t.filter(pc.is_null(t.column("null_key_partition")))
        nulls = t.filter(pc.is_valid(t.column("null_key_partition")))
        return cls(
            keys=keyed.column("key").combine_chunks(),
            groups=keyed.column("group").to_numpy(),
            null_groups=dict(zip(nulls.column("null_key_partition").to_pylist(), nulls.column("group").to_pylist())),
        )

    def group_of(self, keys: pa.Array, partitions: np.ndarray) -> np.ndarray:
        """Group per record (int32), MISSING where the assignment has no such key."""
        out = np.full(len(keys), MISSING, np.int32)
        null = keys.is_null().to_numpy(zero_copy_only=False)
        idx = pc.index_in(keys, value_set=self.keys).to_numpy(zero_copy_only=False).astype(np.float64)
        known = ~null & ~np.isnan(idx)
        out[known] = self.groups[idx[known].astype(np.int64)]
        for p in np.unique(partitions[null]).tolist():
            out[null & (partitions == p)] = self.null_groups.get(p, MISSING)
        return out

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

from keygroups.key_hash import hash_keys
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
    """The assignment as a lookup: keyed records by key, null-key records by partition.

    Built once per process: the keys sorted by their 64-bit hash (`keygroups.key_hash`). A
    batch is looked up by binary search on its keys' hashes, then the bytes of each match
    are compared, so a key the assignment lacks is MISSING even if its hash collides with a
    known key's. Keys of the assignment that share a hash (about one pair in 10^5 archives
    of 20M keys) go through an exact lookup of those few keys. Cost per batch: O(batch x log
    keys), never O(keys); memory: the keys, 8 bytes of hash and 4 of group per key."""

    keys: pa.Array  # sorted by hash
    hashes: np.ndarray  # uint64, ascending
    groups: np.ndarray  # int32, in the same order
    null_groups: dict[int, int]
    shared: pa.Array  # keys whose hash another key of the assignment shares
    shared_groups: np.ndarray

    @classmethod
    def from_table(cls, t: pa.Table) -> KeyAssignment:
        keyed = t.filter(pc.is_null(t.column("null_key_partition")))
        nulls = t.filter(pc.is_valid(t.column("null_key_partition")))
        keys = keyed.column("key").combine_chunks()
        hashes = hash_keys(keys)
        order = np.argsort(hashes, kind="stable")
        hashes = hashes[order]
        keys = keys.take(pa.array(order))
        groups = keyed.column("group").to_numpy()[order].astype(np.int32)
        same = np.zeros(len(hashes), bool)
        if len(hashes) > 1:
            dup = hashes[1:] == hashes[:-1]
            same[1:] |= dup
            same[:-1] |= dup
        return cls(
            keys=keys,
            hashes=hashes,
            groups=groups,
            null_groups=dict(zip(nulls.column("null_key_partition").to_pylist(), nulls.column("group").to_pylist())),
            shared=keys.filter(pa.array(same)),
            shared_groups=groups[same],
        )

    def group_of(self, keys: pa.Array, partitions: np.ndarray) -> np.ndarray:
        """Group per record (int32), MISSING where the assignment has no such key."""
        if isinstance(keys, pa.ChunkedArray):
            keys = keys.combine_chunks()
        out = np.full(len(keys), MISSING, np.int32)
        null = keys.is_null().to_numpy(zero_copy_only=False)
        if len(self.hashes) and len(keys):
            h = hash_keys(keys)
            pos = np.minimum(np.searchsorted(self.hashes, h), len(self.hashes) - 1)
            candidate = self.keys.take(pa.array(pos))
            same = pc.fill_null(pc.equal(keys, candidate), False).to_numpy(zero_copy_only=False)
            hit = ~null & (self.hashes[pos] == h) & same
            out[hit] = self.groups[pos[hit]]
            if len(self.shared):  # the second key of a shared hash is not where the search lands
                rest = ~null & ~hit
                idx = pc.index_in(keys.filter(pa.array(rest)), value_set=self.shared).to_numpy(zero_copy_only=False)
                found = ~np.isnan(idx.astype(np.float64))
                where = np.flatnonzero(rest)[found]
                out[where] = self.shared_groups[idx[found].astype(np.int64)]
        for p in np.unique(partitions[null]).tolist():
            out[null & (partitions == p)] = self.null_groups.get(p, MISSING)
        return out

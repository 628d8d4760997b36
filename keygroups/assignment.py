"""The key assignment of a compacted archive: which group every key belongs to.

Stored as `assignments/<run>.parquet` (the manifest names it) (docs/compacted-archive.md), written by
the compactor after packing, read by the rewrite pass (to route records) and by verify (to
check every record sits in its key's group).

Two kinds of rows: exact entries (a key, or a partition's null-key pseudo-key) and, for an
archive with more distinct keys than `exact_limit(groups)`, one row per hash bucket. A key
with an exact entry goes to its entry's group; any other key to its bucket's group, bucket
= the key's 64-bit hash (`keygroups.key_hash`) mod the bucket count. Then the driver and
every task hold O(heavy keys + buckets), not O(keys) (docs/packing.md, "Heavy keys and
buckets").
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from keygroups._numba import njit
from keygroups.envelope.buffers import binary_buffers
from keygroups.key_hash import hash_keys
from keygroups.storage import Storage

ASSIGNMENT_SCHEMA = pa.schema(
    [
        ("key", pa.binary()),  # null for the null-key pseudo-keys
        pa.field("null_key_partition", pa.int32()),  # the partition of a null-key pseudo-key, else null
        pa.field("group", pa.int32(), nullable=False),
        pa.field("records", pa.int64(), nullable=False),
        pa.field("bytes", pa.int64(), nullable=False),
        pa.field("bucket", pa.int32()),  # a bucket row's bucket, else null
        pa.field("keys", pa.int64()),  # a bucket row's distinct keys (counted per run, summed), else null
    ]
)

HEAVY_SHARE = 64  # a key is heavy above 1/(64 groups) of the payload: at most 64 per group
BUCKETS_PER_GROUP = 4 * HEAVY_SHARE  # a bucket averages a quarter of the heavy threshold


def bucket_count(groups: int) -> int:
    """Buckets for `groups` groups: a power of two (a bucket is the hash's low bits, the same
    in Spark's pmod on a signed long), at least 256 per group."""
    return 1 << (BUCKETS_PER_GROUP * groups - 1).bit_length()


def exact_limit(groups: int) -> int:
    """Distinct keys up to which every key gets an exact entry: while the keys are no more
    than the buckets would be, buckets save nothing and balance worse."""
    return bucket_count(groups)


def heavy_threshold(payload: int, groups: int) -> int:
    """Bytes above which a key keeps an exact entry in a bucketed assignment."""
    return payload // (HEAVY_SHARE * groups)


def exact_rows(totals: pa.Table, groups: np.ndarray | None = None) -> pa.Table:
    """Assignment rows for per-key totals (key, null_part, bytes, records; null_part -1 for a
    real key), in their order; group 0 until packed."""
    null_part = totals.column("null_part").to_numpy()
    n = totals.num_rows
    return pa.table(
        {
            "key": totals.column("key"),
            "null_key_partition": pa.array(np.where(null_part >= 0, null_part, 0), pa.int32(), mask=null_part < 0),
            "group": pa.array(np.zeros(n, np.int32) if groups is None else groups, pa.int32()),
            "records": totals.column("records"),
            "bytes": totals.column("bytes"),
            "bucket": pa.nulls(n, pa.int32()),
            "keys": pa.nulls(n, pa.int64()),
        },
        schema=ASSIGNMENT_SCHEMA,
    )


def bucket_rows(buckets: pa.Table, groups: np.ndarray | None = None) -> pa.Table:
    """Assignment rows for bucket totals (bucket, bytes, records, keys), in their order."""
    n = buckets.num_rows
    return pa.table(
        {
            "key": pa.nulls(n, pa.binary()),
            "null_key_partition": pa.nulls(n, pa.int32()),
            "group": pa.array(np.zeros(n, np.int32) if groups is None else groups, pa.int32()),
            "records": buckets.column("records"),
            "bytes": buckets.column("bytes"),
            "bucket": buckets.column("bucket"),
            "keys": buckets.column("keys"),
        },
        schema=ASSIGNMENT_SCHEMA,
    )


def group_sums(table: pa.Table, column: str, groups: int) -> np.ndarray:
    """`column` summed per group (the table's `group` column): of an assignment, or of pieces."""
    return np.bincount(
        table.column("group").to_numpy(), weights=table.column(column).to_numpy(), minlength=groups
    ).astype(np.int64)


def write_assignment(store: Storage, key: str, table: pa.Table) -> None:
    import pyarrow.parquet as pq

    sink = pa.BufferOutputStream()
    pq.write_table(table, sink, compression="zstd", row_group_size=1 << 20)
    store.write(key, sink.getvalue().to_pybytes())


def load_assignment(store: Storage, key: str) -> pa.Table:
    import pyarrow.parquet as pq

    t = pq.read_table(pa.BufferReader(store.read(key)))
    for field in ASSIGNMENT_SCHEMA:  # files of archives written before buckets lack the bucket columns
        if field.name not in t.column_names:
            t = t.append_column(field, pa.nulls(t.num_rows, field.type))
    return t.select(ASSIGNMENT_SCHEMA.names).cast(ASSIGNMENT_SCHEMA)


def is_bucket(t: pa.Table) -> np.ndarray:
    valid: np.ndarray = t.column("bucket").is_valid().to_numpy(zero_copy_only=False)
    return valid


def assignment_keys(t: pa.Table) -> int:
    """Distinct keys: exact entries with a key, plus what bucket rows counted (for an
    appended bucketed archive an upper bound: a key in several runs counts in each)."""
    exact = int(pc.sum(pc.is_valid(t.column("key"))).as_py() or 0)
    return exact + int(pc.sum(t.column("keys")).as_py() or 0)


MISSING = -1  # group_of: a key the assignment does not know
_NO_BUCKETS = np.zeros(0, np.int32)


@dataclass
class KeyAssignment:
    """The assignment as a lookup: keyed records by key, null-key records by partition.

    Built once per process: the keys sorted by their 64-bit hash (`keygroups.key_hash`). A
    batch is looked up in one compiled pass (`_lookup`): each key's hash found
    by binary search, then the bytes of each key with that hash compared, so a key the
    assignment lacks is MISSING even if its hash collides with a known key's, and keys of the
    assignment that share a hash (about one pair in 10^5 archives of 20M keys) are each
    found. Cost per batch: O(batch x log keys), never O(keys); memory: the keys, 8 bytes of
    hash and 4 of group per key. Keys without an entry go to their bucket's group when the
    assignment has buckets."""

    keys: pa.Array  # sorted by hash
    hashes: np.ndarray  # uint64, ascending
    groups: np.ndarray  # int32, in the same order
    null_groups: dict[int, int]
    bucket_groups: np.ndarray | None = None  # int32 per bucket; None: every key has an entry

    def __post_init__(self) -> None:
        known = binary_buffers(self.keys)  # int64 offsets: one compiled signature of `_lookup`
        self._known = (known.offsets, known.data)

    @classmethod
    def from_table(cls, t: pa.Table) -> KeyAssignment:
        bucketed = is_bucket(t)
        buckets = t.filter(pa.array(bucketed))
        t = t.filter(pa.array(~bucketed))
        bucket_groups = None
        if buckets.num_rows:
            bucket_groups = np.full(buckets.num_rows, MISSING, np.int32)
            bucket_groups[buckets.column("bucket").to_numpy()] = buckets.column("group").to_numpy()
        keyed = t.filter(pc.is_null(t.column("null_key_partition")))
        nulls = t.filter(pc.is_valid(t.column("null_key_partition")))
        keys = keyed.column("key").combine_chunks()
        hashes = hash_keys(keys)
        order = np.argsort(hashes, kind="stable")
        hashes = hashes[order]
        keys = keys.take(pa.array(order))
        groups = keyed.column("group").to_numpy()[order].astype(np.int32)
        return cls(
            keys=keys,
            hashes=hashes,
            groups=groups,
            null_groups=dict(zip(nulls.column("null_key_partition").to_pylist(), nulls.column("group").to_pylist())),
            bucket_groups=bucket_groups,
        )

    def group_of(self, keys: pa.Array, partitions: np.ndarray) -> np.ndarray:
        """Group per record (int32), MISSING where the assignment has no such key."""
        if isinstance(keys, pa.ChunkedArray):
            keys = keys.combine_chunks()
        out = np.full(len(keys), MISSING, np.int32)
        cols = binary_buffers(keys)  # int64 offsets whatever the key type: one compiled signature
        null = ~cols.valid
        if len(keys) and (len(self.hashes) or self.bucket_groups is not None):
            by_bucket = self.bucket_groups if self.bucket_groups is not None else _NO_BUCKETS
            h = hash_keys(keys)
            _lookup(cols.offsets, cols.data, h, null, self.hashes, *self._known, self.groups, by_bucket, MISSING, out)
        for p in np.unique(partitions[null]).tolist():
            out[null & (partitions == p)] = self.null_groups.get(p, MISSING)
        return out


@njit(cache=True, nogil=True)
def _lookup(
    offsets: np.ndarray,
    data: np.ndarray,
    h: np.ndarray,
    skip: np.ndarray,
    hashes: np.ndarray,
    known_offsets: np.ndarray,
    known_data: np.ndarray,
    values: np.ndarray,
    by_bucket: np.ndarray,
    missing: int,
    out: np.ndarray,
) -> None:
    """out[i]: the value of key i (hash h[i]) among the known keys (sorted by `hashes`,
    ascending; the bytes compared, so a hash shared with another key never matches it), else
    its bucket's (`by_bucket`, by the hash's low bits; a power of two long, or empty: no
    buckets), else `missing`. Keys where `skip` is set are left as they are. One pass of
    binary search and byte compares: in array steps (search, gather the candidates, compare
    them, then the shared hashes and the buckets) the lookup cost ~4x the time."""
    buckets = by_bucket.shape[0]
    for i in range(out.shape[0]):
        if skip[i]:
            continue
        a, b = offsets[i], offsets[i + 1]
        value = missing
        pos = np.searchsorted(hashes, h[i])
        while pos < hashes.shape[0] and hashes[pos] == h[i]:
            c, d = known_offsets[pos], known_offsets[pos + 1]
            if d - c == b - a:
                same = True
                for k in range(b - a):
                    if data[a + k] != known_data[c + k]:
                        same = False
                        break
                if same:
                    value = values[pos]
                    break
            pos += 1
        if value == missing and buckets:
            value = by_bucket[h[i] & np.uint64(buckets - 1)]  # the statistics' buckets: the hash's low bits
        out[i] = value


_cached: dict[str, KeyAssignment] = {}  # assignment file URL -> its lookup: the last one asked for, per process


def cached_assignment(store: Storage, key: str) -> KeyAssignment:
    """The lookup of the assignment file `key`, built once per process and kept until another
    file is asked for: a Spark worker runs many tasks over one archive, and building the
    lookup reads and sorts every key."""
    url = store.url_for(key)
    found = _cached.get(url)
    if found is None:
        found = KeyAssignment.from_table(load_assignment(store, key))
        _cached.clear()
        _cached[url] = found
    return found

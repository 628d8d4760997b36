"""Sums per distinct key, found through the keys' 64-bit hashes.

The statistics pass adds up bytes and records per key three times: per chunk, per map
flush and per reducer. With a key per record, pyarrow's `group_by` on the binary keys was
most of the pass (about 75 ms per 200K keys, hashing every key's bytes again at each step),
and the pass grew 5x from 10K to 12.5M distinct keys (`bench/bench_scale.py`). The keys'
hashes are computed once (`keygroups.key_hash`) and travel with the sums, so a step here
hashes nothing: an open-addressing table keyed by the hash, where a slot matches only when
the key bytes match too, so two keys sharing a hash stay apart (exact, as pyarrow's is). No
library offers a group-by over a hash the caller already has.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from keygroups._numba import njit
from keygroups.envelope.buffers import arrow_binary, gather_spans


@njit(cache=True, nogil=True)
def _same(data, a0, a1, b0, b1) -> bool:
    if a1 - a0 != b1 - b0:
        return False
    for j in range(a1 - a0):
        if data[a0 + j] != data[b0 + j]:
            return False
    return True


@njit(cache=True, nogil=True)
def _sum_spans(hashes, offsets, data, skip, size, records, table, first, out_size, out_records):
    """Rows with the same key bytes added up, in the order their keys first appear; rows
    with `skip` set are left out. `table`: -1s, a power of two of them, more than the rows.
    Returns how many distinct keys (entries of `first`, `out_size`, `out_records` filled)."""
    n = hashes.shape[0]
    mask = np.uint64(table.shape[0] - 1)
    m = 0
    for i in range(n):
        if skip[i]:
            continue
        h = hashes[i]
        s = h & mask
        while True:
            e = table[s]
            if e < 0:
                table[s] = m
                first[m] = i
                out_size[m] = size[i]
                out_records[m] = records[i]
                m += 1
                break
            r = first[e]
            if hashes[r] == h and _same(data, offsets[r], offsets[r + 1], offsets[i], offsets[i + 1]):
                out_size[e] += size[i]
                out_records[e] += records[i]
                break
            s = (s + np.uint64(1)) & mask
    return m


def sum_by_key(
    keys: pa.Array, hashes: np.ndarray, size: np.ndarray, records: np.ndarray
) -> tuple[pa.Array, np.ndarray, np.ndarray, np.ndarray]:
    """(each distinct non-null key, as large_binary, in the order keys first appear; the
    index of its first row; its size sum; its records sum). `hashes`:
    `keygroups.key_hash.hash_keys(keys)`; null keys are left out (the caller sums them by
    partition)."""
    if isinstance(keys, pa.ChunkedArray):
        keys = keys.combine_chunks()
    if not pa.types.is_large_binary(keys.type):
        keys = keys.cast(pa.large_binary())  # one signature for the kernel
    n = len(keys)
    validity, offsets_buf, data_buf = keys.buffers()
    offsets = np.frombuffer(offsets_buf, np.int64)[keys.offset : keys.offset + n + 1] if n else np.zeros(1, np.int64)
    data = np.frombuffer(data_buf, np.uint8) if data_buf is not None else np.zeros(0, np.uint8)
    skip = keys.is_null().to_numpy(zero_copy_only=False) if keys.null_count else np.zeros(n, np.bool_)
    # a slot per two rows at least, so probes stay short; int32 entries halve the table's
    # cache misses (a step sums at most a few million rows: FLUSH_ROWS, REDUCER_ROWS)
    table = np.full(1 << (2 * n).bit_length(), -1, np.int32 if n < 2**31 else np.int64)
    first = np.empty(n, np.int64)
    out_size = np.empty(n, np.int64)
    out_records = np.empty(n, np.int64)
    m = _sum_spans(
        np.ascontiguousarray(hashes, np.uint64),
        offsets,
        data,
        skip,
        np.ascontiguousarray(size, np.int64),
        np.ascontiguousarray(records, np.int64),
        table,
        first,
        out_size,
        out_records,
    )
    first = first[:m]
    pos = offsets[first]
    key_offsets, key_data = gather_spans(data, pos, offsets[first + 1] - pos)
    return arrow_binary(m, key_offsets, key_data, None, pa.large_binary()), first, out_size[:m], out_records[:m]

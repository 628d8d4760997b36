"""64-bit hashes of binary keys, vectorised over an Arrow array's buffers.

The rewrite and verify route every record through the key assignment. A lookup that
builds a hash table of all keys per batch (`pc.index_in(..., value_set=<every key>)`) costs
O(keys) per batch (docs/performance.md#key-hashes). Arrow's compute layer exposes no
element-wise hash, so keyfill hashes keys itself: FNV-1a over the bytes, then the SplitMix64
finaliser for avalanche (FNV alone leaves the low bits of short, similar keys correlated).
The assignment sorts its keys' hashes once per process and looks a batch up by binary
search (`keygroups.assignment`).
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from keygroups._numba import njit

_FNV_OFFSET = np.uint64(0xCBF29CE484222325)
_FNV_PRIME = np.uint64(0x100000001B3)
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)


@njit(cache=True, nogil=True)
def _hash_ranges(offsets: np.ndarray, data: np.ndarray, out: np.ndarray) -> None:
    for i in range(out.shape[0]):
        h = _FNV_OFFSET
        for j in range(offsets[i], offsets[i + 1]):
            h = (h ^ np.uint64(data[j])) * _FNV_PRIME
        h ^= h >> np.uint64(30)
        h *= _M1
        h ^= h >> np.uint64(27)
        h *= _M2
        h ^= h >> np.uint64(31)
        out[i] = h


def hash_keys(keys: pa.Array) -> np.ndarray:
    """uint64 per element of a binary (or large_binary) array. A null's hash means nothing:
    callers route null keys apart."""
    if isinstance(keys, pa.ChunkedArray):
        keys = keys.combine_chunks()
    if pa.types.is_string(keys.type) or pa.types.is_large_string(keys.type):
        keys = keys.cast(pa.large_binary() if pa.types.is_large_string(keys.type) else pa.binary())
    n = len(keys)
    out = np.empty(n, np.uint64)
    if n == 0:
        return out
    width = np.int64 if pa.types.is_large_binary(keys.type) else np.int32
    _, offsets_buf, data_buf = keys.buffers()
    offsets = np.frombuffer(offsets_buf, width)[keys.offset : keys.offset + n + 1]
    data = np.frombuffer(data_buf, np.uint8) if data_buf is not None else np.zeros(0, np.uint8)
    _hash_ranges(offsets, data, out)
    return out

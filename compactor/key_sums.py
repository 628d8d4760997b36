"""Sums per distinct key, found through the keys' 64-bit hashes.

The statistics pass adds up bytes and records per key in its map tasks and again in its
reducers. With a key per record, pyarrow's `group_by` on the binary keys was most of the
pass (about 75 ms per 200K keys, hashing every key's bytes again at each step), and the pass
grew 5x from 10K to 12.5M distinct keys (`bench/bench_scale.py`). The keys' hashes are
computed once (`keygroups.key_hash`) and travel with the sums, so a step here hashes
nothing: an open-addressing table keyed by the hash, where a slot matches only when the key
bytes match too, so two keys sharing a hash stay apart (exact, as pyarrow's is). No library
offers a group-by over a hash the caller already has.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from keygroups._numba import njit


@njit(cache=True, nogil=True)
def _same(data, a0, a1, b0, b1) -> bool:
    if a1 - a0 != b1 - b0:
        return False
    for j in range(a1 - a0):
        if data[a0 + j] != data[b0 + j]:
            return False
    return True


_EMPTY = np.uint64(0xFFFFFFFFFFFFFFFF)
_LOW = np.uint64(0xFFFFFFFF)


@njit(cache=True, nogil=True)
def _slot_of(table, shift, h):
    """The first empty slot of h's probe sequence."""
    mask = np.uint64(table.shape[0] - 1)
    s = h >> shift
    while table[s] != _EMPTY:
        s = (s + np.uint64(1)) & mask
    return s


@njit(cache=True, nogil=True)
def _sum_spans(hashes, offsets, data, skip, size, records, bits, first, entries):
    """Rows with the same key bytes added up, in the order their keys first appear; rows
    with `skip` set are left out. Returns how many distinct keys (rows of `first` and
    `entries` filled).

    The table starts at 2**bits slots and doubles when half full (sized by the distinct keys,
    not the rows: 10K keys in a million rows keep a table that stays in cache). A key probes from
    the slot its hash's high bits name (a reducer's keys share their low bits: hash mod R).
    A slot holds the key's entry (low 32 bits) and its hash's low 32 bits, so a probe passes
    other keys without reading their rows. An entry is one row of `entries` (the key's first
    byte, its end, its size sum, its records sum, its hash), so a repeated key costs a cache
    miss for its slot, one for its entry and one for its bytes: the sums are bound by memory
    latency."""
    n = hashes.shape[0]
    table = np.full(1 << bits, _EMPTY, np.uint64)
    mask = np.uint64(table.shape[0] - 1)
    shift = np.uint64(64 - bits)
    m = 0
    for i in range(n):
        if skip[i]:
            continue
        h = hashes[i]
        tag = h << np.uint64(32)
        s = h >> shift
        a0, a1 = offsets[i], offsets[i + 1]
        while True:
            t = table[s]
            if t == _EMPTY:
                table[s] = tag | np.uint64(m)
                first[m] = i
                entries[m, 0] = a0
                entries[m, 1] = a1
                entries[m, 2] = size[i]
                entries[m, 3] = records[i]
                entries[m, 4] = np.int64(h)
                m += 1
                break
            if t & ~_LOW == tag:  # the same low 32 bits of hash: compare the bytes
                e = np.int64(t & _LOW)
                if _same(data, entries[e, 0], entries[e, 1], a0, a1):
                    entries[e, 2] += size[i]
                    entries[e, 3] += records[i]
                    break
            s = (s + np.uint64(1)) & mask
        if 2 * m > table.shape[0]:  # half full: double, and place every entry again
            bits += 1
            table = np.full(1 << bits, _EMPTY, np.uint64)
            mask = np.uint64(table.shape[0] - 1)
            shift = np.uint64(64 - bits)
            for e in range(m):  # in entry order: the entries are read in sequence
                he = np.uint64(entries[e, 4])
                table[_slot_of(table, shift, he)] = (he << np.uint64(32)) | np.uint64(e)
    return m


def sum_by_key(
    keys: pa.Array, hashes: np.ndarray, size: np.ndarray, records: np.ndarray, expect: int = 0
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per distinct non-null key, in the order keys first appear: the index of its first
    row, its size sum, its records sum. `hashes`: `keygroups.key_hash.hash_keys(keys)`; null
    keys are left out (the caller sums them by partition). `expect`: the distinct keys the
    caller expects (the table starts that large instead of growing to it)."""
    if isinstance(keys, pa.ChunkedArray):
        keys = keys.combine_chunks()
    if not pa.types.is_large_binary(keys.type):
        keys = keys.cast(pa.large_binary())  # one signature for the kernel
    n = len(keys)
    validity, offsets_buf, data_buf = keys.buffers()
    offsets = np.frombuffer(offsets_buf, np.int64)[keys.offset : keys.offset + n + 1] if n else np.zeros(1, np.int64)
    data = np.frombuffer(data_buf, np.uint8) if data_buf is not None else np.zeros(0, np.uint8)
    skip = keys.is_null().to_numpy(zero_copy_only=False) if keys.null_count else np.zeros(n, np.bool_)
    if n >= 1 << 31:
        raise ValueError(f"{n} key sums in one step: more than a slot's 32-bit entry can hold")
    first = np.empty(n, np.int64)
    entries = np.empty((n, 5), np.int64)
    bits = max(10, (2 * min(expect, n)).bit_length())
    m = _sum_spans(
        np.ascontiguousarray(hashes, np.uint64),
        offsets,
        data,
        skip,
        np.ascontiguousarray(size, np.int64),
        np.ascontiguousarray(records, np.int64),
        bits,
        first,
        entries,
    )
    return first[:m], entries[:m, 2].copy(), entries[:m, 3].copy()

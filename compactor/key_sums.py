"""Sums per distinct key, found through the keys' 64-bit hashes, and the tables of key sums
the statistics pass ships (`SUMS_SCHEMA`).

The statistics pass adds up bytes and records per key in its map tasks and again in its
reducers. With a key per record, pyarrow's `group_by` on the binary keys was most of the
pass, hashing every key's bytes again at each step, and the pass grew with the distinct
keys (measured with `bench/bench_scale.py`: docs/performance.md#key-sums-by-hash). The
keys' hashes are computed once (`keygroups.key_hash`) and travel with the sums, so a step here hashes
nothing: an open-addressing table keyed by the hash, where a slot matches only when the key
bytes match too, so two keys sharing a hash stay apart (exact, as pyarrow's is). No library
offers a group-by over a hash the caller already has.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
import pyarrow as pa

from compactor.shuffle_codec import pack, unpack
from keygroups._numba import Int, njit
from keygroups.envelope.buffers import binary_buffers, take_binary
from keygroups.key_hash import hash_keys


@njit(cache=True, nogil=True)
def _same(data: np.ndarray, a0: Int, a1: Int, b0: Int, b1: Int) -> bool:
    if a1 - a0 != b1 - b0:
        return False
    for j in range(a1 - a0):
        if data[a0 + j] != data[b0 + j]:
            return False
    return True


_EMPTY = np.uint64(0xFFFFFFFFFFFFFFFF)
_LOW = np.uint64(0xFFFFFFFF)


@njit(cache=True, nogil=True)
def _slot_of(table: np.ndarray, shift: np.uint64, h: np.uint64) -> np.uint64:
    """The first empty slot of h's probe sequence."""
    mask = np.uint64(table.shape[0] - 1)
    s: np.uint64 = h >> shift
    while table[s] != _EMPTY:
        s = (s + np.uint64(1)) & mask
    return s


@njit(cache=True, nogil=True)
def _sum_ranges(
    hashes: np.ndarray,
    offsets: np.ndarray,
    data: np.ndarray,
    skip: np.ndarray,
    size: np.ndarray,
    records: np.ndarray,
    bits: int,
    first: np.ndarray,
    entries: np.ndarray,
) -> int:
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
    cols = binary_buffers(keys)  # large_binary's int64 offsets: one signature for the kernel
    n = len(keys)
    if n >= 1 << 31:
        raise ValueError(f"{n} key sums in one step: more than a slot's 32-bit entry can hold")
    first = np.empty(n, np.int64)
    entries = np.empty((n, 5), np.int64)
    bits = max(10, (2 * min(expect, n)).bit_length())
    m = _sum_ranges(
        np.ascontiguousarray(hashes, np.uint64),
        cols.offsets,
        cols.data,
        ~cols.valid,
        np.ascontiguousarray(size, np.int64),
        np.ascontiguousarray(records, np.int64),
        bits,
        first,
        entries,
    )
    return first[:m], entries[:m, 2].copy(), entries[:m, 3].copy()


# A key's sums carry its hash (keygroups.key_hash; 0 for null keys) so no later step hashes the key again.
SUMS_SCHEMA = pa.schema(
    [("key", pa.large_binary()), ("hash", pa.uint64()), ("null_part", pa.int32()), ("bytes", pa.int64()),
     ("records", pa.int64())]
)  # fmt: skip


def to_blob(table: pa.Table, codec: str | None = None) -> bytes:
    """The sums as one IPC record-batch message, without its schema (SUMS_SCHEMA on both
    sides; an IPC stream written into a growing buffer was slower, as measured in
    docs/performance.md#key-sums-by-hash), packed for the shuffle (`compactor.shuffle_codec`)."""
    columns = [c.combine_chunks() for c in table.columns]
    return bytes(pack(pa.RecordBatch.from_arrays(columns, schema=SUMS_SCHEMA).serialize(), codec))


def from_blobs(blobs: Iterable[bytes], codec: str | None = None) -> pa.Table:
    return pa.Table.from_batches([pa.ipc.read_record_batch(unpack(b, codec), SUMS_SCHEMA) for b in blobs], SUMS_SCHEMA)


def record_sums(keys: pa.Array, weights: np.ndarray, partition: int) -> pa.Table:
    """A chunk's records as key sums of one record each (SUMS_SCHEMA); null keys as the
    pseudo-key of the chunk's partition."""
    keys = keys.combine_chunks() if isinstance(keys, pa.ChunkedArray) else keys
    null_part = np.where(keys.is_null().to_numpy(zero_copy_only=False), partition, -1).astype(np.int32)
    return pa.table(
        [keys.cast(pa.large_binary()), hash_keys(keys), null_part, weights, np.ones(len(keys), np.int64)],
        schema=SUMS_SCHEMA,
    )


def by_key(sums: pa.Table, reducers: int = 1, sum_keys: bool = True, expect: int = 0) -> pa.Table:
    """Sums (SUMS_SCHEMA) added up by key, then null keys by partition. The keys come by
    reducer (hash mod `reducers`), each reducer's in the order they first appear.
    `sum_keys=False`: the keyed rows as they are (still by reducer), null keys summed.
    `expect`: distinct keys to make room for at once (`sum_by_key`)."""
    size, records, hashes = (sums.column(c).to_numpy() for c in ("bytes", "records", "hash"))
    keys = sums.column("key").combine_chunks()
    null_part = sums.column("null_part").to_numpy()
    if keys.null_count != np.count_nonzero(null_part >= 0):  # a null key is its partition's pseudo-key
        raise ValueError("key sums whose null keys and null-key partitions disagree")
    if sum_keys:
        first, key_size, key_records = sum_by_key(keys, hashes, size, records, expect)
    else:
        first = np.flatnonzero(null_part < 0)
        key_size, key_records = size[first], records[first]
    if reducers > 1:
        order = np.argsort((hashes[first].view(np.int64) % reducers).astype(np.uint16), kind="stable")
        first, key_size, key_records = first[order], key_size[order], key_records[order]
    out = [
        pa.table(
            [take_binary(keys, first), hashes[first], np.full(len(first), -1, np.int32), key_size, key_records],
            schema=SUMS_SCHEMA,
        )
    ]
    nulls = null_part >= 0
    if nulls.any():
        parts, at = np.unique(null_part[nulls], return_inverse=True)
        out.append(
            pa.table(
                [
                    pa.nulls(len(parts), pa.large_binary()),
                    np.zeros(len(parts), np.uint64),
                    parts.astype(np.int32),
                    np.bincount(at, weights=size[nulls], minlength=len(parts)).astype(np.int64),
                    np.bincount(at, weights=records[nulls], minlength=len(parts)).astype(np.int64),
                ],
                schema=SUMS_SCHEMA,
            )
        )
    return pa.concat_tables(out) if len(out) > 1 else out[0]

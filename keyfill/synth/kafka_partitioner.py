"""Kafka's default partitioner for keyed records: murmur2 of the key bytes, made positive,
modulo the partition count.

Written by hand because no maintained Python package exposes Kafka's exact murmur2 variant
(seed 0x9747b28c, Java int arithmetic); `mmh3` is murmur3. The generator must place keys
where a real producer would, or the per-partition skew of the synthetic archive is wrong.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

_SEED = 0x9747B28C
_M = 0x5BD1E995
_MASK = 0xFFFFFFFF


def murmur2(data: bytes) -> int:
    """Kafka's `Utils.murmur2`, returned as a signed 32-bit int like the Java original."""
    length = len(data)
    h = (_SEED ^ length) & _MASK
    whole = length - (length % 4)
    for i in range(0, whole, 4):
        k = int.from_bytes(data[i : i + 4], "little")
        k = (k * _M) & _MASK
        k ^= k >> 24
        k = (k * _M) & _MASK
        h = (h * _M) & _MASK
        h ^= k
    rest = length % 4
    if rest == 3:
        h ^= data[whole + 2] << 16
    if rest >= 2:
        h ^= data[whole + 1] << 8
    if rest >= 1:
        h ^= data[whole]
        h = (h * _M) & _MASK
    h ^= h >> 13
    h = (h * _M) & _MASK
    h ^= h >> 15
    return h - (1 << 32) if h & 0x80000000 else h


def kafka_partition(key: bytes, partitions: int) -> int:
    """Partition Kafka's default partitioner picks for a non-null key."""
    return (murmur2(key) & 0x7FFFFFFF) % partitions


def murmur2_many(keys: list[bytes]) -> npt.NDArray[np.uint32]:
    """`murmur2` of many keys as uint32, vectorised over keys of equal length.

    Generated archives have a million keys; the scalar loop would cost seconds.
    """
    out = np.empty(len(keys), dtype=np.uint32)
    by_length: dict[int, list[int]] = {}
    for i, key in enumerate(keys):
        by_length.setdefault(len(key), []).append(i)
    with np.errstate(over="ignore"):
        for length, idx in by_length.items():
            rows = np.frombuffer(b"".join(keys[i] for i in idx), dtype=np.uint8)
            rows = rows.reshape(len(idx), length).astype(np.uint32)
            h = np.full(len(idx), (_SEED ^ length) & _MASK, dtype=np.uint32)
            m = np.uint32(_M)
            whole = length - (length % 4)
            for i in range(0, whole, 4):
                k = rows[:, i] | (rows[:, i + 1] << 8) | (rows[:, i + 2] << 16) | (rows[:, i + 3] << 24)
                k = k * m
                k ^= k >> np.uint32(24)
                k = k * m
                h = (h * m) ^ k
            rest = length % 4
            if rest == 3:
                h ^= rows[:, whole + 2] << np.uint32(16)
            if rest >= 2:
                h ^= rows[:, whole + 1] << np.uint32(8)
            if rest >= 1:
                h ^= rows[:, whole]
                h = h * m
            h ^= h >> np.uint32(13)
            h = h * m
            h ^= h >> np.uint32(15)
            out[idx] = h
    return out


def kafka_partitions(keys: list[bytes], partitions: int) -> npt.NDArray[np.int32]:
    """`kafka_partition` for many keys at once (int32 array)."""
    positive = murmur2_many(keys) & np.uint32(0x7FFFFFFF)
    chosen: npt.NDArray[np.int32] = (positive % np.uint32(partitions)).astype(np.int32)  # numpy's stubs: Any
    return chosen

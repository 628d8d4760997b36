"""Feeding the shuffle: split replayed record batches by key into D downstream partitions,
routed exactly as Apache Flink's ``keyBy`` routes the same keys.

A backfill's output usually meets a keyed operator next. If keyfill routes key k to the
consumer a Flink job would route it to, per-key state built during the backfill lines up
with the live job's, and the backfill can hand its partitions straight to Flink subtasks.

Flink's routing (``KeyGroupStreamPartitioner`` → ``KeyGroupRangeAssignment``)::

    keyGroup = MathUtils.murmurHash(key.hashCode()) % maxParallelism
    operator = keyGroup * parallelism / maxParallelism          (Java int arithmetic)

(Flink's "key group" is a hash bucket of its keyed state, called `flink_key_group` here;
keyfill's key groups are something else: the volume-balanced key sets of the archive.)

The hashing is written by hand on purpose: no Python package reproduces it. ``mmh3`` has
MurmurHash3 but not Flink's int-only variant with its sign fold, and nothing computes
Java's ``String.hashCode`` over UTF-16 code units of JDK-decoded UTF-8 bytes. It is
compiled with numba, one pass over the Arrow key buffers per batch, GIL released, so
reader threads can partition in parallel. docs/shuffle-partitioner.md has the details.
"""

from __future__ import annotations

import numbers
from typing import Any, Literal

import numpy as np
import pyarrow as pa

from keygroups._numba import njit
from keygroups.errors import OptionError
from reader.errors import NotARecordBatch, RoutingError

__all__ = [
    "DEFAULT_LOWER_BOUND_MAX_PARALLELISM",
    "UPPER_BOUND_MAX_PARALLELISM",
    "consumer_indexes",
    "flink_default_max_parallelism",
    "partition_batches",
]

#: Flink's ``Transformation.UPPER_BOUND_MAX_PARALLELISM``: the most Flink key groups a job can have.
UPPER_BOUND_MAX_PARALLELISM = 1 << 15
#: Flink's ``KeyGroupRangeAssignment.DEFAULT_LOWER_BOUND_MAX_PARALLELISM``.
DEFAULT_LOWER_BOUND_MAX_PARALLELISM = 1 << 7

KeyType = Literal["string", "bytes"]
NullKeys = Literal["partition", "error"]

_MASK = 0xFFFFFFFF
_REPLACEMENT = 0xFFFD  # U+FFFD, what the JDK decodes malformed UTF-8 to


# ----------------------------------------------------------------------------- compiled core
# All 32-bit Java int arithmetic is done on int64 values in [0, 2**32) and masked, so no
# intermediate overflows int64 (numba gives no wraparound guarantee worth relying on).


@njit(cache=True, nogil=True)
def _mul32(a: int, c: int) -> int:
    """(a * c) mod 2**32 for a, c in [0, 2**32), split so no product exceeds 2**48."""
    return (a * (c & 0xFFFF) + (((a * (c >> 16)) & 0xFFFF) << 16)) & _MASK


@njit(cache=True, nogil=True)
def _rotl32(x: int, r: int) -> int:
    return ((x << r) | (x >> (32 - r))) & _MASK


@njit(cache=True, nogil=True)
def _flink_murmur(code: int) -> int:
    """Flink's ``MathUtils.murmurHash(int)``: MurmurHash3_x86_32 of one int (seed 0), then
    folded to a non-negative int (negatives negated, Integer.MIN_VALUE to 0)."""
    h = _mul32(code, 0xCC9E2D51)
    h = _rotl32(h, 15)
    h = _mul32(h, 0x1B873593)
    h = _rotl32(h, 13)
    h = (_mul32(h, 5) + 0xE6546B64) & _MASK
    h ^= 4
    h ^= h >> 16
    h = _mul32(h, 0x85EBCA6B)
    h ^= h >> 13
    h = _mul32(h, 0xC2B2AE35)
    h ^= h >> 16
    if h < 0x80000000:
        return h
    if h == 0x80000000:  # Integer.MIN_VALUE has no positive negation
        return 0
    return (1 << 32) - h  # -(signed h)


@njit(cache=True, nogil=True)
def _string_hash(data: Any, start: int, end: int) -> int:
    """``new String(bytes, UTF_8).hashCode()`` as an unsigned 32-bit value.

    Decodes UTF-8 the way the JDK does (checked against OpenJDK 17 and 25 on random bytes):
    a malformed sequence becomes one U+FFFD per maximal valid prefix (Unicode's recommended
    practice), except that ED A0..BF (UTF-8-encoded surrogates) is read as a 3-byte
    sequence and replaced by a single U+FFFD, or one U+FFFD for its truncated prefix.
    Characters above U+FFFF count as two UTF-16 code units, as in Java.
    """
    h = 0
    i = start
    while i < end:
        b0 = np.int64(data[i])
        if b0 < 0x80:
            h = (h * 31 + b0) & _MASK
            i += 1
            continue
        if 0xC2 <= b0 <= 0xDF:
            need, lo, hi, cp = 1, 0x80, 0xBF, b0 & 0x1F
        elif b0 == 0xE0:
            need, lo, hi, cp = 2, 0xA0, 0xBF, b0 & 0x0F
        elif 0xE1 <= b0 <= 0xEF:  # ED included: the JDK decodes surrogates, then rejects them
            need, lo, hi, cp = 2, 0x80, 0xBF, b0 & 0x0F
        elif b0 == 0xF0:
            need, lo, hi, cp = 3, 0x90, 0xBF, b0 & 0x07
        elif 0xF1 <= b0 <= 0xF3:
            need, lo, hi, cp = 3, 0x80, 0xBF, b0 & 0x07
        elif b0 == 0xF4:
            need, lo, hi, cp = 3, 0x80, 0x8F, b0 & 0x07
        else:  # 80..C1 or F5..FF can never start a character
            h = (h * 31 + _REPLACEMENT) & _MASK
            i += 1
            continue
        j = 1
        while j <= need and i + j < end:
            b = np.int64(data[i + j])
            if b < lo or b > hi:
                break
            cp = (cp << 6) | (b & 0x3F)
            lo, hi = 0x80, 0xBF
            j += 1
        if j <= need:  # malformed or truncated: one U+FFFD for the valid prefix
            h = (h * 31 + _REPLACEMENT) & _MASK
            i += j
            continue
        i += need + 1
        if cp >= 0x10000:  # a surrogate pair in Java's UTF-16 String
            c = cp - 0x10000
            h = (h * 31 + (0xD800 + (c >> 10))) & _MASK
            h = (h * 31 + (0xDC00 + (c & 0x3FF))) & _MASK
        elif 0xD800 <= cp <= 0xDFFF:
            h = (h * 31 + _REPLACEMENT) & _MASK
        else:
            h = (h * 31 + cp) & _MASK
    return h


@njit(cache=True, nogil=True)
def _bytes_hash(data: Any, start: int, end: int) -> int:
    """``java.util.Arrays.hashCode(byte[])`` as an unsigned 32-bit value (bytes are signed)."""
    h = 1
    for i in range(start, end):
        b = np.int64(data[i])
        if b >= 0x80:
            b -= 0x100
        h = (h * 31 + b) & _MASK  # & on a negative int64 keeps its two's-complement bits
    return h


@njit(cache=True, nogil=True)
def _route(
    offsets: Any,
    data: Any,
    validity: Any,
    bit0: int,
    partitions: Any,
    bytes_mode: bool,
    max_parallelism: int,
    consumers: int,
) -> Any:
    """Consumer index per row. An empty ``validity`` means the key column has no nulls."""
    n = offsets.shape[0] - 1
    dest = np.empty(n, np.int32)
    has_nulls = validity.shape[0] > 0
    for i in range(n):
        bit = bit0 + i
        if has_nulls and ((validity[bit >> 3] >> (bit & 7)) & 1) == 0:
            code = np.int64(partitions[i]) & _MASK  # Integer.hashCode(partition) == partition
        elif bytes_mode:
            code = _bytes_hash(data, offsets[i], offsets[i + 1])
        else:
            code = _string_hash(data, offsets[i], offsets[i + 1])
        flink_key_group = _flink_murmur(code) % max_parallelism
        dest[i] = flink_key_group * consumers // max_parallelism
    return dest


@njit(cache=True, nogil=True)
def _stable_split(dest: Any, consumers: int) -> tuple[Any, Any, bool]:
    """Counting sort of row ids by consumer: O(n), stable, so each output keeps input order.

    Returns (permutation, bounds, already_ordered); consumer d owns rows
    bounds[d]:bounds[d+1] of the permuted batch. When ``dest`` is already non-decreasing
    (one consumer, one key, ...) the permutation is the identity and is not built.
    """
    n = dest.shape[0]
    bounds = np.zeros(consumers + 1, np.int64)
    ordered = True
    prev = 0
    for i in range(n):
        d = dest[i]
        bounds[d + 1] += 1
        if d < prev:
            ordered = False
        prev = d
    for d in range(consumers):
        bounds[d + 1] += bounds[d]
    if ordered:
        return np.empty(0, np.int64), bounds, True
    nxt = bounds[:-1].copy()
    perm = np.empty(n, np.int64)
    for i in range(n):
        d = dest[i]
        perm[nxt[d]] = i
        nxt[d] += 1
    return perm, bounds, False


# ----------------------------------------------------------------------------- Python surface


def _check_int(name: str, value: object, low: int, high: int, why: str) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        # an OptionError (a ValueError), not TypeError: callers catch one exception for any bad parallelism
        raise OptionError(f"{name} must be an integer in [{low}, {high}], got {value!r}")
    if not low <= int(value) <= high:
        raise OptionError(f"{name} must be in [{low}, {high}] ({why}), got {value}")
    return int(value)


def _check_parallelism(consumers: object, max_parallelism: object) -> tuple[int, int]:
    """Flink's own preconditions: 0 < parallelism <= maxParallelism <= 2**15."""
    max_p = _check_int("max_parallelism", max_parallelism, 1, UPPER_BOUND_MAX_PARALLELISM, "Flink's key group count")
    d = _check_int("consumers", consumers, 1, max_p, "Flink requires parallelism <= max_parallelism")
    return d, max_p


def _key_buffers(col: pa.Array) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
    """Zero-copy (offsets, data, validity bitmap, bitmap bit offset) of a binary/string column.

    A sliced array keeps its buffers; offsets are indexed from ``col.offset`` and stay
    absolute into the data buffer. An empty validity array means "no nulls".
    """
    t = col.type
    if pa.types.is_binary(t) or pa.types.is_string(t):
        off_type: type = np.int32
    elif pa.types.is_large_binary(t) or pa.types.is_large_string(t):
        off_type = np.int64
    else:
        try:
            col = col.cast(pa.large_binary())
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            raise RoutingError(f"key column must be binary or string, got {t}") from None
        off_type = np.int64
    n = len(col)
    bufs = col.buffers()
    offsets: np.ndarray = np.frombuffer(bufs[1], dtype=off_type, count=col.offset + n + 1)[col.offset :]
    data = np.frombuffer(bufs[2], dtype=np.uint8) if bufs[2] is not None and bufs[2].size else np.zeros(0, np.uint8)
    if col.null_count and bufs[0] is not None:
        return offsets, data, np.frombuffer(bufs[0], dtype=np.uint8), col.offset
    return offsets, data, np.zeros(0, np.uint8), 0


def _null_partitions(batch: pa.RecordBatch, null_keys: str) -> np.ndarray:
    """Kafka partition per row, needed only to route null keys."""
    if null_keys == "error":
        raise RoutingError("batch has null keys and null_keys='error' (Flink cannot route a null key)")
    try:
        col = batch.column("partition")
    except KeyError:
        raise RoutingError("null keys are routed by partition, but the batch has no 'partition' column") from None
    if col.null_count:
        raise RoutingError("'partition' column has nulls; null-key records cannot be routed")
    if col.type != pa.int32():
        try:
            col = col.cast(pa.int32())  # Kafka partitions are Java ints
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            raise RoutingError(f"'partition' column must hold 32-bit integers, got {col.type}") from None
    partitions: np.ndarray = col.to_numpy(zero_copy_only=False)
    return partitions


def consumer_indexes(
    batch: pa.RecordBatch,
    consumers: int,
    max_parallelism: int = DEFAULT_LOWER_BOUND_MAX_PARALLELISM,
    *,
    key_type: KeyType = "string",
    null_keys: NullKeys = "partition",
) -> np.ndarray:
    """The Flink subtask index (int32, in [0, consumers)) of every row of ``batch``.

    Same routing as `partition_batches`; useful on its own to compare with a Flink job or
    to route something other than a record batch.
    """
    d, max_p = _check_parallelism(consumers, max_parallelism)
    if key_type not in ("string", "bytes"):
        raise OptionError(f"key_type must be 'string' or 'bytes', got {key_type!r}")
    if null_keys not in ("partition", "error"):
        raise OptionError(f"null_keys must be 'partition' or 'error', got {null_keys!r}")
    if not isinstance(batch, pa.RecordBatch):
        raise NotARecordBatch(f"expected a pyarrow.RecordBatch, got {type(batch).__name__}")
    try:
        key = batch.column("key")
    except KeyError:
        raise RoutingError("record batch has no 'key' column") from None
    offsets, data, validity, bit0 = _key_buffers(key)
    if validity.shape[0]:
        partitions = _null_partitions(batch, null_keys)
    else:
        partitions = np.zeros(0, np.int32)
    dest: np.ndarray = _route(offsets, data, validity, bit0, partitions, key_type == "bytes", max_p, d)
    return dest


def partition_batches(
    batch: pa.RecordBatch,
    consumers: int,
    max_parallelism: int = DEFAULT_LOWER_BOUND_MAX_PARALLELISM,
    *,
    key_type: KeyType = "string",
    null_keys: NullKeys = "partition",
) -> list[pa.RecordBatch]:
    """Split ``batch`` by key into ``consumers`` batches, as Flink's keyBy would route them.

    Output d holds the rows a Flink job with parallelism ``consumers`` and max parallelism
    ``max_parallelism`` sends to subtask d, in input order (so each key's order survives);
    all columns are kept; some outputs may be empty. One hash pass and one counting sort
    per batch, then a single ``take``: no per-record Python work.

    ``key_type="string"`` (default): the job keys by ``new String(key, UTF_8)``;
    ``"bytes"``: by a key whose hashCode is ``Arrays.hashCode(byte[])``. Null keys
    (``null_keys="partition"``, default) are routed as the Integer Kafka partition, which
    keeps each partition's null-key records together and in order; ``"error"`` raises.

    Note Flink's own default max parallelism is `flink_default_max_parallelism`
    (128 only up to parallelism 85): pass the job's actual value.
    """
    dest = consumer_indexes(batch, consumers, max_parallelism, key_type=key_type, null_keys=null_keys)
    d = int(consumers)
    if d == 1:
        return [batch]
    perm, bounds, ordered = _stable_split(dest, d)
    source = batch if ordered else batch.take(pa.array(perm, type=pa.int64()))
    empty = source.slice(0, 0)  # shared by all empty outputs: cheap when D is in the thousands
    b = bounds.tolist()
    return [source.slice(b[i], b[i + 1] - b[i]) if b[i + 1] > b[i] else empty for i in range(d)]


def flink_default_max_parallelism(parallelism: int) -> int:
    """Flink's ``KeyGroupRangeAssignment.computeDefaultMaxParallelism``: the max parallelism
    a job gets when none is configured (1.5x parallelism rounded up to a power of two,
    clamped to [128, 32768]). Routing depends on it, so it must match the job's."""
    p = _check_int("parallelism", parallelism, 1, UPPER_BOUND_MAX_PARALLELISM, "Flink's bounds")
    rounded = 1 << (p + p // 2 - 1).bit_length()
    return min(max(rounded, DEFAULT_LOWER_BOUND_MAX_PARALLELISM), UPPER_BOUND_MAX_PARALLELISM)

"""Arrow binary columns as flat numpy buffers and back: the form the compiled codecs work
on. One builder for every decoder (envelope, Kafka Connect) and the generator."""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from keygroups._numba import njit

# Scratch larger than this is not kept: a decode of one large file (compaction, inspect)
# allocates its own rather than pinning it to the thread for the thread's life.
SCRATCH_KEPT_BYTES = 64 << 20


class Scratch(threading.local):
    """A byte buffer each thread reuses from one decode to the next (the decompressed
    blocks, read once and dropped), grown when a decode needs more. Allocated afresh for
    every step of every reader thread, it left glibc's per-thread arenas holding freed
    memory far beyond what the read budget counts
    (docs/performance.md#large-buffers-mapped)."""

    def __init__(self) -> None:
        self.kept = np.empty(0, np.uint8)

    def __call__(self, size: int) -> np.ndarray:
        """`size` bytes, valid until this thread's next call."""
        if size > SCRATCH_KEPT_BYTES:
            return np.empty(size, np.uint8)
        if self.kept.shape[0] < size:
            self.kept = np.empty(0, np.uint8)  # the old one goes before the new one comes
            self.kept = np.empty(min(SCRATCH_KEPT_BYTES, max(size, 1 << 20)), np.uint8)
        return self.kept[:size]


@dataclass
class BinaryBuffers:
    """A binary/string Arrow column as flat numpy buffers."""

    offsets: np.ndarray  # int64, n + 1
    data: np.ndarray  # uint8
    valid: np.ndarray  # bool, n


def binary_buffers(arr: pa.Array) -> BinaryBuffers:
    arr = arr.cast(pa.large_binary()) if not pa.types.is_large_binary(arr.type) else arr
    if arr.offset:
        arr = pa.concat_arrays([arr])  # rebase a sliced array so buffers start at row 0
    bufs = arr.buffers()
    offsets = np.frombuffer(bufs[1], dtype=np.int64, count=len(arr) + 1)
    data = np.frombuffer(bufs[2], dtype=np.uint8) if bufs[2] is not None else np.zeros(0, np.uint8)
    # no compute call where nothing is null (records, keys): one per parcel and piece added up to 1% of the rewrite
    valid = arr.is_valid().to_numpy(zero_copy_only=False) if arr.null_count else np.ones(len(arr), np.bool_)
    return BinaryBuffers(offsets, data, valid)


def arrow_binary(
    n: int, offsets: np.ndarray, data: np.ndarray, valid: np.ndarray | None, typ: pa.DataType = pa.binary()
) -> pa.Array:
    """A binary (or string) Arrow array of n items over `offsets` (int32; int64 for the large
    types; n + 1 of them, or more: the rest is ignored), `data`, and `valid` (None: no nulls). The buffers are used
    as they are, not copied."""
    nulls = 0 if valid is None else int(n - np.count_nonzero(valid[:n]))
    validity = pa.py_buffer(np.packbits(valid[:n], bitorder="little")) if nulls and valid is not None else None
    return pa.Array.from_buffers(
        typ, n, [validity, pa.py_buffer(offsets[: n + 1]), pa.py_buffer(data)], null_count=nulls
    )


# numba's stub gives an intrinsic's call the parameters of its typing function, typingctx
# included: compiled code passes one fewer, hence type: ignore[call-arg] where it is called.
@intrinsic
def copy_bytes(typingctx: Any, dst: Any, dst_at: Any, src: Any, src_at: Any, count: Any) -> Any:
    """dst[dst_at : dst_at + count] = src[src_at : src_at + count] as one memcpy, in compiled
    code. A numba slice assignment copies byte by byte, slower for short records
    (docs/performance.md#byte-copies-in-compiled-code), and no library gathers byte strings
    into numba's arrays. Unchecked, as memcpy is: the caller keeps both ranges inside their
    arrays, and apart. (numba's cache does not see a change here: clear the callers' caches
    if this changes.)"""

    def flat_bytes(a: Any) -> bool:
        return isinstance(a, types.Array) and a.dtype == types.uint8 and a.ndim == 1 and a.layout == "C"

    if not (flat_bytes(dst) and flat_bytes(src) and dst.mutable):
        return None  # a typing error where it is called: no copy into anything but flat, writable bytes
    sig = types.void(dst, types.int64, src, types.int64, types.int64)

    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        d, d_at, s, s_at, n = args
        d_arr = context.make_array(signature.args[0])(context, builder, d)
        s_arr = context.make_array(signature.args[2])(context, builder, s)
        cgutils.raw_memcpy(builder, builder.gep(d_arr.data, [d_at]), builder.gep(s_arr.data, [s_at]), n, 1)
        return context.get_dummy_value()

    return sig, codegen


@njit(cache=True, nogil=True)
def gather_ranges(buf: np.ndarray, pos: np.ndarray, length: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """buf[pos[i] : pos[i] + length[i]] for every i, concatenated: int64 offsets and data (a
    negative length, a null, gives an empty item)."""
    n = len(pos)
    offsets = np.zeros(n + 1, np.int64)
    for i in range(n):
        offsets[i + 1] = offsets[i] + max(length[i], 0)
    data = np.empty(offsets[n], np.uint8)
    for i in range(n):
        if length[i] > 0:
            copy_bytes(data, offsets[i], buf, pos[i], length[i])  # type: ignore[call-arg]  # numba stub: see copy_bytes
    return offsets, data


def take_binary(arr: pa.Array, idx: np.ndarray) -> pa.Array:
    """`arr.take(idx)` for a binary column without nulls, as large_binary. Arrow's take copies
    item by item through a builder, slower on the rewrite's shuffled runs
    (docs/performance.md#byte-copies-in-compiled-code)."""
    cols = binary_buffers(arr)
    pos = cols.offsets[idx]
    offsets, data = gather_ranges(cols.data, pos, cols.offsets[idx + 1] - pos)
    return arrow_binary(len(idx), offsets, data, None, pa.large_binary())


@dataclass
class EnvelopeBuffers:
    """Envelope records as the flat arrays the compiled kernels (encoder, decoder,
    fingerprints) take, in this field order."""

    part: np.ndarray  # int32
    off: np.ndarray  # int64
    ts: np.ndarray  # int64 epoch ms
    k_off: np.ndarray
    k_data: np.ndarray
    k_valid: np.ndarray
    v_off: np.ndarray
    v_data: np.ndarray
    v_valid: np.ndarray
    h_off: np.ndarray  # headers of record i: items h_off[i]..h_off[i + 1]
    hk_off: np.ndarray
    hk_data: np.ndarray
    hv_off: np.ndarray
    hv_data: np.ndarray
    hv_valid: np.ndarray

    @classmethod
    def from_batch(cls, batch: pa.RecordBatch) -> EnvelopeBuffers:
        """From a batch with the envelope's columns (views where Arrow allows)."""
        key, val = binary_buffers(batch.column("key")), binary_buffers(batch.column("value"))
        headers = batch.column("headers")
        if headers.offset:
            headers = pa.concat_arrays([headers])
        items = headers.values
        hkey, hval = binary_buffers(items.field("key")), binary_buffers(items.field("value"))
        return cls(
            batch.column("partition").to_numpy(zero_copy_only=False).astype(np.int32, copy=False),
            batch.column("offset").to_numpy(zero_copy_only=False).astype(np.int64, copy=False),
            batch.column("timestamp").cast(pa.int64()).to_numpy(zero_copy_only=False),
            key.offsets,
            key.data,
            key.valid,
            val.offsets,
            val.data,
            val.valid,
            headers.offsets.to_numpy().astype(np.int64),
            hkey.offsets,
            hkey.data,
            hval.offsets,
            hval.data,
            hval.valid,
        )

    def arrays(self) -> tuple[np.ndarray, ...]:
        return tuple(getattr(self, f) for f in self.__dataclass_fields__)

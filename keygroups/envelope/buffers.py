"""Arrow binary columns as flat numpy buffers and back: the form the compiled codecs work
on. One builder for every decoder (envelope, Kafka Connect) and the generator."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa


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
    valid = arr.is_valid().to_numpy(zero_copy_only=False)
    return BinaryBuffers(offsets, data, valid)


def arrow_binary(
    n: int, offsets: np.ndarray, data: np.ndarray, valid: np.ndarray | None, typ: pa.DataType = pa.binary()
) -> pa.Array:
    """A binary (or string) Arrow array of n items over int32 `offsets` (n + 1 of them, or
    more: the rest is ignored), `data`, and `valid` (None: no nulls). The buffers are used
    as they are, not copied."""
    nulls = 0 if valid is None else int(n - np.count_nonzero(valid[:n]))
    validity = pa.py_buffer(np.packbits(valid[:n], bitorder="little")) if nulls else None
    return pa.Array.from_buffers(
        typ, n, [validity, pa.py_buffer(offsets[: n + 1]), pa.py_buffer(data)], null_count=nulls
    )

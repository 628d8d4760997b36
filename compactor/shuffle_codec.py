"""What crosses a Spark shuffle of keyfill's: one Arrow IPC message per value (a parcel of the
rewrite, a blob of the statistics' key sums), compressed on Spark.

The JVM copies, sorts and compresses every byte it is handed; the messages compress ~5x
(encoded records, key sums), so zstd (level 1) leaves it fewer bytes and shortens both
passes (measured with `bench/bench_scale.py`: docs/performance.md#shuffle-codec). In this
process nothing moves, so the passes there pack with no codec.
"""

from __future__ import annotations

import pyarrow as pa

CODEC = "zstd"


def pack(message: pa.Buffer, codec: str | None) -> bytes | pa.Buffer:
    """The message as it crosses: as it is, or its size (8 bytes, little-endian) and then
    the message compressed."""
    if codec is None:
        return message
    return message.size.to_bytes(8, "little") + pa.compress(message, codec=codec, asbytes=True)


def unpack(value: bytes | pa.Buffer, codec: str | None) -> pa.Buffer:
    """The message of a packed value (bytes or a buffer). Without a codec it is a view on
    `value`; with one, memory of its own."""
    if codec is None:
        return pa.py_buffer(value)
    view = memoryview(value)
    return pa.decompress(view[8:], int.from_bytes(view[:8], "little"), codec=codec)

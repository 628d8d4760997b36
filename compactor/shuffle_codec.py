"""What crosses a Spark shuffle of keyfill's: one Arrow IPC message per value (a parcel of the
rewrite, a blob of the statistics' key sums), compressed on Spark.

The JVM copies, sorts and compresses every byte it is handed; the messages compress ~5x
(encoded records, key sums), so zstd (level 1) leaves it fewer bytes and shortens both
passes (measured with `bench/bench_scale.py`: docs/performance.md#shuffle-codec). In this
process nothing moves, so the passes there pack with no codec.
"""

from __future__ import annotations

import threading

import pyarrow as pa
import zstandard

CODEC = "zstd"

# zstandard's compressor and decompressor keep their contexts between calls, where pyarrow's
# zstd makes new ones per call: parcels are ~32 KiB, and with reused contexts zstd compressed
# them 5% faster and decompressed them 30% faster (docs/performance.md#shuffle-codec). A
# context serves one call at a time: one per thread.
_ZSTD = threading.local()


def _zstd() -> tuple[zstandard.ZstdCompressor, zstandard.ZstdDecompressor]:
    try:
        return _ZSTD.pair  # type: ignore[no-any-return]
    except AttributeError:
        _ZSTD.pair = (zstandard.ZstdCompressor(level=1), zstandard.ZstdDecompressor())
        return _ZSTD.pair  # type: ignore[no-any-return]


def pack(message: pa.Buffer, codec: str | None) -> bytes | pa.Buffer:
    """The message as it crosses: as it is, or its size (8 bytes, little-endian) and then
    the message compressed."""
    if codec is None:
        return message
    head = message.size.to_bytes(8, "little")
    if codec == "zstd":
        return head + _zstd()[0].compress(message)
    return head + pa.compress(message, codec=codec, asbytes=True)


def unpack(value: bytes | pa.Buffer, codec: str | None) -> pa.Buffer:
    """The message of a packed value (bytes or a buffer). Without a codec it is a view on
    `value`; with one, memory of its own."""
    if codec is None:
        return pa.py_buffer(value)
    view = memoryview(value)
    size = int.from_bytes(view[:8], "little")
    if codec == "zstd":
        return pa.py_buffer(_zstd()[1].decompress(view[8:], max_output_size=size))
    return pa.decompress(view[8:], size, codec=codec)

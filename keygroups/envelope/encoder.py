"""Writing envelope records as an Avro object container file.

The block encoder is specialised for the one envelope schema and compiled with numba:
fastavro's generic writer turns every record into a Python dict, which makes multi-GB
archives take far too long (docs/performance.md#avro-decoded-and-encoded-by-compiled-loops).
The file header is still written by fastavro, and every file is readable by any Avro reader.
"""

from __future__ import annotations

import io

import fastavro
import numpy as np
import pyarrow as pa

from keygroups._numba import Int, njit
from keygroups.envelope.buffers import EnvelopeBuffers, arrow_binary, binary_buffers
from keygroups.envelope.framing import compress, put_bytes, put_varint, read_varint, varint_bytes, varint_size
from keygroups.envelope.schema import (
    CODECS,
    DEFAULT_BLOCK_BYTES,
    ENCODED_SCHEMA,
    PARSED_SCHEMA,
    conform,
    record_bytes,
)
from keygroups.errors import OptionError


@njit(cache=True, nogil=True)
def _record_sizes(
    part: np.ndarray,
    off: np.ndarray,
    ts: np.ndarray,
    k_off: np.ndarray,
    k_valid: np.ndarray,
    v_off: np.ndarray,
    v_valid: np.ndarray,
    h_off: np.ndarray,
    hk_off: np.ndarray,
    hv_off: np.ndarray,
    hv_valid: np.ndarray,
) -> np.ndarray:
    n = part.shape[0]
    sizes = np.empty(n, np.int64)
    for i in range(n):
        s = varint_size(np.int64(part[i])) + varint_size(off[i]) + varint_size(ts[i]) + 2
        if k_valid[i]:
            length = k_off[i + 1] - k_off[i]
            s += varint_size(length) + length
        if v_valid[i]:
            length = v_off[i + 1] - v_off[i]
            s += varint_size(length) + length
        count = h_off[i + 1] - h_off[i]
        s += 1
        if count > 0:
            s += varint_size(count)
            for j in range(h_off[i], h_off[i + 1]):
                length = hk_off[j + 1] - hk_off[j]
                s += varint_size(length) + length + 1
                if hv_valid[j]:
                    length = hv_off[j + 1] - hv_off[j]
                    s += varint_size(length) + length
        sizes[i] = s
    return sizes


@njit(cache=True, nogil=True)
def _encode_records(
    out: np.ndarray,
    lo: int,
    hi: int,
    part: np.ndarray,
    off: np.ndarray,
    ts: np.ndarray,
    k_off: np.ndarray,
    k_data: np.ndarray,
    k_valid: np.ndarray,
    v_off: np.ndarray,
    v_data: np.ndarray,
    v_valid: np.ndarray,
    h_off: np.ndarray,
    hk_off: np.ndarray,
    hk_data: np.ndarray,
    hv_off: np.ndarray,
    hv_data: np.ndarray,
    hv_valid: np.ndarray,
) -> Int:
    pos: Int = 0
    for i in range(lo, hi):
        pos = put_varint(out, pos, np.int64(part[i]))
        pos = put_varint(out, pos, off[i])
        pos = put_varint(out, pos, ts[i])
        if k_valid[i]:
            out[pos] = 2  # union branch 1 (bytes), zigzag-encoded
            pos = put_bytes(out, pos + 1, k_data, k_off[i], k_off[i + 1])
        else:
            out[pos] = 0
            pos += 1
        if v_valid[i]:
            out[pos] = 2
            pos = put_bytes(out, pos + 1, v_data, v_off[i], v_off[i + 1])
        else:
            out[pos] = 0
            pos += 1
        count = h_off[i + 1] - h_off[i]
        if count > 0:
            pos = put_varint(out, pos, count)
            for j in range(h_off[i], h_off[i + 1]):
                pos = put_bytes(out, pos, hk_data, hk_off[j], hk_off[j + 1])
                if hv_valid[j]:
                    out[pos] = 2
                    pos = put_bytes(out, pos + 1, hv_data, hv_off[j], hv_off[j + 1])
                else:
                    out[pos] = 0
                    pos += 1
        out[pos] = 0  # end of the headers array
        pos += 1
    return pos


def encode_avro(
    batch: pa.RecordBatch,
    *,
    codec: str = "snappy",
    metadata: dict[str, str] | None = None,
    sync_marker: bytes | None = None,
    block_bytes: int = DEFAULT_BLOCK_BYTES,
) -> bytes:
    """One Avro object container file holding `batch` in row order.

    `sync_marker` makes the output byte-for-byte reproducible (invariant 6); without one a
    marker is derived from the content.
    """
    _check_codec(codec)
    cols = EnvelopeBuffers.from_batch(conform(batch))
    records, sizes = _encode(cols)
    if sync_marker is None:
        sync_marker = _content_marker(sizes, cols.ts)
    return avro_header(codec=codec, metadata=metadata, sync_marker=sync_marker) + blocks_of(
        records, codec=codec, sync_marker=sync_marker, block_bytes=block_bytes
    )


def avro_header(*, codec: str, metadata: dict[str, str] | None, sync_marker: bytes) -> bytes:
    """The container header alone: magic, metadata (schema, codec, `metadata`), sync marker.
    A segment file is this followed by its pieces' blocks."""
    _check_codec(codec)
    head = io.BytesIO()
    fastavro.writer(head, PARSED_SCHEMA, [], codec=codec, metadata=metadata, sync_marker=sync_marker)
    return head.getvalue()


def encode_records(batch: pa.RecordBatch) -> pa.Array:
    """Each envelope record as its Avro binary encoding (what a block holds, record after
    record); binary, or large_binary past 2 GiB. The compaction encodes records before its
    shuffle: Spark then moves one binary column instead of the nested headers, and the
    writing task only cuts and compresses."""
    return _encode(EnvelopeBuffers.from_batch(conform(batch)))[0]


def encoded_batch(batch: pa.RecordBatch) -> pa.RecordBatch:
    """An ARROW_SCHEMA batch as the compaction moves its records (ENCODED_SCHEMA)."""
    batch = conform(batch)
    return pa.RecordBatch.from_arrays(
        [
            *(batch.column(n) for n in ("partition", "offset", "timestamp", "key")),
            pa.array(record_bytes(batch)),
            encode_records(batch).cast(pa.large_binary()),
        ],
        schema=ENCODED_SCHEMA,
    )


def _encode(cols: EnvelopeBuffers) -> tuple[pa.Array, np.ndarray]:
    sizes = _sizes(cols)
    offsets = np.zeros(len(sizes) + 1, np.int64)
    np.cumsum(sizes, out=offsets[1:])
    data = np.empty(int(offsets[-1]), np.uint8)
    written = _encode_records(data, 0, len(sizes), *cols.arrays())
    assert written == len(data)
    typ = pa.large_binary()
    if len(data) < 2**31:  # Spark's binary column (int32 offsets)
        offsets, typ = offsets.astype(np.int32), pa.binary()
    return arrow_binary(len(sizes), offsets, data, None, typ), sizes


def encode_blocks(
    batch: pa.RecordBatch, *, codec: str, sync_marker: bytes, block_bytes: int = DEFAULT_BLOCK_BYTES
) -> bytes:
    """`batch` as whole data blocks (no header), each ending in `sync_marker`: appended to a
    header with the same codec and marker, or to other such runs, they form a valid file,
    and a run decodes on its own from the header plus its bytes (a piece)."""
    return blocks_of(encode_records(batch), codec=codec, sync_marker=sync_marker, block_bytes=block_bytes)


def blocks_of(records: pa.Array, *, codec: str, sync_marker: bytes, block_bytes: int = DEFAULT_BLOCK_BYTES) -> bytes:
    """Records already encoded (`encode_records`, binary or large_binary) as data blocks, cut
    at record boundaries once a block reaches `block_bytes`: `encode_blocks`' bytes."""
    _check_codec(codec)
    cols = binary_buffers(records)
    ends, data = cols.offsets, cols.data
    start = int(ends[0])
    ends = ends[1:]
    n = len(ends)
    parts = []
    lo = 0
    while lo < n:
        base = int(ends[lo - 1]) if lo else start
        hi = int(np.searchsorted(ends, base + block_bytes, side="left")) + 1
        hi = min(max(hi, lo + 1), n)
        block = compress(codec, data[base : int(ends[hi - 1])])  # a view: the codecs read buffers
        parts += [varint_bytes(hi - lo), varint_bytes(len(block)), block, sync_marker]
        lo = hi
    return b"".join(parts)


def _check_codec(codec: str) -> None:
    if codec not in CODECS:
        raise OptionError(f"unknown Avro codec {codec!r}; choose one of {', '.join(CODECS)}")


def _sizes(c: EnvelopeBuffers) -> np.ndarray:
    return _record_sizes(
        c.part, c.off, c.ts, c.k_off, c.k_valid, c.v_off, c.v_valid, c.h_off, c.hk_off, c.hv_off, c.hv_valid
    )


def _content_marker(sizes: np.ndarray, ts: np.ndarray) -> bytes:
    import hashlib

    h = hashlib.blake2b(digest_size=16)
    h.update(sizes.tobytes())
    h.update(np.ascontiguousarray(ts).tobytes())
    return h.digest()


@njit(cache=True, nogil=True)
def _leading_fields(offsets: np.ndarray, data: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    n = offsets.shape[0] - 1
    part, off, ts = np.empty(n, np.int32), np.empty(n, np.int64), np.empty(n, np.int64)
    fields = np.empty(3, np.int64)
    for i in range(n):
        pos, end = offsets[i], offsets[i + 1]
        for f in range(3):  # a failed read leaves pos at -1, where the next would wrap around: stop at once
            fields[f], pos = read_varint(data, pos, end)
            if pos < 0:
                raise ValueError("an encoded record shorter than its leading fields")
        part[i], off[i], ts[i] = fields[0], fields[1], fields[2]
    return part, off, ts


def leading_fields(records: pa.Array) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(partition, offset, timestamp in epoch ms) of records encoded as `encode_records`
    encodes them (ENCODED_SCHEMA's `record`): the fields every encoding begins with. The
    compaction ships the encodings alone and reads these back where it sorts."""
    cols = binary_buffers(records)
    return _leading_fields(cols.offsets, cols.data)

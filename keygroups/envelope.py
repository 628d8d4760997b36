"""The envelope record: one Kafka record as keyfill stores it, in source archives and in
compacted archives alike (see docs/envelope-archive.md).

Records travel as Arrow record batches (`ARROW_SCHEMA`) and are written as Avro object
container files. The block encoder is specialised for this one fixed schema and compiled
with numba: fastavro's generic writer turns every record into a Python dict and runs at
about 200K records/s, which makes multi-GB benchmark archives take far too long. The file
header is still written by fastavro, and every file is readable by any Avro reader.
"""

from __future__ import annotations

import io
import zlib
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone

import fastavro
import numpy as np
import pyarrow as pa

from keygroups._numba import njit
from keygroups.errors import CorruptFile, HeaderTruncated, OptionError

AVRO_SCHEMA = {
    "type": "record",
    "name": "Envelope",
    "namespace": "keyfill",
    "doc": "One Kafka record: where it was (partition, offset), when (timestamp) and what.",
    "fields": [
        {"name": "partition", "type": "int"},
        {"name": "offset", "type": "long"},
        {"name": "timestamp", "type": {"type": "long", "logicalType": "timestamp-millis"}},
        {"name": "key", "type": ["null", "bytes"], "default": None},
        {"name": "value", "type": ["null", "bytes"], "default": None},
        {
            "name": "headers",
            "type": {
                "type": "array",
                "items": {
                    "type": "record",
                    "name": "Header",
                    "fields": [
                        {"name": "key", "type": "string"},
                        {"name": "value", "type": ["null", "bytes"], "default": None},
                    ],
                },
            },
            "default": [],
        },
    ],
}
PARSED_SCHEMA = fastavro.parse_schema(AVRO_SCHEMA)

HEADER_TYPE = pa.struct([pa.field("key", pa.string(), nullable=False), ("value", pa.binary())])
ARROW_SCHEMA = pa.schema(
    [
        pa.field("partition", pa.int32(), nullable=False),
        pa.field("offset", pa.int64(), nullable=False),
        pa.field("timestamp", pa.timestamp("ms", tz="UTC"), nullable=False),
        ("key", pa.binary()),
        ("value", pa.binary()),
        pa.field("headers", pa.list_(HEADER_TYPE), nullable=False),
    ]
)

CODECS = ("null", "deflate", "snappy")
DEFAULT_BLOCK_BYTES = 256 * 1024


def empty_batch() -> pa.RecordBatch:
    return pa.RecordBatch.from_pylist([], schema=ARROW_SCHEMA)


def batch_from_records(records: list[dict]) -> pa.RecordBatch:
    """Arrow batch from fastavro-style dicts (timestamp as int ms or aware datetime)."""
    return pa.RecordBatch.from_pylist(records, schema=ARROW_SCHEMA)


# --- Avro block encoding ----------------------------------------------------------------


@dataclass
class _Binary:
    """A binary/string Arrow column as flat numpy buffers."""

    offsets: np.ndarray  # int64, n + 1
    data: np.ndarray  # uint8
    valid: np.ndarray  # bool, n


def _binary(arr: pa.Array) -> _Binary:
    arr = arr.cast(pa.large_binary()) if not pa.types.is_large_binary(arr.type) else arr
    if arr.offset:
        arr = pa.concat_arrays([arr])  # rebase a sliced array so buffers start at row 0
    bufs = arr.buffers()
    offsets = np.frombuffer(bufs[1], dtype=np.int64, count=len(arr) + 1)
    data = np.frombuffer(bufs[2], dtype=np.uint8) if bufs[2] is not None else np.zeros(0, np.uint8)
    valid = arr.is_valid().to_numpy(zero_copy_only=False)
    return _Binary(offsets, data, valid)


@njit(cache=True, nogil=True)
def _varint_size(n):
    z = (n << 1) ^ (n >> 63)  # zigzag
    size = 1
    while z >= 0x80 or z < 0:  # z is int64: treat as unsigned
        z = (z >> 7) & 0x01FFFFFFFFFFFFFF
        size += 1
    return size


@njit(cache=True, nogil=True)
def _put_varint(out, pos, n):
    z = (n << 1) ^ (n >> 63)
    while z >= 0x80 or z < 0:
        out[pos] = (z & 0x7F) | 0x80
        z = (z >> 7) & 0x01FFFFFFFFFFFFFF
        pos += 1
    out[pos] = z
    return pos + 1


@njit(cache=True, nogil=True)
def _put_bytes(out, pos, data, start, end):
    pos = _put_varint(out, pos, end - start)
    out[pos : pos + end - start] = data[start:end]
    return pos + end - start


@njit(cache=True, nogil=True)
def _record_sizes(part, off, ts, k_off, k_valid, v_off, v_valid, h_off, hk_off, hv_off, hv_valid):
    n = part.shape[0]
    sizes = np.empty(n, np.int64)
    for i in range(n):
        s = _varint_size(np.int64(part[i])) + _varint_size(off[i]) + _varint_size(ts[i]) + 2
        if k_valid[i]:
            length = k_off[i + 1] - k_off[i]
            s += _varint_size(length) + length
        if v_valid[i]:
            length = v_off[i + 1] - v_off[i]
            s += _varint_size(length) + length
        count = h_off[i + 1] - h_off[i]
        s += 1
        if count > 0:
            s += _varint_size(count)
            for j in range(h_off[i], h_off[i + 1]):
                length = hk_off[j + 1] - hk_off[j]
                s += _varint_size(length) + length + 1
                if hv_valid[j]:
                    length = hv_off[j + 1] - hv_off[j]
                    s += _varint_size(length) + length
        sizes[i] = s
    return sizes


@njit(cache=True, nogil=True)
def _encode_records(
    out,
    lo,
    hi,
    part,
    off,
    ts,
    k_off,
    k_data,
    k_valid,
    v_off,
    v_data,
    v_valid,
    h_off,
    hk_off,
    hk_data,
    hv_off,
    hv_data,
    hv_valid,
):
    pos = 0
    for i in range(lo, hi):
        pos = _put_varint(out, pos, np.int64(part[i]))
        pos = _put_varint(out, pos, off[i])
        pos = _put_varint(out, pos, ts[i])
        if k_valid[i]:
            out[pos] = 2  # union branch 1 (bytes), zigzag-encoded
            pos = _put_bytes(out, pos + 1, k_data, k_off[i], k_off[i + 1])
        else:
            out[pos] = 0
            pos += 1
        if v_valid[i]:
            out[pos] = 2
            pos = _put_bytes(out, pos + 1, v_data, v_off[i], v_off[i + 1])
        else:
            out[pos] = 0
            pos += 1
        count = h_off[i + 1] - h_off[i]
        if count > 0:
            pos = _put_varint(out, pos, count)
            for j in range(h_off[i], h_off[i + 1]):
                pos = _put_bytes(out, pos, hk_data, hk_off[j], hk_off[j + 1])
                if hv_valid[j]:
                    out[pos] = 2
                    pos = _put_bytes(out, pos + 1, hv_data, hv_off[j], hv_off[j + 1])
                else:
                    out[pos] = 0
                    pos += 1
        out[pos] = 0  # end of the headers array
        pos += 1
    return pos


def _compress(codec: str, data: bytes) -> bytes:
    if codec == "null":
        return data
    if codec == "deflate":
        c = zlib.compressobj(6, zlib.DEFLATED, -15)  # Avro's deflate is raw, no zlib header
        return c.compress(data) + c.flush()
    if codec == "snappy":
        import cramjam

        # Avro's snappy: the raw snappy block followed by the big-endian CRC32 of the input.
        return bytes(cramjam.snappy.compress_raw(data)) + zlib.crc32(data).to_bytes(4, "big")
    raise OptionError(f"unknown Avro codec {codec!r}; choose one of {', '.join(CODECS)}")


def _varint_bytes(n: int) -> bytes:
    out = bytearray()
    z = (n << 1) ^ (n >> 63)
    while z >= 0x80:
        out.append((z & 0x7F) | 0x80)
        z >>= 7
    out.append(z)
    return bytes(out)


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
    if codec not in CODECS:
        raise OptionError(f"unknown Avro codec {codec!r}; choose one of {', '.join(CODECS)}")
    batch = conform(batch)
    n = batch.num_rows
    part = batch.column("partition").to_numpy(zero_copy_only=False).astype(np.int32, copy=False)
    off = batch.column("offset").to_numpy(zero_copy_only=False).astype(np.int64, copy=False)
    ts = batch.column("timestamp").cast(pa.int64()).to_numpy(zero_copy_only=False)
    key = _binary(batch.column("key"))
    val = _binary(batch.column("value"))
    headers = batch.column("headers")
    if headers.offset:
        headers = pa.concat_arrays([headers])
    h_off = headers.offsets.to_numpy().astype(np.int64)
    items = headers.values
    hkey = _binary(items.field("key"))
    hval = _binary(items.field("value"))
    sizes = _record_sizes(
        part,
        off,
        ts,
        key.offsets,
        key.valid,
        val.offsets,
        val.valid,
        h_off,
        hkey.offsets,
        hval.offsets,
        hval.valid,
    )

    if sync_marker is None:
        sync_marker = _content_marker(sizes, ts)
    head = io.BytesIO()
    fastavro.writer(head, PARSED_SCHEMA, [], codec=codec, metadata=metadata, sync_marker=sync_marker)
    parts = [head.getvalue()]

    # Cut blocks at record boundaries once they reach block_bytes.
    ends = np.cumsum(sizes)
    lo = 0
    scratch = np.empty(max(int(sizes.max()) if n else 0, block_bytes) * 2, dtype=np.uint8)
    while lo < n:
        base = ends[lo - 1] if lo else 0
        hi = int(np.searchsorted(ends, base + block_bytes, side="left")) + 1
        hi = min(max(hi, lo + 1), n)
        length = int(ends[hi - 1] - base)
        if scratch.shape[0] < length:
            scratch = np.empty(length, dtype=np.uint8)
        written = _encode_records(
            scratch,
            lo,
            hi,
            part,
            off,
            ts,
            key.offsets,
            key.data,
            key.valid,
            val.offsets,
            val.data,
            val.valid,
            h_off,
            hkey.offsets,
            hkey.data,
            hval.offsets,
            hval.data,
            hval.valid,
        )
        assert written == length
        block = _compress(codec, scratch[:length].tobytes())
        parts += [_varint_bytes(hi - lo), _varint_bytes(len(block)), block, sync_marker]
        lo = hi
    return b"".join(parts)


def _content_marker(sizes: np.ndarray, ts: np.ndarray) -> bytes:
    import hashlib

    h = hashlib.blake2b(digest_size=16)
    h.update(sizes.tobytes())
    h.update(np.ascontiguousarray(ts).tobytes())
    return h.digest()


def conform(batch: pa.RecordBatch | pa.Table) -> pa.RecordBatch:
    """`batch` with exactly ARROW_SCHEMA's columns and types (extra columns dropped)."""
    if isinstance(batch, pa.Table):
        batch = batch.combine_chunks().to_batches()[0] if batch.num_rows else empty_batch()
    cols = []
    for field in ARROW_SCHEMA:
        try:
            col = batch.column(field.name)
        except KeyError:
            raise ValueError(f"record batch has no {field.name!r} column") from None
        if col.type != field.type:
            col = col.cast(field.type)
        cols.append(col)
    return pa.RecordBatch.from_arrays(cols, schema=ARROW_SCHEMA)


# --- fast decoding -------------------------------------------------------------------------
# fastavro builds a dict per record (about 230K records/s, GIL held). Envelope files have one
# fixed schema, so compiled loops read the container's block framing and the records straight
# into Arrow buffers with the GIL released (only the small header, decompression and the
# Arrow wrapping run in Python), letting reader threads decode in parallel.

# Error codes of the compiled Avro readers (shared with compactor.sources.kafka_connect).
ERR_EOF, ERR_UNION, ERR_NEGATIVE = 1, 2, 3
_ERR_EOF, _ERR_UNION, _ERR_NEGATIVE = ERR_EOF, ERR_UNION, ERR_NEGATIVE
_ERR_SYNC, _ERR_RANGE = 5, 6


@njit(cache=True, nogil=True)
def read_varint(buf, pos, end):
    """(value, new pos); new pos -1 when the varint runs past `end` or is too long."""
    z = np.int64(0)
    shift = 0
    while True:
        if pos >= end or shift > 63:
            return np.int64(0), -1
        b = np.int64(buf[pos])
        pos += 1
        z |= (b & 0x7F) << shift
        if b < 0x80:
            break
        shift += 7
    return ((z >> 1) & 0x7FFFFFFFFFFFFFFF) ^ -(z & 1), pos  # logical shift: z is unsigned


@njit(cache=True, nogil=True)
def read_block_count(buf, pos, end):
    """An Avro array block's item count: (count, new pos), new pos -1 past `end`. A
    negative count is followed by the block's byte size, which readers do not need."""
    count, pos = read_varint(buf, pos, end)
    if pos >= 0 and count < 0:
        count = -count
        _, pos = read_varint(buf, pos, end)
    return count, pos


@njit(cache=True, nogil=True)
def read_bytes(buf, pos, end, dst, dpos):
    """Copy one length-prefixed byte string into dst; (new pos, new dpos, error)."""
    length, pos = read_varint(buf, pos, end)
    if pos < 0:
        return pos, dpos, _ERR_EOF
    if length < 0:
        return pos, dpos, _ERR_NEGATIVE
    if pos + length > end:
        return -1, dpos, _ERR_EOF
    dst[dpos : dpos + length] = buf[pos : pos + length]
    return pos + length, dpos + length, 0


@njit(cache=True, nogil=True)
def _scan_blocks(buf, pos, sync, starts, ends, counts, fill):
    """Walk the container's data blocks from `pos` (each: record count, byte size, data, sync
    marker); with `fill`, record them. (blocks, error, byte position of the error)."""
    end = buf.shape[0]
    nblocks = 0
    while pos < end:
        at = pos
        count, pos = read_varint(buf, pos, end)
        if pos < 0:
            return nblocks, _ERR_EOF, at
        size, pos = read_varint(buf, pos, end)
        if pos < 0:
            return nblocks, _ERR_EOF, at
        if count < 0 or size < 0:
            return nblocks, _ERR_NEGATIVE, at
        if size > end - pos - 16:
            return nblocks, _ERR_EOF, at
        if fill:
            starts[nblocks] = pos
            ends[nblocks] = pos + size
            counts[nblocks] = count
        pos += size
        for k in range(16):
            if buf[pos + k] != sync[k]:
                return nblocks, _ERR_SYNC, pos
        pos += 16
        nblocks += 1
    return nblocks, 0, 0


@njit(cache=True, nogil=True)
def _frame_blocks(buf, pos, sync):
    """(data starts, data ends, record counts, error, byte position of the error) of the
    container's blocks: counted first, then recorded."""
    none = np.empty(0, np.int64)
    nblocks, err, at = _scan_blocks(buf, pos, sync, none, none, none, False)
    if err:
        return none, none, none, err, at
    starts, ends, counts = np.empty(nblocks, np.int64), np.empty(nblocks, np.int64), np.empty(nblocks, np.int64)
    _scan_blocks(buf, pos, sync, starts, ends, counts, True)
    return starts, ends, counts, 0, 0


@njit(cache=True, nogil=True)
def _skip_bytes(buf, pos, end):
    """(start, length, new pos) of a length-prefixed byte string, or an error in new pos:
    -1 past the end, -2 negative length."""
    length, pos = read_varint(buf, pos, end)
    if pos < 0:
        return 0, 0, -1
    if length < 0:
        return 0, 0, -2
    if pos + length > end:
        return 0, 0, -1
    return pos, length, pos + length


@njit(cache=True, nogil=True)
def _grow(a, need):
    if need <= a.shape[0]:
        return a
    b = np.empty(max(need, 2 * a.shape[0]), a.dtype)
    b[: a.shape[0]] = a
    return b


@njit(cache=True, nogil=True)
def _gather(buf, pos, length, n):
    """Concatenate buf[pos[i] : pos[i] + length[i]] into exact Arrow offsets (int32) and data."""
    offsets = np.empty(n + 1, np.int32)
    total = 0
    for i in range(n):
        offsets[i] = total
        total += length[i]
    offsets[n] = total
    data = np.empty(total, np.uint8)
    for i in range(n):
        data[offsets[i] : offsets[i + 1]] = buf[pos[i] : pos[i] + length[i]]
    return offsets, data


@njit(cache=True, nogil=True)
def _decode_records(buf, starts, ends, counts):
    """Decode every record of the blocks [starts[b], ends[b]) of `buf`. A first pass parses
    and records where each byte string lies; a second copies them into buffers of exactly
    their size, so the Arrow batch holds no slack. Returns (error, failing record, partition,
    offset, timestamp, key offsets/data/valid, value offsets/data/valid, header offsets,
    header key offsets/data, header value offsets/data/valid)."""
    n = 0
    for b in range(counts.shape[0]):
        n += counts[b]
    part = np.empty(n, np.int32)
    off = np.empty(n, np.int64)
    ts = np.empty(n, np.int64)
    k_pos, k_len = np.zeros(n, np.int64), np.zeros(n, np.int64)
    v_pos, v_len = np.zeros(n, np.int64), np.zeros(n, np.int64)
    k_valid, v_valid = np.zeros(n, np.bool_), np.zeros(n, np.bool_)
    h_off = np.empty(n + 1, np.int32)
    cap = 16
    hk_pos, hk_len = np.empty(cap, np.int64), np.empty(cap, np.int64)
    hv_pos, hv_len = np.empty(cap, np.int64), np.zeros(cap, np.int64)
    hv_valid = np.zeros(cap, np.bool_)
    i = 0
    j = 0
    err = 0
    for b in range(starts.shape[0]):
        pos = starts[b]
        end = ends[b]
        for _ in range(counts[b]):
            h_off[i] = j
            x, pos = read_varint(buf, pos, end)
            if pos < 0:
                err = _ERR_EOF
                break
            if x < -(2**31) or x >= 2**31:
                err = _ERR_RANGE  # an int field beyond 32 bits
                break
            part[i] = x
            x, pos = read_varint(buf, pos, end)
            if pos < 0:
                err = _ERR_EOF
                break
            off[i] = x
            x, pos = read_varint(buf, pos, end)
            if pos < 0:
                err = _ERR_EOF
                break
            ts[i] = x
            for field in range(2):
                branch, pos = read_varint(buf, pos, end)
                if pos < 0:
                    err = _ERR_EOF
                    break
                if branch != 0 and branch != 1:
                    err = _ERR_UNION
                    break
                if branch == 1:
                    start, length, pos = _skip_bytes(buf, pos, end)
                    if pos < 0:
                        err = _ERR_EOF if pos == -1 else _ERR_NEGATIVE
                        break
                    if field == 0:
                        k_valid[i], k_pos[i], k_len[i] = True, start, length
                    else:
                        v_valid[i], v_pos[i], v_len[i] = True, start, length
            if err:
                break
            while True:  # array blocks: count, items ..., until a zero count
                count, pos = read_block_count(buf, pos, end)
                if pos < 0:
                    err = _ERR_EOF
                    break
                if count == 0:
                    break
                if count > (end - pos) // 2:  # every item takes at least two bytes
                    err = _ERR_EOF
                    break
                if j + count > hk_pos.shape[0]:
                    need = j + count
                    hk_pos, hk_len, hv_pos = _grow(hk_pos, need), _grow(hk_len, need), _grow(hv_pos, need)
                    hv_len, hv_valid = _grow(hv_len, need), _grow(hv_valid, need)
                for _ in range(count):
                    start, length, pos = _skip_bytes(buf, pos, end)
                    if pos < 0:
                        err = _ERR_EOF if pos == -1 else _ERR_NEGATIVE
                        break
                    hk_pos[j], hk_len[j] = start, length
                    branch, pos = read_varint(buf, pos, end)
                    if pos < 0:
                        err = _ERR_EOF
                        break
                    if branch != 0 and branch != 1:
                        err = _ERR_UNION
                        break
                    hv_valid[j] = branch == 1
                    hv_len[j] = 0
                    if branch == 1:
                        start, length, pos = _skip_bytes(buf, pos, end)
                        if pos < 0:
                            err = _ERR_EOF if pos == -1 else _ERR_NEGATIVE
                            break
                        hv_pos[j], hv_len[j] = start, length
                    j += 1
                if err:
                    break
            if err:
                break
            i += 1
        if err:
            break
        if pos != end:
            err = _ERR_EOF
            break
    h_off[i] = j
    k_off, k_data = _gather(buf, k_pos, k_len, i)
    v_off, v_data = _gather(buf, v_pos, v_len, i)
    hk_off, hk_data = _gather(buf, hk_pos, hk_len, j)
    hv_off, hv_data = _gather(buf, hv_pos, hv_len, j)
    return (
        err,
        i,
        part,
        off,
        ts,
        k_off,
        k_data,
        k_valid,
        v_off,
        v_data,
        v_valid,
        h_off,
        hk_off,
        hk_data,
        hv_off,
        hv_data,
        hv_valid[:j].copy(),
    )


def _normal_type(t):
    """A schema with docs, defaults, namespaces and record names stripped, for comparison."""
    if isinstance(t, list):
        return [_normal_type(x) for x in t]
    if isinstance(t, dict):
        if t.get("type") == "record":
            return ("record", tuple((f["name"], _normal_type(f["type"])) for f in t["fields"]))
        if t.get("type") == "array":
            return ("array", _normal_type(t["items"]))
        return (t["type"], t.get("logicalType"))
    return t


_ENVELOPE_SHAPE = _normal_type(AVRO_SCHEMA)
_MAGIC = b"Obj\x01"


def _read_long(data, pos: int) -> tuple[int, int]:
    z = shift = 0
    while True:
        b = data[pos]  # IndexError past the end
        pos += 1
        z |= (b & 0x7F) << shift
        if b < 0x80:
            return (z >> 1) ^ -(z & 1), pos
        shift += 7
        if shift > 63:
            raise ValueError("varint too long")


def _read_header(data, name: str) -> tuple[dict[str, str], bytes, int]:
    """(metadata, sync marker, position of the first block) of an Avro object container."""
    if bytes(data[:4]) != _MAGIC:
        raise CorruptFile(f"{name}: not an Avro object container file (bad magic bytes)")
    meta: dict[str, str] = {}
    pos = 4
    try:
        while True:  # map<bytes>: blocks of count, (key, value)..., until a zero count
            count, pos = _read_long(data, pos)
            if count == 0:
                break
            if count < 0:
                count = -count
                _, pos = _read_long(data, pos)
            for _ in range(count):
                item = []
                for _ in range(2):
                    length, pos = _read_long(data, pos)
                    if length < 0 or pos + length > len(data):
                        raise ValueError("bad length in the file header")
                    item.append(bytes(data[pos : pos + length]).decode())
                    pos += length
                meta[item[0]] = item[1]
    except (IndexError, ValueError) as exc:  # UnicodeDecodeError is a ValueError
        raise CorruptFile(f"{name}: not a readable Avro file: {exc or 'header ends early'}") from None
    sync = bytes(data[pos : pos + 16])
    if len(sync) != 16:
        raise CorruptFile(f"{name}: not a readable Avro file: header ends early")
    return meta, sync, pos + 16


def _decompress(codec: str, view: memoryview, starts: np.ndarray, ends: np.ndarray, name: str):
    """(buffer, starts, ends) of the decompressed blocks. snappy goes straight into one
    buffer sized from the blocks' own length prefixes; cramjam and zlib release the GIL."""
    sizes = np.empty(len(starts), np.int64)
    try:
        if codec == "snappy":
            import cramjam

            for b, (s, e) in enumerate(zip(starts.tolist(), ends.tolist())):
                if e - s < 4:
                    raise ValueError("snappy block shorter than its checksum")
                sizes[b] = cramjam.snappy.decompress_raw_len(view[s : e - 4])
            out_ends = np.cumsum(sizes)
            out = np.empty(int(out_ends[-1]) if len(sizes) else 0, np.uint8)
            for b, (s, e) in enumerate(zip(starts.tolist(), ends.tolist())):
                a = int(out_ends[b] - sizes[b])
                piece = out[a : int(out_ends[b])]
                if cramjam.snappy.decompress_raw_into(view[s : e - 4], piece) != sizes[b]:
                    raise ValueError("snappy block shorter than it says")
                if zlib.crc32(piece) != int.from_bytes(view[e - 4 : e], "big"):
                    raise ValueError("snappy block checksum mismatch")
        elif codec == "deflate":
            pieces = [zlib.decompress(view[s:e], -15) for s, e in zip(starts.tolist(), ends.tolist())]
            sizes[:] = [len(p) for p in pieces]
            out_ends = np.cumsum(sizes)
            out = np.frombuffer(b"".join(pieces), np.uint8)
        else:
            raise CorruptFile(f"{name}: unsupported Avro codec {codec!r}")
    except CorruptFile:
        raise
    except Exception as exc:  # zlib.error, cramjam's DecompressionError, ValueError
        raise CorruptFile(f"{name}: a {codec} block does not decompress: {exc}") from None
    return out, out_ends - sizes, out_ends


def _arrow_binary(n, offsets, data, valid, typ=pa.binary()):
    nulls = int(n - np.count_nonzero(valid)) if valid is not None else 0
    validity = pa.py_buffer(np.packbits(valid, bitorder="little")) if nulls else None
    return pa.Array.from_buffers(typ, n, [validity, pa.py_buffer(offsets), pa.py_buffer(data)], null_count=nulls)


_ERRORS = {
    _ERR_EOF: "data ends inside a record",
    _ERR_UNION: "bad union branch",
    _ERR_NEGATIVE: "negative length",
    _ERR_RANGE: "partition out of the int range",
}


def decode_avro(data: bytes, *, name: str = "<bytes>") -> tuple[dict[str, str], pa.RecordBatch]:
    """Metadata and records of an envelope Avro file as one Arrow batch, decoded by compiled
    loops; same result as `read_avro_batch` (the fastavro reference), about 10x faster. The
    container framing and the records are parsed with the GIL released; the batch's buffers
    are exactly as large as its data (none of them is a view on `data`)."""
    import json

    view = memoryview(data).cast("B") if not isinstance(data, bytes) else memoryview(data)
    meta, sync, pos = _read_header(view, name)
    try:
        schema = json.loads(meta["avro.schema"])
    except (KeyError, ValueError) as exc:
        raise CorruptFile(f"{name}: not a readable Avro file: no valid schema ({exc})") from None
    if _normal_type(schema) != _ENVELOPE_SHAPE:
        raise CorruptFile(f"{name}: Avro schema is not the keyfill envelope schema")
    buf = np.frombuffer(view, np.uint8)
    starts, ends, counts, err, at = _frame_blocks(buf, pos, np.frombuffer(sync, np.uint8))
    if err:
        what = (
            "sync marker mismatch"
            if err == _ERR_SYNC
            else "bad block header"
            if err == _ERR_NEGATIVE
            else "file ends inside a block"
        )
        raise CorruptFile(f"{name}: not a readable Avro file: {what} at byte {at}")
    codec = meta.get("avro.codec", "null")
    if codec != "null":
        buf, starts, ends = _decompress(codec, view, starts, ends, name)
    if (counts > (ends - starts) // 6).any():  # an envelope record takes at least 6 bytes
        raise CorruptFile(
            f"{name}: block headers claim {int(counts.sum())} records in {int((ends - starts).sum())} bytes"
        )
    (
        err,
        at,
        part,
        off,
        ts,
        k_off,
        k_data,
        k_valid,
        v_off,
        v_data,
        v_valid,
        h_off,
        hk_off,
        hk_data,
        hv_off,
        hv_data,
        hv_valid,
    ) = _decode_records(buf, starts, ends, counts)
    if err:
        where = f"record {at}" + (f" (after offset {off[at - 1]})" if at else "")
        raise CorruptFile(f"{name}: {_ERRORS[err]} at {where}")
    n, items = len(part), len(hv_valid)
    header_keys = _arrow_binary(items, hk_off, hk_data, None, pa.string())
    try:
        header_keys.validate(full=True)  # Avro strings must be UTF-8
    except pa.ArrowInvalid as exc:
        raise CorruptFile(f"{name}: a header key is not UTF-8 ({exc})") from None
    items_arr = pa.StructArray.from_arrays(
        [header_keys, _arrow_binary(items, hv_off, hv_data, hv_valid)], fields=list(HEADER_TYPE)
    )
    batch = pa.RecordBatch.from_arrays(
        [
            pa.array(part),
            pa.array(off),
            pa.array(ts).view(pa.timestamp("ms", tz="UTC")),
            _arrow_binary(n, k_off, k_data, k_valid),
            _arrow_binary(n, v_off, v_data, v_valid),
            pa.ListArray.from_arrays(pa.array(h_off), items_arr),
        ],
        schema=ARROW_SCHEMA,
    )
    return meta, batch


# --- reading (reference path: fastavro) --------------------------------------------------


def read_avro_records(data: bytes, *, name: str = "<bytes>") -> tuple[dict[str, str], list[dict]]:
    """File metadata and all records, decoded by fastavro (the reference decoder)."""
    try:
        r = fastavro.reader(io.BytesIO(data), return_record_name=False)
        meta = {k: v.decode() if isinstance(v, bytes) else v for k, v in r.metadata.items()}
        return meta, list(r)
    except Exception as exc:  # fastavro raises several types on corrupt input
        raise CorruptFile(f"{name}: not a readable Avro file: {exc}") from exc


_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)
_MS = timedelta(milliseconds=1)


def read_avro_batch(data: bytes, *, name: str = "<bytes>") -> tuple[dict[str, str], pa.RecordBatch]:
    meta, recs = read_avro_records(data, name=name)
    for r in recs:
        ts = r["timestamp"]
        if not isinstance(ts, int):  # fastavro gives aware datetimes; exact ms, no float rounding
            r["timestamp"] = (ts - _EPOCH) // _MS
    try:
        return meta, batch_from_records(recs)
    except (pa.ArrowInvalid, pa.ArrowTypeError, KeyError) as exc:
        raise CorruptFile(f"{name}: records do not match the envelope schema: {exc}") from exc


def read_avro_metadata(head: bytes, *, name: str = "<bytes>") -> dict[str, str]:
    """The Avro file metadata from the first bytes of a file.

    Raises `HeaderTruncated` when `head` stops inside the header, so the caller can fetch
    more bytes; `CorruptFile` when it is not an Avro file at all.
    """
    if len(head) >= 4 and head[:4] != b"Obj\x01":
        raise CorruptFile(f"{name}: not an Avro object container file (bad magic bytes)")
    try:
        r = fastavro.reader(io.BytesIO(head))
    except (EOFError, StopIteration, IndexError, ValueError) as exc:
        raise HeaderTruncated(name) from exc
    except Exception as exc:
        raise CorruptFile(f"{name}: unreadable Avro header: {exc}") from exc
    return {k: v.decode() if isinstance(v, bytes) else v for k, v in r.metadata.items()}


def record_bytes(batch: pa.RecordBatch) -> np.ndarray:
    """Payload bytes per record (key + value + header keys and values): the weight that
    key-group packing balances."""
    import pyarrow.compute as pc

    def lengths(arr: pa.Array) -> np.ndarray:
        return pc.binary_length(arr).fill_null(0).to_numpy(zero_copy_only=False).astype(np.int64)

    total = lengths(batch.column("key")) + lengths(batch.column("value"))
    headers = batch.column("headers")
    items = pc.list_flatten(headers)
    if len(items):
        per_item = lengths(items.field("key").cast(pa.binary())) + lengths(items.field("value"))
        parents = pc.list_parent_indices(headers).to_numpy(zero_copy_only=False)
        total += np.bincount(parents, weights=per_item, minlength=batch.num_rows).astype(np.int64)
    return total


# --- record fingerprints --------------------------------------------------------------------


@njit(cache=True, nogil=True)
def _mix(h, x):
    # splitmix64 finaliser over (h ^ x): cheap and well spread; wrap-around is intended
    z = (h ^ x) + np.uint64(0x9E3779B97F4A7C15)
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


@njit(cache=True, nogil=True)
def _mix_bytes(h, data, start, end, valid):
    if not valid:
        return _mix(h, np.uint64(0xA5A5A5A5A5A5A5A5))
    f = np.uint64(0xCBF29CE484222325)  # FNV-1a 64 over the bytes, then mixed with the length
    for i in range(start, end):
        f = (f ^ np.uint64(data[i])) * np.uint64(0x100000001B3)
    return _mix(_mix(h, f), np.uint64(end - start))


@njit(cache=True, nogil=True)
def _fingerprints(
    part, off, ts, k_off, k_data, k_valid, v_off, v_data, v_valid, h_off, hk_off, hk_data, hv_off, hv_data, hv_valid
):
    n = part.shape[0]
    out = np.empty(n, np.uint64)
    for i in range(n):
        h = _mix(np.uint64(0), np.uint64(np.int64(part[i])))
        h = _mix(h, np.uint64(off[i]))
        h = _mix(h, np.uint64(ts[i]))
        h = _mix_bytes(h, k_data, k_off[i], k_off[i + 1], k_valid[i])
        h = _mix_bytes(h, v_data, v_off[i], v_off[i + 1], v_valid[i])
        h = _mix(h, np.uint64(h_off[i + 1] - h_off[i]))
        for j in range(h_off[i], h_off[i + 1]):
            h = _mix_bytes(h, hk_data, hk_off[j], hk_off[j + 1], True)
            h = _mix_bytes(h, hv_data, hv_off[j], hv_off[j + 1], hv_valid[j])
        out[i] = h
    return out


def record_fingerprints(batch: pa.RecordBatch) -> np.ndarray:
    """A 64-bit hash of every field of each record. Summed (mod 2**64) over a partition they
    give an order-independent digest: equal multisets of records, equal sums."""
    batch = conform(batch)
    headers = batch.column("headers")
    if headers.offset:
        headers = pa.concat_arrays([headers])
    key, val = _binary(batch.column("key")), _binary(batch.column("value"))
    items = headers.values
    hkey, hval = _binary(items.field("key")), _binary(items.field("value"))
    return _fingerprints(
        batch.column("partition").to_numpy(zero_copy_only=False).astype(np.int32),
        batch.column("offset").to_numpy(zero_copy_only=False).astype(np.int64),
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

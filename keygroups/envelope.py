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
    out, lo, hi, part, off, ts, k_off, k_data, k_valid, v_off, v_data, v_valid,
    h_off, hk_off, hk_data, hv_off, hv_data, hv_valid,
):  # fmt: skip
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
    raise ValueError(f"unknown Avro codec {codec!r}; choose one of {', '.join(CODECS)}")


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
        raise ValueError(f"unknown Avro codec {codec!r}; choose one of {', '.join(CODECS)}")
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
        part, off, ts, key.offsets, key.valid, val.offsets, val.valid, h_off,
        hkey.offsets, hval.offsets, hval.valid,
    )  # fmt: skip

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
            scratch, lo, hi, part, off, ts, key.offsets, key.data, key.valid,
            val.offsets, val.data, val.valid, h_off, hkey.offsets, hkey.data,
            hval.offsets, hval.data, hval.valid,
        )  # fmt: skip
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
# fixed schema, so a compiled loop over fastavro's raw blocks decodes straight into Arrow
# buffers and releases the GIL, letting reader threads decode in parallel.

# Error codes of the compiled Avro readers (shared with compactor.kafka_connect).
ERR_EOF, ERR_UNION, ERR_NEGATIVE = 1, 2, 3
_ERR_EOF, _ERR_UNION, _ERR_NEGATIVE = ERR_EOF, ERR_UNION, ERR_NEGATIVE


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
def _decode_blocks(buf, block_ends, block_counts, part, off, ts, k_off, k_data, k_valid, v_off, v_data,
                   v_valid, h_off, hk_off, hk_data, hv_off, hv_data, hv_valid):
    """Decode all records; returns (records, header items, error code, failing record)."""
    i = 0
    j = 0
    kp = 0
    vp = 0
    hkp = 0
    hvp = 0
    pos = 0
    for b in range(block_ends.shape[0]):
        end = block_ends[b]
        for _ in range(block_counts[b]):
            k_off[i] = kp
            v_off[i] = vp
            h_off[i] = j
            x, pos = read_varint(buf, pos, end)
            if pos < 0:
                return i, j, _ERR_EOF, i
            part[i] = x
            x, pos = read_varint(buf, pos, end)
            if pos < 0:
                return i, j, _ERR_EOF, i
            off[i] = x
            x, pos = read_varint(buf, pos, end)
            if pos < 0:
                return i, j, _ERR_EOF, i
            ts[i] = x
            for field in range(2):
                branch, pos = read_varint(buf, pos, end)
                if pos < 0:
                    return i, j, _ERR_EOF, i
                if branch != 0 and branch != 1:
                    return i, j, _ERR_UNION, i
                if field == 0:
                    k_valid[i] = branch == 1
                    if branch == 1:
                        pos, kp, err = read_bytes(buf, pos, end, k_data, kp)
                        if err:
                            return i, j, err, i
                else:
                    v_valid[i] = branch == 1
                    if branch == 1:
                        pos, vp, err = read_bytes(buf, pos, end, v_data, vp)
                        if err:
                            return i, j, err, i
            while True:  # array blocks: count, items ..., until a zero count
                count, pos = read_varint(buf, pos, end)
                if pos < 0:
                    return i, j, _ERR_EOF, i
                if count == 0:
                    break
                if count < 0:  # a negative count is followed by the block's byte size
                    count = -count
                    _, pos = read_varint(buf, pos, end)
                    if pos < 0:
                        return i, j, _ERR_EOF, i
                for _ in range(count):
                    if j >= hk_off.shape[0] - 1:
                        return i, j, _ERR_EOF, i
                    hk_off[j] = hkp
                    hv_off[j] = hvp
                    pos, hkp, err = read_bytes(buf, pos, end, hk_data, hkp)
                    if err:
                        return i, j, err, i
                    branch, pos = read_varint(buf, pos, end)
                    if pos < 0:
                        return i, j, _ERR_EOF, i
                    if branch != 0 and branch != 1:
                        return i, j, _ERR_UNION, i
                    hv_valid[j] = branch == 1
                    if branch == 1:
                        pos, hvp, err = read_bytes(buf, pos, end, hv_data, hvp)
                        if err:
                            return i, j, err, i
                    j += 1
            i += 1
        if pos != end:
            return i, j, _ERR_EOF, i
    k_off[i] = kp
    v_off[i] = vp
    h_off[i] = j
    hk_off[j] = hkp
    hv_off[j] = hvp
    return i, j, 0, i


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


def _arrow_binary(n, offsets, data, valid, typ=pa.binary()):
    nulls = int(n - valid.sum()) if valid is not None else 0
    validity = pa.py_buffer(np.packbits(valid, bitorder="little")) if nulls else None
    return pa.Array.from_buffers(typ, n, [validity, pa.py_buffer(offsets), pa.py_buffer(data)], null_count=nulls)


def decode_avro(data: bytes, *, name: str = "<bytes>") -> tuple[dict[str, str], pa.RecordBatch]:
    """Metadata and records of an envelope Avro file as one Arrow batch, decoded by the
    compiled loop; same result as `read_avro_batch` (the fastavro reference), several times
    faster."""
    import json

    try:
        blocks = fastavro.block_reader(io.BytesIO(data))
        meta = {k: v.decode() if isinstance(v, bytes) else v for k, v in blocks.metadata.items()}
        if _normal_type(json.loads(meta["avro.schema"])) != _ENVELOPE_SHAPE:
            raise CorruptFile(f"{name}: Avro schema is not the keyfill envelope schema")
        raw, counts = [], []
        for block in blocks:
            raw.append(block.bytes_.getbuffer())
            counts.append(block.num_records)
    except CorruptFile:
        raise
    except Exception as exc:
        raise CorruptFile(f"{name}: not a readable Avro file: {exc}") from exc
    buf = np.frombuffer(b"".join(raw), dtype=np.uint8) if raw else np.zeros(0, np.uint8)
    ends = np.cumsum([len(r) for r in raw], dtype=np.int64)
    counts_arr = np.asarray(counts, dtype=np.int64)
    n = int(counts_arr.sum())
    size = buf.shape[0]
    if n * 6 > size or (counts_arr < 0).any():  # an envelope record takes at least 6 bytes
        raise CorruptFile(f"{name}: block headers claim {n} records in {size} bytes")
    max_items = size // 2 + 1  # every header item takes at least two bytes
    part = np.empty(n, np.int32)
    off = np.empty(n, np.int64)
    ts = np.empty(n, np.int64)
    k_off, v_off, h_off = (np.empty(n + 1, np.int32) for _ in range(3))
    k_valid, v_valid = np.empty(n, np.bool_), np.empty(n, np.bool_)
    k_data, v_data, hk_data, hv_data = (np.empty(size, np.uint8) for _ in range(4))
    hk_off, hv_off = np.empty(max_items + 1, np.int32), np.empty(max_items + 1, np.int32)
    hv_valid = np.empty(max_items, np.bool_)
    got, items, err, at = _decode_blocks(buf, ends, counts_arr, part, off, ts, k_off, k_data, k_valid, v_off,
                                         v_data, v_valid, h_off, hk_off, hk_data, hv_off, hv_data, hv_valid)
    if err:
        where = f"record {at}" + (f" (after offset {off[at - 1]})" if at else "")
        what = {_ERR_EOF: "data ends inside a record", _ERR_UNION: "bad union branch",
                _ERR_NEGATIVE: "negative length"}[err]
        raise CorruptFile(f"{name}: {what} at {where}")
    header_keys = _arrow_binary(items, hk_off[: items + 1], hk_data[: hk_off[items]], None, pa.string())
    try:
        header_keys.validate(full=True)  # Avro strings must be UTF-8
    except pa.ArrowInvalid as exc:
        raise CorruptFile(f"{name}: a header key is not UTF-8 ({exc})") from None
    items_arr = pa.StructArray.from_arrays(
        [
            header_keys,
            _arrow_binary(items, hv_off[: items + 1], hv_data[: hv_off[items]], hv_valid[:items]),
        ],
        fields=list(HEADER_TYPE),
    )
    batch = pa.RecordBatch.from_arrays(
        [
            pa.array(part),
            pa.array(off),
            pa.array(ts).view(pa.timestamp("ms", tz="UTC")),
            _arrow_binary(n, k_off, k_data[: k_off[n]], k_valid),
            _arrow_binary(n, v_off, v_data[: v_off[n]], v_valid),
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


class CorruptFile(ValueError):
    """An archive file that cannot be read as what it claims to be; names the object."""


class HeaderTruncated(Exception):
    pass


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
def _fingerprints(part, off, ts, k_off, k_data, k_valid, v_off, v_data, v_valid, h_off, hk_off, hk_data,
                  hv_off, hv_data, hv_valid):  # fmt: skip
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
        key.offsets, key.data, key.valid, val.offsets, val.data, val.valid,
        headers.offsets.to_numpy().astype(np.int64), hkey.offsets, hkey.data, hval.offsets, hval.data, hval.valid,
    )  # fmt: skip

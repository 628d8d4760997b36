"""Reading envelope Avro files into Arrow, compiled.

fastavro builds a dict per record, with the GIL held. Envelope files have one fixed schema,
so compiled loops read the records straight into Arrow buffers with the GIL released (only
the small header, decompression and the Arrow wrapping run in Python), letting reader
threads decode in parallel. `tests/avro_reference.py` (fastavro) is the reference this
decoder is proven equal to by property tests.

Over 400 lines because the walk is one concept in three compiled settings (no headers,
headers, the compaction's record bytes) with the checks and the Arrow wrapping they share;
split, the kernels would inline a body from another module and its callers would lose the
one place that says what each setting skips.
"""

from __future__ import annotations

import functools
import json
from typing import Any

import numpy as np
import pyarrow as pa

from keygroups._numba import Int, njit
from keygroups.envelope.buffers import EnvelopeBuffers, Scratch, arrow_binary, copy_bytes
from keygroups.envelope.encoder import encoded_batch
from keygroups.envelope.framing import (
    ERR_EOF,
    ERR_NEGATIVE,
    ERR_RANGE,
    ERR_UNION,
    RECORD_ERRORS,
    read_block_count,
    read_blocks,
    read_varint,
    skip_bytes,
    text_metadata,
)
from keygroups.envelope.schema import ARROW_SCHEMA, ENCODED_SCHEMA, ENVELOPE_SHAPE, HEADER_TYPE, normal_type
from keygroups.envelope.snappy import _copy8
from keygroups.errors import CorruptFile


@njit(cache=True, nogil=True)
def _put(dst: np.ndarray, at: Int, src: np.ndarray, pos: Int, length: Int) -> Int:
    """dst[at : at + length] = src[pos : pos + length]; 8-byte words where both arrays have
    room past the item (a libc memcpy call per item of ~20 bytes cost more than the copy)."""
    if pos + length + 8 <= src.shape[0] and at + length + 8 <= dst.shape[0]:
        j = 0
        while j < length:
            _copy8(dst, at + j, src, pos + j)  # type: ignore[call-arg]  # numba stub: see snappy._copy8
            j += 8
    else:
        copy_bytes(dst, at, src, pos, length)  # type: ignore[call-arg]  # numba stub: see buffers.copy_bytes
    return at + length


@njit(cache=True, nogil=True, inline="always")
def _padded(buf: np.ndarray, start: Int, end: Int) -> bool:
    """Whether the varint buf[start:end] is longer than its value needs: more than one byte,
    the last a group of zeros (a minimal varint's last group holds its highest set bit)."""
    return bool((end - start > 1) & (buf[end - 1] == 0))  # no branch: `and` made the walk slower


@njit(cache=True, nogil=True, inline="always")
def _or_bytes(buf: np.ndarray, start: Int, length: Int) -> Int:
    """The bytes buf[start : start + length] OR-ed together: below 128 when all are ASCII."""
    x: Int = 0
    for q in range(start, start + length):
        x |= buf[q]
    return x


# The walk is one body inlined into a kernel per setting of (headers, spans): with the flags
# constants, numba drops the work they switch off (the canonical sizes, the weights, the
# header items) from the loop instead of testing them per record. A kernel taking the flags
# as arguments walked the Spark source's records (no headers, no spans) at twice the time.
@njit(cache=True, nogil=True, inline="always")
def _walk_records(
    buf: np.ndarray,
    starts: np.ndarray,
    ends: np.ndarray,
    counts: np.ndarray,
    headers: bool,
    k_data: np.ndarray,
    v_data: np.ndarray,
    hk_data: np.ndarray,
    hv_data: np.ndarray,
    spans: bool,
    r_data: np.ndarray,
) -> tuple[Any, ...]:
    """Decode every record of the blocks [starts[b], ends[b]) of `buf` in one pass: each byte
    string is copied as it is read into the caller's k/v/hk/hv_data, each as large as the
    blocks (no column can hold more); the caller cuts them to the bytes written (a batch
    holds no slack: the read budget counts `nbytes`). One pass instead of two (positions,
    then a copy per item) took a third off the decode.
    `headers` False: header items are read past, not kept (their arrays come back empty).
    Header items are held in arrays sized for as many as the blocks could hold (two bytes
    each at least), never zero-filled or grown: arrays rebound inside the loop cost the walk
    with headers a third of its time (docs/performance.md#header-items-in-arrays-of-their-largest-size).
    `spans` True (without `headers`): values and header items are read past, not kept; header
    keys are OR-ed together, whose result says whether every key is ASCII (else the caller
    has them checked as UTF-8); each record's own bytes are kept instead, the blocks
    copied whole into `r_data` (a copy a block, not an item), with each record's weight and
    whether every record is encoded as `encode_records` encodes it: only then are those
    bytes what the compaction writes (else the caller encodes). A record is when every
    varint in it is minimal (a union branch, 0 or 1, is one byte), its headers are one block and no
    block count is negative: every other encoding of the same values has a varint with a
    zero last group, a negative count with its size, or more blocks (two blocks can be as
    long as one: 64 items take 2 bytes of count, as do two counts of 32). Checked by each
    varint's last byte, not by summing the canonical sizes: that took a third of the walk.
    Returns (error, failing record, partition, offset, timestamp, key offsets, key bytes
    written, key valid, value offsets, value bytes written, value valid, header offsets,
    header key offsets, header key bytes written, header value offsets, header value bytes
    written, header value valid, record offsets, weights, all canonical, all header keys ASCII)."""
    n = 0
    for b in range(counts.shape[0]):
        n += counts[b]
    part = np.empty(n, np.int32)
    off = np.empty(n, np.int64)
    ts = np.empty(n, np.int64)
    k_off, v_off = np.empty(n + 1, np.int32), np.empty(n + 1, np.int32)
    k_valid, v_valid = np.zeros(n, np.bool_), np.zeros(n, np.bool_)
    h_off = np.empty(n + 1, np.int32)
    cap = 0
    if headers:
        for b in range(starts.shape[0]):
            cap += (ends[b] - starts[b]) // 2
    hk_off, hv_off = np.empty(cap + 1, np.int32), np.empty(cap + 1, np.int32)
    hv_valid = np.empty(cap, np.bool_)  # every item sets its own: no memset of the whole
    # bytes written to each data buffer
    kz: Int = 0
    vz: Int = 0
    hkz: Int = 0
    hvz: Int = 0
    m = n if spans else 0
    r_off = np.empty(m + 1, np.int64)
    weight = np.zeros(m, np.int64)
    rz: Int = 0
    padded = False  # a record encoded otherwise than `encode_records` would (spans only)
    high: Int = 0  # the header keys' bytes OR-ed together (spans only)
    i = 0
    j = 0
    err = 0
    for b in range(starts.shape[0]):
        pos = starts[b]
        end = ends[b]
        for _ in range(counts[b]):
            begin = pos
            w: Int = 0
            blocks = 0
            h_off[i] = j
            k_off[i] = kz
            v_off[i] = vz
            x, pos = read_varint(buf, pos, end)
            if pos < 0:
                err = ERR_EOF
                break
            if x < -(2**31) or x >= 2**31:
                err = ERR_RANGE  # an int field beyond 32 bits
                break
            part[i] = x
            if spans:
                padded |= _padded(buf, begin, pos)
            at = pos
            x, pos = read_varint(buf, pos, end)
            if pos < 0:
                err = ERR_EOF
                break
            off[i] = x
            if spans:
                padded |= _padded(buf, at, pos)
            at = pos
            x, pos = read_varint(buf, pos, end)
            if pos < 0:
                err = ERR_EOF
                break
            ts[i] = x
            if spans:
                padded |= _padded(buf, at, pos)
            for field in range(2):
                at = pos
                branch, pos = read_varint(buf, pos, end)
                if pos < 0:
                    err = ERR_EOF
                    break
                if branch != 0 and branch != 1:
                    err = ERR_UNION
                    break
                if spans:
                    padded |= _padded(buf, at, pos)
                if branch == 1:
                    at = pos
                    start, length, pos = skip_bytes(buf, pos, end)
                    if pos < 0:
                        err = ERR_EOF if pos == -1 else ERR_NEGATIVE
                        break
                    w += length
                    if spans:
                        padded |= _padded(buf, at, start)
                    if field == 0:
                        k_valid[i] = True
                        kz = _put(k_data, kz, buf, start, length)
                    else:
                        v_valid[i] = True
                        if not spans:
                            vz = _put(v_data, vz, buf, start, length)
            if err:
                break
            while True:  # array blocks: count, items ..., until a zero count
                at = pos
                count, pos = read_block_count(buf, pos, end)
                if pos < 0:
                    err = ERR_EOF
                    break
                if spans:  # a negative count (zigzag: the first byte's low bit) has a size after it
                    padded |= ((buf[at] & 1) == 1) | _padded(buf, at, pos)
                if count == 0:
                    break
                blocks += 1
                if count > (end - pos) // 2:  # every item takes at least two bytes
                    err = ERR_EOF
                    break
                for _ in range(count):
                    at = pos
                    start, length, pos = skip_bytes(buf, pos, end)
                    if pos < 0:
                        err = ERR_EOF if pos == -1 else ERR_NEGATIVE
                        break
                    w += length
                    if spans:
                        padded |= _padded(buf, at, start)
                        high |= _or_bytes(buf, start, length)
                    if headers:
                        hk_off[j] = hkz
                        hv_off[j] = hvz
                        hkz = _put(hk_data, hkz, buf, start, length)
                    at = pos
                    branch, pos = read_varint(buf, pos, end)
                    if pos < 0:
                        err = ERR_EOF
                        break
                    if branch != 0 and branch != 1:
                        err = ERR_UNION
                        break
                    if spans:
                        padded |= _padded(buf, at, pos)
                    if branch == 1:
                        at = pos
                        start, length, pos = skip_bytes(buf, pos, end)
                        if pos < 0:
                            err = ERR_EOF if pos == -1 else ERR_NEGATIVE
                            break
                        w += length
                        if spans:
                            padded |= _padded(buf, at, start)
                        if headers:
                            hv_valid[j] = True
                            hvz = _put(hv_data, hvz, buf, start, length)
                    elif headers:
                        hv_valid[j] = False
                    if headers:
                        j += 1
                if err:
                    break
            if err:
                break
            if spans:
                weight[i] = w
                r_off[i] = rz + (begin - starts[b])
                padded |= blocks > 1
            i += 1
        if err:
            break
        if pos != end:
            err = ERR_EOF
            break
        if spans:
            rz = _put(r_data, rz, buf, starts[b], end - starts[b])
    if spans:
        r_off[i] = rz
    h_off[i] = j
    k_off[i] = kz
    v_off[i] = vz
    hk_off[j] = hkz
    hv_off[j] = hvz
    return (
        err,
        i,
        part,
        off,
        ts,
        k_off,
        kz,
        k_valid,
        v_off,
        vz,
        v_valid,
        h_off,
        hk_off[: j + 1].copy(),  # not the arrays sized for the most items the blocks could hold
        hkz,
        hv_off[: j + 1].copy(),
        hvz,
        hv_valid[:j].copy(),
        r_off[: i + 1] if spans else r_off,
        weight[:i] if spans else weight,
        not padded,
        high < 128,
    )


# Each kernel takes the blocks as (buf, starts, ends, counts), the Blocks' arrays.
Framed = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]


@njit(cache=True, nogil=True)
def _records_plain(f: Framed, k_data: np.ndarray, v_data: np.ndarray) -> tuple[Any, ...]:
    """`_walk_records` without headers or spans: what readers that drop headers call."""
    none = np.empty(0, np.uint8)
    return _walk_records(f[0], f[1], f[2], f[3], False, k_data, v_data, none, none, False, none)


@njit(cache=True, nogil=True)
def _records_headers(f: Framed, k: np.ndarray, v: np.ndarray, hk: np.ndarray, hv: np.ndarray) -> tuple[Any, ...]:
    """`_walk_records` with headers, without spans: every field decoded."""
    return _walk_records(f[0], f[1], f[2], f[3], True, k, v, hk, hv, False, np.empty(0, np.uint8))


@njit(cache=True, nogil=True)
def _records_encoded(f: Framed, k_data: np.ndarray, r_data: np.ndarray) -> tuple[Any, ...]:
    """`_walk_records` with spans, without headers: the compaction's."""
    none = np.empty(0, np.uint8)
    return _walk_records(f[0], f[1], f[2], f[3], False, k_data, none, none, none, True, r_data)


_NONE = np.empty(0, np.uint8)
_SCRATCH = Scratch()


def _shrunk(a: np.ndarray, size: int) -> np.ndarray:
    """`a` cut to its first `size` bytes in place: realloc gives the rest back (glibc moves
    no bytes to shrink: mremap for a mapped buffer, a split for one in an arena)."""
    if a.shape[0] != size:
        a.resize(size, refcheck=False)  # refcheck: only this function and the caller hold `a`
    return a


NO_HEADERS_SCHEMA = ARROW_SCHEMA.remove(ARROW_SCHEMA.get_field_index("headers"))


@functools.lru_cache(maxsize=256)
def _is_envelope(schema: bytes | None) -> bool:
    """Whether an Avro schema (JSON text) is the envelope's shape; once per distinct schema
    (parsing and normalising it per decoded step cost more than decoding a short one)."""
    try:
        return schema is not None and normal_type(json.loads(schema)) == ENVELOPE_SHAPE
    except (ValueError, KeyError, TypeError):  # not JSON, or JSON that is no Avro schema
        return False


def _decode(
    data: bytes, name: str, verified: bool, header: bytes | None, headers: bool, spans: bool
) -> tuple[dict[str, str], EnvelopeBuffers, tuple[np.ndarray, np.ndarray, np.ndarray, bool, bool]]:
    """The file's metadata, its records' buffers and, with `spans`, (record offsets, record
    bytes, weights, all canonical, all header keys ASCII): `_walk_records` on the file's
    blocks, its errors raised."""
    blocks = read_blocks(data, name, verified=verified, header=header, scratch=_SCRATCH)
    meta = text_metadata(blocks.meta, name)
    if not _is_envelope(blocks.meta.get("avro.schema")):
        blocks.schema(name)  # names a missing or unreadable schema
        raise CorruptFile(f"{name}: Avro schema is not the keyfill envelope schema")
    buf, starts, ends, counts = blocks.buf, blocks.starts, blocks.ends, blocks.counts
    if (counts > (ends - starts) // 6).any():  # an envelope record takes at least 6 bytes
        raise CorruptFile(
            f"{name}: block headers claim {int(counts.sum())} records in {int((ends - starts).sum())} bytes"
        )
    room = buf.shape[0] + 8
    # Items are copied into buffers as large as the input could fill, then shrunk in place
    # (realloc): no second copy (docs/performance.md#large-buffers-mapped).
    k_data = np.empty(room, np.uint8)
    v_data = _NONE if spans else np.empty(room, np.uint8)
    hk_data = np.empty(room, np.uint8) if headers else _NONE
    hv_data = np.empty(room, np.uint8) if headers else _NONE
    r_data = np.empty(int((ends - starts).sum()) + 8, np.uint8) if spans else _NONE
    framed = (buf, starts, ends, counts)
    if spans:  # the kernel compiled for these flags (`_walk_records`)
        walked = _records_encoded(framed, k_data, r_data)
    elif headers:
        walked = _records_headers(framed, k_data, v_data, hk_data, hv_data)
    else:
        walked = _records_plain(framed, k_data, v_data)
    err, at, part, off, ts, k_off, kz, k_valid, v_off, vz, v_valid, h_off, hk_off, hkz, hv_off, hvz, hv_valid, *rest = (
        walked
    )
    c = EnvelopeBuffers(
        part, off, ts, k_off, _shrunk(k_data, kz), k_valid, v_off, _shrunk(v_data, vz), v_valid,
        h_off, hk_off, _shrunk(hk_data, hkz), hv_off, _shrunk(hv_data, hvz), hv_valid,
    )  # fmt: skip
    if err:
        where = f"record {at}" + (f" (after offset {c.off[at - 1]})" if at else "")
        raise CorruptFile(f"{name}: {RECORD_ERRORS[err]} at {where}")
    r_off, weight, canonical, ascii_keys = rest
    return meta, c, (r_off, _shrunk(r_data, int(r_off[-1])) if spans else r_data, weight, canonical, ascii_keys)


def _header_keys(c: EnvelopeBuffers, name: str) -> pa.Array:
    """The header keys as Arrow strings, refused unless UTF-8 (as Avro strings must be)."""
    keys = arrow_binary(len(c.hv_valid), c.hk_off, c.hk_data, None, pa.string())
    try:
        keys.validate(full=True)
    except pa.ArrowInvalid as exc:
        raise CorruptFile(f"{name}: a header key is not UTF-8 ({exc})") from None
    return keys


def decode_encoded(data: bytes, *, name: str = "<bytes>") -> pa.RecordBatch:
    """An envelope Avro file's records as the compaction moves them (`ENCODED_SCHEMA`): the
    fields it sorts and groups by, each record's weight and its Avro encoding, checked as
    `decode_avro` checks them. The encodings are the file's own bytes where they are what
    `encode_records` writes (keyfill's and any canonical writer's: a copy a block, values
    never gathered); otherwise the records are decoded whole and encoded again. Header keys
    beyond ASCII are checked as UTF-8 by that whole decode."""
    _, c, (r_off, r_data, weight, canonical, ascii_keys) = _decode(data, name, False, None, False, spans=True)
    if not canonical:
        return encoded_batch(decode_avro(data, name=name)[1])
    if not ascii_keys:
        decode_avro(data, name=name)  # refuses a key that is not UTF-8, naming the file
    n = len(c.part)
    record = pa.Array.from_buffers(pa.large_binary(), n, [None, pa.py_buffer(r_off), pa.py_buffer(r_data)])
    columns = [
        pa.array(c.part),
        pa.array(c.off),
        pa.array(c.ts).view(pa.timestamp("ms", tz="UTC")),
        arrow_binary(n, c.k_off, c.k_data, c.k_valid),
        pa.array(weight),
        record,
    ]
    return pa.RecordBatch.from_arrays(columns, schema=ENCODED_SCHEMA)


def decode_avro(
    data: bytes, *, name: str = "<bytes>", verified: bool = False, header: bytes | None = None, headers: bool = True
) -> tuple[dict[str, str], pa.RecordBatch]:
    """Metadata and records of an envelope Avro file as one Arrow batch, decoded by compiled
    loops; same result as fastavro (tests/avro_reference.py), much faster
    (docs/performance.md#avro-decoded-and-encoded-by-compiled-loops). The
    container framing and the records are parsed with the GIL released; the batch's buffers
    are exactly as large as its data (none of them is a view on `data`). `verified`: the
    caller checked `data`'s blocks against its own checksum (`framing.decompress`).
    `header`: the file's header when `data` is only whole blocks of it (`framing.read_blocks`).
    `headers` False: the batch has no `headers` column (ARROW_SCHEMA without it); a reader
    that drops them saves their copies and checks (a quarter of the decode)."""
    meta, c, _ = _decode(data, name, verified, header, headers, spans=False)
    n = len(c.part)
    columns = [
        pa.array(c.part),
        pa.array(c.off),
        pa.array(c.ts).view(pa.timestamp("ms", tz="UTC")),
        arrow_binary(n, c.k_off, c.k_data, c.k_valid),
        arrow_binary(n, c.v_off, c.v_data, c.v_valid),
    ]
    if not headers:
        return meta, pa.RecordBatch.from_arrays(columns, schema=NO_HEADERS_SCHEMA)
    items = len(c.hv_valid)
    header_keys = _header_keys(c, name)
    items_arr = pa.StructArray.from_arrays(
        [header_keys, arrow_binary(items, c.hv_off, c.hv_data, c.hv_valid)], fields=list(HEADER_TYPE)
    )
    columns.append(pa.ListArray.from_arrays(pa.array(c.h_off[: n + 1]), items_arr))
    return meta, pa.RecordBatch.from_arrays(columns, schema=ARROW_SCHEMA)

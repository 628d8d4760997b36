"""Reading envelope Avro files into Arrow, compiled.

fastavro builds a dict per record (about 230K records/s, GIL held). Envelope files have one
fixed schema, so compiled loops read the records straight into Arrow buffers with the GIL
released (only the small header, decompression and the Arrow wrapping run in Python),
letting reader threads decode in parallel. `tests/avro_reference.py` (fastavro) is the
reference this decoder is proven equal to by property tests.
"""

from __future__ import annotations

import functools
import json

import numpy as np
import pyarrow as pa

from keygroups._numba import njit
from keygroups.envelope.buffers import EnvelopeBuffers, arrow_binary, copy_bytes
from keygroups.envelope.framing import (
    ERR_EOF,
    ERR_NEGATIVE,
    ERR_RANGE,
    ERR_UNION,
    RECORD_ERRORS,
    grow,
    read_block_count,
    read_blocks,
    read_varint,
    skip_bytes,
    text_metadata,
)
from keygroups.envelope.schema import ARROW_SCHEMA, ENVELOPE_SHAPE, HEADER_TYPE, normal_type
from keygroups.errors import CorruptFile


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
        copy_bytes(data, offsets[i], buf, pos[i], length[i])
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
                err = ERR_EOF
                break
            if x < -(2**31) or x >= 2**31:
                err = ERR_RANGE  # an int field beyond 32 bits
                break
            part[i] = x
            x, pos = read_varint(buf, pos, end)
            if pos < 0:
                err = ERR_EOF
                break
            off[i] = x
            x, pos = read_varint(buf, pos, end)
            if pos < 0:
                err = ERR_EOF
                break
            ts[i] = x
            for field in range(2):
                branch, pos = read_varint(buf, pos, end)
                if pos < 0:
                    err = ERR_EOF
                    break
                if branch != 0 and branch != 1:
                    err = ERR_UNION
                    break
                if branch == 1:
                    start, length, pos = skip_bytes(buf, pos, end)
                    if pos < 0:
                        err = ERR_EOF if pos == -1 else ERR_NEGATIVE
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
                    err = ERR_EOF
                    break
                if count == 0:
                    break
                if count > (end - pos) // 2:  # every item takes at least two bytes
                    err = ERR_EOF
                    break
                if j + count > hk_pos.shape[0]:
                    need = j + count
                    hk_pos, hk_len, hv_pos = grow(hk_pos, need), grow(hk_len, need), grow(hv_pos, need)
                    hv_len, hv_valid = grow(hv_len, need), grow(hv_valid, need)
                for _ in range(count):
                    start, length, pos = skip_bytes(buf, pos, end)
                    if pos < 0:
                        err = ERR_EOF if pos == -1 else ERR_NEGATIVE
                        break
                    hk_pos[j], hk_len[j] = start, length
                    branch, pos = read_varint(buf, pos, end)
                    if pos < 0:
                        err = ERR_EOF
                        break
                    if branch != 0 and branch != 1:
                        err = ERR_UNION
                        break
                    hv_valid[j] = branch == 1
                    hv_len[j] = 0
                    if branch == 1:
                        start, length, pos = skip_bytes(buf, pos, end)
                        if pos < 0:
                            err = ERR_EOF if pos == -1 else ERR_NEGATIVE
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
            err = ERR_EOF
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


@functools.lru_cache(maxsize=256)
def _is_envelope(schema: bytes | None) -> bool:
    """Whether an Avro schema (JSON text) is the envelope's shape; once per distinct schema
    (parsing and normalising it per decoded step cost more than decoding a short one)."""
    try:
        return schema is not None and normal_type(json.loads(schema)) == ENVELOPE_SHAPE
    except (ValueError, KeyError, TypeError):  # not JSON, or JSON that is no Avro schema
        return False


def decode_avro(
    data: bytes, *, name: str = "<bytes>", verified: bool = False, header: bytes | None = None
) -> tuple[dict[str, str], pa.RecordBatch]:
    """Metadata and records of an envelope Avro file as one Arrow batch, decoded by compiled
    loops; same result as fastavro (tests/avro_reference.py), about 10x faster. The
    container framing and the records are parsed with the GIL released; the batch's buffers
    are exactly as large as its data (none of them is a view on `data`). `verified`: the
    caller checked `data`'s blocks against its own checksum (`framing.decompress`).
    `header`: the file's header when `data` is only whole blocks of it (`framing.read_blocks`)."""
    blocks = read_blocks(data, name, verified=verified, header=header)
    meta = text_metadata(blocks.meta, name)
    if not _is_envelope(blocks.meta.get("avro.schema")):
        blocks.schema(name)  # names a missing or unreadable schema
        raise CorruptFile(f"{name}: Avro schema is not the keyfill envelope schema")
    buf, starts, ends, counts = blocks.buf, blocks.starts, blocks.ends, blocks.counts
    if (counts > (ends - starts) // 6).any():  # an envelope record takes at least 6 bytes
        raise CorruptFile(
            f"{name}: block headers claim {int(counts.sum())} records in {int((ends - starts).sum())} bytes"
        )
    err, at, *arrays = _decode_records(buf, starts, ends, counts)
    c = EnvelopeBuffers(*arrays)
    if err:
        where = f"record {at}" + (f" (after offset {c.off[at - 1]})" if at else "")
        raise CorruptFile(f"{name}: {RECORD_ERRORS[err]} at {where}")
    n, items = len(c.part), len(c.hv_valid)
    header_keys = arrow_binary(items, c.hk_off, c.hk_data, None, pa.string())
    try:
        header_keys.validate(full=True)  # Avro strings must be UTF-8
    except pa.ArrowInvalid as exc:
        raise CorruptFile(f"{name}: a header key is not UTF-8 ({exc})") from None
    items_arr = pa.StructArray.from_arrays(
        [header_keys, arrow_binary(items, c.hv_off, c.hv_data, c.hv_valid)], fields=list(HEADER_TYPE)
    )
    batch = pa.RecordBatch.from_arrays(
        [
            pa.array(c.part),
            pa.array(c.off),
            pa.array(c.ts).view(pa.timestamp("ms", tz="UTC")),
            arrow_binary(n, c.k_off, c.k_data, c.k_valid),
            arrow_binary(n, c.v_off, c.v_data, c.v_valid),
            pa.ListArray.from_arrays(pa.array(c.h_off), items_arr),
        ],
        schema=ARROW_SCHEMA,
    )
    return meta, batch

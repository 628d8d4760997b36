"""Compiled decoders for the Kafka Connect sink's keys and headers files of the common
fixed shapes, straight into Arrow buffers (GIL released); other shapes take the generic
path in `kafka_connect.avro`."""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa

from compactor.sources.kafka_connect.avro import is_record
from keygroups import envelope
from keygroups._numba import Int, njit
from keygroups.envelope import HEADER_TYPE, CorruptFile, framing
from keygroups.envelope.buffers import arrow_binary

# --- keys and headers files: fixed shapes, compiled decoding ----------------------------
# The connector writes keys as (nullable) strings or bytes and headers as an array of
# {key: string, value: string} records. fastavro would build a Python object per key and a
# list of dicts per record (headers decode at about the speed of the values); these loops
# decode fastavro's raw blocks straight into Arrow buffers. Other shapes take fastavro.

_EOF, _BAD_UNION, _NEGATIVE, _EXTRA = envelope.ERR_EOF, envelope.ERR_UNION, envelope.ERR_NEGATIVE, 4
_ERRORS = {
    _EOF: "data ends inside a record",
    _BAD_UNION: "bad union branch",
    _NEGATIVE: "negative length",
    _EXTRA: "a block holds more bytes than its records",
}


# Avro's zigzag varints and length-prefixed bytes, as the envelope decoder reads them.
_varint = envelope.read_varint
_copy_bytes = envelope.read_bytes


@njit(cache=True, nogil=True)
def _branch(buf: np.ndarray, pos: Int, end: Int, null_branch: int) -> tuple[bool, Int, int]:
    """(is null, new pos, error) of an optional value; null_branch -1: not a union."""
    if null_branch < 0:
        return False, pos, 0
    b, pos = _varint(buf, pos, end)
    if pos < 0:
        return False, pos, _EOF
    if b != 0 and b != 1:
        return False, pos, _BAD_UNION
    return b == null_branch, pos, 0


@njit(cache=True, nogil=True)
def _decode_keys(
    buf: np.ndarray,
    ends: np.ndarray,
    counts: np.ndarray,
    null_branch: int,
    off: np.ndarray,
    data: np.ndarray,
    valid: np.ndarray,
) -> tuple[int, int]:
    """Records of a keys file; returns (records decoded, error)."""
    i = 0
    dp: Int = 0
    pos: Int = 0
    for b in range(ends.shape[0]):
        end = ends[b]
        for _ in range(counts[b]):
            off[i] = dp
            is_null, pos, err = _branch(buf, pos, end, null_branch)
            if err:
                return i, err
            valid[i] = not is_null
            if not is_null:
                pos, dp, err = _copy_bytes(buf, pos, end, data, dp)
                if err:
                    return i, err
            i += 1
        if pos != end:
            return i, _EXTRA
    off[i] = dp
    return i, 0


@njit(cache=True, nogil=True)
def _decode_headers(
    buf: np.ndarray,
    ends: np.ndarray,
    counts: np.ndarray,
    null_branch: int,
    h_off: np.ndarray,
    k_off: np.ndarray,
    k_data: np.ndarray,
    v_off: np.ndarray,
    v_data: np.ndarray,
    v_valid: np.ndarray,
) -> tuple[int, int, int]:
    """Records of a headers file; returns (records decoded, items decoded, error)."""
    i = 0
    j = 0
    kp: Int = 0
    vp: Int = 0
    pos: Int = 0
    for b in range(ends.shape[0]):
        end = ends[b]
        for _ in range(counts[b]):
            h_off[i] = j
            while True:  # array blocks: count, items, ... until a zero count
                count, pos = envelope.read_block_count(buf, pos, end)
                if pos < 0:
                    return i, j, _EOF
                if count == 0:
                    break
                for _ in range(count):
                    if j >= k_off.shape[0] - 1:
                        return i, j, _EOF
                    k_off[j] = kp
                    v_off[j] = vp
                    pos, kp, err = _copy_bytes(buf, pos, end, k_data, kp)
                    if err:
                        return i, j, err
                    is_null, pos, err = _branch(buf, pos, end, null_branch)
                    if err:
                        return i, j, err
                    v_valid[j] = not is_null
                    if not is_null:
                        pos, vp, err = _copy_bytes(buf, pos, end, v_data, vp)
                        if err:
                            return i, j, err
                    j += 1
            i += 1
        if pos != end:
            return i, j, _EXTRA
    h_off[i] = j
    k_off[j] = kp
    v_off[j] = vp
    return i, j, 0


def text_like(t: Any) -> bool:
    return t in ("string", "bytes") or (
        isinstance(t, dict) and t.get("type") in ("string", "bytes") and t.get("logicalType") in (None, "uuid")
    )


def key_null_branch(schema: Any) -> int | None:
    """-1 for a string/bytes schema, the null's index for a [null, string/bytes] union, None
    for anything else."""
    if text_like(schema):
        return -1
    if isinstance(schema, list) and len(schema) == 2:
        nulls = [i for i, t in enumerate(schema) if t == "null" or t == {"type": "null"}]
        if len(nulls) == 1 and text_like(schema[1 - nulls[0]]):
            return nulls[0]
    return None


def header_null_branch(schema: Any) -> int | None:
    """The value's null branch for the connector's headers shape (array of {key: string,
    value: string/bytes, maybe nullable}), None for any other shape."""
    if not (isinstance(schema, dict) and schema.get("type") == "array" and is_record(schema.get("items"))):
        return None
    fields = schema["items"].get("fields", [])
    if [f["name"] for f in fields] != ["key", "value"] or key_null_branch(fields[0]["type"]) != -1:
        return None
    return key_null_branch(fields[1]["type"])


def _raw_blocks(data: bytes, name: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(decompressed block bytes back to back, block ends, block record counts)."""
    blocks = framing.read_blocks(data, name).contiguous()
    buf, counts = blocks.buf, blocks.counts
    if buf.size >= 2**31 or (counts < 0).any() or counts.sum() > buf.size:
        raise CorruptFile(f"{name}: block headers claim {int(counts.sum())} records in {buf.size} bytes")
    return buf, blocks.ends, counts


def _fail(name: str, first: int, at: int, err: int) -> CorruptFile:
    return CorruptFile(f"{name}: {_ERRORS[err]} at record {at} (offset {first + at})")


def fast_keys(data: bytes, name: str, first: int, null_branch: int) -> pa.Array:
    buf, ends, counts = _raw_blocks(data, name)
    n = int(counts.sum())
    off = np.empty(n + 1, np.int32)
    out = np.empty(buf.size, np.uint8)
    valid = np.empty(n, np.bool_)
    got, err = _decode_keys(buf, ends, counts, null_branch, off, out, valid)
    if err:
        raise _fail(name, first, got, err)
    return arrow_binary(n, off, out[: off[n]], valid)


def fast_headers(data: bytes, name: str, first: int, null_branch: int) -> pa.Array:
    buf, ends, counts = _raw_blocks(data, name)
    n = int(counts.sum())
    items = buf.size // 2 + 1  # every item takes at least two bytes
    h_off = np.empty(n + 1, np.int32)
    k_off, v_off = np.empty(items + 1, np.int32), np.empty(items + 1, np.int32)
    k_data, v_data = np.empty(buf.size, np.uint8), np.empty(buf.size, np.uint8)
    v_valid = np.empty(items, np.bool_)
    got, m, err = _decode_headers(buf, ends, counts, null_branch, h_off, k_off, k_data, v_off, v_data, v_valid)
    if err:
        raise _fail(name, first, got, err)
    keys = arrow_binary(m, k_off, k_data[: k_off[m]], None, pa.string())
    try:
        keys.validate(full=True)  # Avro strings are UTF-8
    except pa.ArrowInvalid as exc:
        raise CorruptFile(f"{name}: a header key is not UTF-8 ({exc})") from None
    values = arrow_binary(m, v_off, v_data[: v_off[m]], v_valid)
    items_arr = pa.StructArray.from_arrays([keys, values], fields=list(HEADER_TYPE))
    return pa.ListArray.from_arrays(pa.array(h_off), items_arr)

"""Kafka record batches (message format v2, magic 2: Kafka 0.11 and later) as envelope records.

A log segment is a sequence of batches, each:

    base offset int64 | batch length int32 (bytes after this field) | leader epoch int32 |
    magic int8 (2) | CRC-32C uint32 (of everything after it) | attributes int16 |
    last offset delta int32 | base timestamp int64 | max timestamp int64 | producer id int64 |
    producer epoch int16 | base sequence int32 | record count int32 | records

attributes: bits 0-2 the codec of the records part (0 none, 1 gzip, 2 snappy in xerial
framing, 3 lz4 frame, 4 zstd), bit 3 the timestamp type (1: log-append time, every record
takes the max timestamp), bit 4 transactional, bit 5 control batch (commit/abort markers,
never data). A record:

    length varint | attributes int8 | timestamp delta varlong | offset delta varint |
    key length varint (-1: null) | key | value length varint (-1: null) | value |
    header count varint | per header: key length varint, key (UTF-8), value length varint, value

(varints are zigzag-encoded, as in protobuf's sint types.)

Batch headers are read in Python (a few per megabyte); the records of all the segment's
batches are parsed in one compiled pass (`_parse`), then keys, values and headers are
gathered into Arrow buffers by another (`keygroups.envelope.buffers.gather_ranges`).
Written by hand: kafka-python's reader (the reference in tests) builds a Python object per
record, too slow for the statistics and rewrite passes, which read every record twice
(measured: docs/kafka-segments-source.md#decode-speed).
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Sequence
from dataclasses import dataclass, field

import cramjam
import google_crc32c
import numpy as np
import pyarrow as pa

from keygroups._numba import Int, njit
from keygroups.envelope import ARROW_SCHEMA, HEADER_TYPE, CorruptFile
from keygroups.envelope.buffers import gather_ranges

HEADER = struct.Struct(">qiibIhiqqqhii")  # the 61-byte batch header
HEADER_BYTES = HEADER.size
LOG_OVERHEAD = 12  # base offset and batch length: the bytes before the length counts
CODECS = {0: "none", 1: "gzip", 2: "snappy", 3: "lz4", 4: "zstd"}
_XERIAL = b"\x82SNAPPY\x00"
# What `_parse` returns: per record its offset, timestamp, key and value positions and lengths,
# header count; per header item its key and value positions and lengths; the header items'
# count; the error (-1, or the start of the batch holding a malformed record).
_A = np.ndarray
_Parsed = tuple[_A, _A, _A, _A, _A, _A, _A, _A, _A, _A, _A, Int, Int]


@dataclass(frozen=True)
class Aborted:
    """A transaction a producer aborted: its data batches in [first_offset, last_offset] are
    not part of the topic (Kafka's transaction index entry)."""

    producer_id: int
    first_offset: int
    last_offset: int


@dataclass
class SegmentReport:
    """What reading a segment skipped, for messages and tests."""

    control_batches: int = 0
    aborted_batches: int = 0
    aborted_records: int = 0
    batches: int = 0
    codecs: set[str] = field(default_factory=set)


def _decompress(codec: int, data: bytes, where: str) -> bytes:
    try:
        if codec == 1:
            return zlib.decompress(data, wbits=47)  # gzip or zlib header, as Kafka's GZIPOutputStream writes
        if codec == 2:
            if data[:8] != _XERIAL:
                return bytes(cramjam.snappy.decompress_raw(data))
            out, pos = [], 16  # magic, version, compatible version
            while pos < len(data):
                (n,) = struct.unpack_from(">i", data, pos)
                out.append(bytes(cramjam.snappy.decompress_raw(data[pos + 4 : pos + 4 + n])))
                pos += 4 + n
            return b"".join(out)
        if codec == 3:
            return bytes(cramjam.lz4.decompress(data))
        if codec == 4:
            return bytes(cramjam.zstd.decompress(data))
    except (zlib.error, cramjam.DecompressionError, struct.error, ValueError) as exc:
        raise CorruptFile(f"{where}: {CODECS[codec]} data does not decompress ({exc})") from None
    raise CorruptFile(f"{where}: unknown compression codec {codec}")


def _is_aborted(aborted: Sequence[Aborted], producer_id: int, offset: int) -> bool:
    return any(a.producer_id == producer_id and a.first_offset <= offset <= a.last_offset for a in aborted)


def decode_segment(
    data: bytes | bytearray,
    partition: int,
    *,
    name: str,
    aborted: Sequence[Aborted] = (),
    from_offset: int = 0,
    report: SegmentReport | None = None,
) -> pa.RecordBatch:
    """The data records of a log segment's bytes, in offset order, as ARROW_SCHEMA: control
    batches and the batches of aborted transactions left out, offsets below `from_offset`
    too. Every batch's CRC-32C is checked; damage raises CorruptFile naming `name` and the
    byte position."""
    report = report if report is not None else SegmentReport()
    blobs: list[bytes] = []
    meta: list[tuple[int, int, int, int, int, int]] = []  # base offset, base ts, max ts, ts type, records, last offset
    pos, end = 0, len(data)
    view = memoryview(data)
    while pos < end:
        if end - pos < HEADER_BYTES:
            raise CorruptFile(f"{name}: truncated batch at byte {pos} ({end - pos} bytes left, a header is 61)")
        (base, length, _epoch, magic, crc, attrs, _last_delta, base_ts, max_ts, pid, _pepoch, _seq, count) = (
            HEADER.unpack_from(data, pos)
        )
        if magic != 2:
            raise CorruptFile(
                f"{name}: batch at byte {pos} has magic {magic}; keyfill reads message format v2 (magic 2, Kafka "
                "0.11+): convert older segments first"
            )
        stop = pos + LOG_OVERHEAD + length
        if length < HEADER_BYTES - LOG_OVERHEAD or stop > end:
            raise CorruptFile(
                f"{name}: truncated batch at byte {pos} (offset {base}): its length says {length} bytes, "
                f"{end - pos - LOG_OVERHEAD} remain"
            )
        if google_crc32c.value(view[pos + 21 : stop].tobytes()) != crc:
            raise CorruptFile(f"{name}: CRC-32C mismatch in the batch at byte {pos} (offset {base})")
        report.batches += 1
        codec = attrs & 7
        report.codecs.add(CODECS.get(codec, str(codec)))
        skip = False
        if attrs & 0x20:
            report.control_batches += 1
            skip = True
        elif attrs & 0x10 and aborted and _is_aborted(aborted, pid, base):
            report.aborted_batches += 1
            report.aborted_records += count
            skip = True
        if not skip and count and base + _last_delta >= from_offset:
            body = view[pos + HEADER_BYTES : stop].tobytes()
            if codec:
                body = _decompress(codec, body, f"{name} batch at byte {pos} (offset {base})")
            blobs.append(body)
            meta.append((base, base_ts, max_ts, (attrs >> 3) & 1, count, base + _last_delta))
        pos = stop
    if not blobs:
        return pa.RecordBatch.from_pylist([], schema=ARROW_SCHEMA)
    buf = np.frombuffer(b"".join(blobs), np.uint8)
    starts = np.cumsum([0] + [len(b) for b in blobs[:-1]]).astype(np.int64)
    m = np.array(meta, np.int64)
    parsed = _parse(buf, starts, m[:, 0], m[:, 1], m[:, 2], m[:, 3], m[:, 4], int(m[:, 4].sum()))
    err = int(parsed[-1])
    if err >= 0:
        batch = int(np.searchsorted(starts, err, side="right")) - 1
        raise CorruptFile(
            f"{name}: a record of the batch at offset {int(m[batch, 0])} runs past its batch (malformed record)"
        )
    (off, ts, k_pos, k_len, v_pos, v_len, h_count, hk_pos, hk_len, hv_pos, hv_len, n_headers, _) = parsed
    n, nh = len(off), int(n_headers)
    which = np.repeat(np.arange(len(meta)), m[:, 4])
    outside = (off < m[which, 0]) | (off > m[which, 5])
    if outside.any():
        b = int(which[np.argmax(outside)])
        raise CorruptFile(
            f"{name}: a record of the batch at offset {int(m[b, 0])} has offset {int(off[np.argmax(outside)])}, "
            f"outside the batch's {int(m[b, 0])}..{int(m[b, 5])}"
        )
    if n and np.any(np.diff(off) <= 0):
        raise CorruptFile(f"{name}: offsets go backwards or repeat inside the segment")
    keys = _binary(buf, k_pos, k_len, pa.binary())
    values = _binary(buf, v_pos, v_len, pa.binary())
    hkeys = _binary(buf, hk_pos[:nh], hk_len[:nh], pa.string())
    if hkeys.null_count:
        raise CorruptFile(f"{name}: a record header with a null key")
    try:
        hkeys.validate(full=True)
    except pa.ArrowInvalid:
        raise CorruptFile(f"{name}: a record header key that is not UTF-8") from None
    hvalues = _binary(buf, hv_pos[:nh], hv_len[:nh], pa.binary())
    items = pa.StructArray.from_arrays([hkeys, hvalues], fields=list(HEADER_TYPE))
    list_offsets = np.zeros(n + 1, np.int32)
    np.cumsum(h_count, out=list_offsets[1:])
    headers = pa.ListArray.from_arrays(pa.array(list_offsets), items, type=pa.list_(HEADER_TYPE))
    out = pa.RecordBatch.from_arrays(
        [
            pa.array(np.full(n, partition, np.int32)),
            pa.array(off),
            pa.array(ts).cast(pa.timestamp("ms", tz="UTC")),
            keys,
            values,
            headers,
        ],
        schema=ARROW_SCHEMA,
    )
    if n and off[0] < from_offset:  # a batch straddling `from_offset`
        out = out.filter(pa.array(off >= from_offset))
    return out


def _binary(buf: np.ndarray, pos: np.ndarray, length: np.ndarray, typ: pa.DataType) -> pa.Array:
    """Items of `buf` at `pos` of `length` (-1: null) as one binary (or string) array."""
    n = len(pos)
    offsets, data = gather_ranges(buf, pos, length)
    valid = length >= 0
    nulls = n - int(np.count_nonzero(valid))
    validity = pa.py_buffer(np.packbits(valid, bitorder="little")) if nulls else None
    large = pa.large_binary() if typ == pa.binary() else pa.large_string()
    arr = pa.Array.from_buffers(large, n, [validity, pa.py_buffer(offsets), pa.py_buffer(data)], null_count=nulls)
    return arr.cast(typ)


@njit(cache=True, nogil=True)
def _varint(buf: np.ndarray, p: Int, end: Int) -> tuple[Int, Int]:  # pragma: no cover - compiled
    """(zigzag-decoded value, next position); position -1 when it runs past `end` (or
    starts at -1: a field before it ran past)."""
    result = 0
    shift = 0
    while True:
        if p < 0 or p >= end or shift > 63:
            return 0, -1
        b = buf[p]
        p += 1
        result |= (np.int64(b) & 0x7F) << shift
        if b < 0x80:
            break
        shift += 7
    return (result >> 1) ^ -(result & 1), p


@njit(cache=True, nogil=True)
def _parse(  # pragma: no cover - compiled
    buf: np.ndarray,
    starts: np.ndarray,
    base_off: np.ndarray,
    base_ts: np.ndarray,
    max_ts: np.ndarray,
    ts_type: np.ndarray,
    counts: np.ndarray,
    total: int,
) -> _Parsed:
    """Every record of the batches' record parts (concatenated in `buf`, batch b's from
    `starts[b]`): offsets, timestamps, and positions and lengths of keys, values and header
    items. The last returned item is -1, or the start of the batch holding a malformed
    record (a length past its record or batch, a record longer than its fields)."""
    off = np.empty(total, np.int64)
    ts = np.empty(total, np.int64)
    k_pos = np.empty(total, np.int64)
    k_len = np.empty(total, np.int64)
    v_pos = np.empty(total, np.int64)
    v_len = np.empty(total, np.int64)
    h_count = np.zeros(total, np.int64)
    cap = max(16, total)
    hk_pos = np.empty(cap, np.int64)
    hk_len = np.empty(cap, np.int64)
    hv_pos = np.empty(cap, np.int64)
    hv_len = np.empty(cap, np.int64)
    nh = 0
    r = 0
    bad = -1
    nb = len(starts)
    for b in range(nb):
        p = starts[b]
        end = starts[b + 1] if b + 1 < nb else len(buf)
        for _ in range(counts[b]):
            length, p = _varint(buf, p, end)
            rec_end = p + length
            if p < 0 or length < 1 or rec_end > end:
                bad = starts[b]
                break
            p += 1  # record attributes (unused)
            dts, p = _varint(buf, p, rec_end)
            doff, p = _varint(buf, p, rec_end)
            kl, p = _varint(buf, p, rec_end)
            k_pos[r], k_len[r] = p, kl
            p = p + max(kl, 0) if p >= 0 else p
            vl, p = _varint(buf, p, rec_end)
            v_pos[r], v_len[r] = p, vl
            p = p + max(vl, 0) if p >= 0 else p
            hc, p = _varint(buf, p, rec_end)
            if p < 0 or hc < 0 or hc > rec_end - p:
                bad = starts[b]
                break
            off[r] = base_off[b] + doff
            ts[r] = max_ts[b] if ts_type[b] == 1 else base_ts[b] + dts
            h_count[r] = hc
            if nh + hc > cap:
                cap = max(2 * cap, nh + hc)
                hk_pos, hk_len = _grow(hk_pos, cap), _grow(hk_len, cap)
                hv_pos, hv_len = _grow(hv_pos, cap), _grow(hv_len, cap)
            for _h in range(hc):
                hkl, p = _varint(buf, p, rec_end)
                hk_pos[nh], hk_len[nh] = p, hkl
                p = p + hkl if p >= 0 and hkl >= 0 else -1
                hvl, p = _varint(buf, p, rec_end)
                hv_pos[nh], hv_len[nh] = p, hvl
                p = p + max(hvl, 0) if p >= 0 else p
                nh += 1
            if p != rec_end:  # a field ran past its record (p == -1), or the record has bytes left over
                bad = starts[b]
                break
            r += 1
        if bad >= 0:
            break
    return off, ts, k_pos, k_len, v_pos, v_len, h_count, hk_pos, hk_len, hv_pos, hv_len, nh, bad


@njit(cache=True, nogil=True)
def _grow(a: np.ndarray, cap: Int) -> np.ndarray:  # pragma: no cover - compiled
    out = np.empty(cap, a.dtype)
    out[: len(a)] = a
    return out

"""Avro object container framing, shared by every codec in keyfill: varints, the file
header, data blocks and their sync markers, block compression.

fastavro reads a container a record at a time into dicts with the GIL held; keyfill's
decoders are specialised for fixed schemas and compiled with numba, so they need the
framing as buffers and offsets. The header (a few hundred bytes) is parsed in Python; the
block walk and the record loops run compiled, GIL released.

Over 400 lines on purpose: this is one specification (the Avro container format) in both
directions, and writers and readers must agree on it byte for byte; one module keeps the
varint, block and codec rules reviewable side by side.
"""

from __future__ import annotations

import bz2
import functools
import io
import json
import lzma
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import fastavro
import numpy as np
from zlib_ng.zlib_ng import crc32  # the stdlib's zlib.crc32 ran at 1.8 GB/s here, zlib-ng's at 9-16 GB/s

import keygroups.envelope.snappy as snappy  # by its own name: not through the package (its __init__ imports framing)
from keygroups._numba import Int, njit
from keygroups.envelope.schema import CODECS
from keygroups.envelope.snappy import snappy_lengths
from keygroups.errors import CorruptFile, HeaderTruncated, OptionError

# Error codes of the compiled Avro readers (the envelope decoder and the Kafka Connect ones).
ERR_EOF, ERR_UNION, ERR_NEGATIVE, ERR_SYNC, ERR_RANGE = 1, 2, 3, 5, 6
RECORD_ERRORS = {
    ERR_EOF: "data ends inside a record",
    ERR_UNION: "bad union branch",
    ERR_NEGATIVE: "negative length",
    ERR_RANGE: "partition out of the int range",
}
MAGIC = b"Obj\x01"


# --- writing ---------------------------------------------------------------------------


@njit(cache=True, nogil=True)
def varint_size(n: Int) -> int:
    z = (n << 1) ^ (n >> 63)  # zigzag
    size = 1
    while z >= 0x80 or z < 0:  # z is int64: treat as unsigned
        z = (z >> 7) & 0x01FFFFFFFFFFFFFF
        size += 1
    return size


@njit(cache=True, nogil=True)
def put_varint(out: np.ndarray, pos: Int, n: Int) -> Int:
    z = (n << 1) ^ (n >> 63)
    while z >= 0x80 or z < 0:
        out[pos] = (z & 0x7F) | 0x80
        z = (z >> 7) & 0x01FFFFFFFFFFFFFF
        pos += 1
    out[pos] = z
    return pos + 1


@njit(cache=True, nogil=True)
def put_bytes(out: np.ndarray, pos: Int, data: np.ndarray, start: Int, end: Int) -> Int:
    pos = put_varint(out, pos, end - start)
    out[pos : pos + end - start] = data[start:end]
    return pos + end - start


def varint_bytes(n: int) -> bytes:
    out = bytearray()
    z = (n << 1) ^ (n >> 63)
    while z >= 0x80:
        out.append((z & 0x7F) | 0x80)
        z >>= 7
    out.append(z)
    return bytes(out)


def compress(codec: str, data: Any) -> bytes:
    """One Avro block's bytes compressed; `data`: any contiguous buffer (bytes, a numpy view)."""
    if codec == "null":
        return bytes(data)
    if codec == "deflate":
        c = zlib.compressobj(6, zlib.DEFLATED, -15)  # Avro's deflate is raw, no zlib header
        return c.compress(data) + c.flush()
    if codec == "snappy":
        import cramjam

        # Avro's snappy: the raw snappy block followed by the big-endian CRC32 of the input.
        return bytes(cramjam.snappy.compress_raw(data)) + crc32(data).to_bytes(4, "big")
    raise OptionError(f"unknown Avro codec {codec!r}; choose one of {', '.join(CODECS)}")


# --- reading ---------------------------------------------------------------------------


@njit(cache=True, nogil=True)
def read_varint(buf: np.ndarray, pos: Int, end: Int) -> tuple[np.int64, Int]:
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
def read_block_count(buf: np.ndarray, pos: Int, end: Int) -> tuple[np.int64, Int]:
    """An Avro array block's item count: (count, new pos), new pos -1 past `end`. A
    negative count is followed by the block's byte size, which readers do not need."""
    count, pos = read_varint(buf, pos, end)
    if pos >= 0 and count < 0:
        count = -count
        _, pos = read_varint(buf, pos, end)
    return count, pos


@njit(cache=True, nogil=True)
def read_bytes(buf: np.ndarray, pos: Int, end: Int, dst: np.ndarray, dpos: Int) -> tuple[Int, Int, int]:
    """Copy one length-prefixed byte string into dst; (new pos, new dpos, error)."""
    length, pos = read_varint(buf, pos, end)
    if pos < 0:
        return pos, dpos, ERR_EOF
    if length < 0:
        return pos, dpos, ERR_NEGATIVE
    if pos + length > end:
        return -1, dpos, ERR_EOF
    dst[dpos : dpos + length] = buf[pos : pos + length]
    return pos + length, dpos + length, 0


@njit(cache=True, nogil=True)
def _scan_blocks(
    buf: np.ndarray, pos: Int, sync: np.ndarray, starts: np.ndarray, ends: np.ndarray, counts: np.ndarray, fill: bool
) -> tuple[int, int, Int]:
    """Walk the container's data blocks from `pos` (each: record count, byte size, data, sync
    marker); with `fill`, record them. (blocks, error, byte position of the error)."""
    end = buf.shape[0]
    nblocks = 0
    while pos < end:
        at = pos
        count, pos = read_varint(buf, pos, end)
        if pos < 0:
            return nblocks, ERR_EOF, at
        size, pos = read_varint(buf, pos, end)
        if pos < 0:
            return nblocks, ERR_EOF, at
        if count < 0 or size < 0:
            return nblocks, ERR_NEGATIVE, at
        if size > end - pos - 16:
            return nblocks, ERR_EOF, at
        if fill:
            starts[nblocks] = pos
            ends[nblocks] = pos + size
            counts[nblocks] = count
        pos += size
        for k in range(16):
            if buf[pos + k] != sync[k]:
                return nblocks, ERR_SYNC, pos
        pos += 16
        nblocks += 1
    return nblocks, 0, 0


@njit(cache=True, nogil=True)
def frame_blocks(buf: np.ndarray, pos: Int, sync: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, int, Int]:
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
def skip_bytes(buf: np.ndarray, pos: Int, end: Int) -> tuple[Int, Int, Int]:
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


def _read_long(data: bytes | memoryview, pos: int) -> tuple[int, int]:
    z = shift = 0
    while True:
        b = data[pos]  # IndexError past the end
        pos += 1
        z |= (b & 0x7F) << shift
        if b < 0x80:
            return (z >> 1) ^ -(z & 1), pos
        shift += 7
        if shift > 63:
            raise CorruptFile("varint too long")


def read_header(data: bytes | memoryview, name: str) -> tuple[dict[str, bytes], bytes, int]:
    """(metadata, sync marker, position of the first block) of an Avro object container.
    Raises CorruptFile when it is not one, HeaderTruncated when `data` ends inside the
    header (a caller that fetched only the first bytes then fetches more)."""
    if len(data) >= 4 and bytes(data[:4]) != MAGIC:
        raise CorruptFile(f"{name}: not an Avro object container file (bad magic bytes)")
    meta: dict[str, bytes] = {}
    pos = 4
    try:
        if len(data) < 4:
            raise IndexError
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
                    if length < 0:
                        raise CorruptFile(f"{name}: not a readable Avro file: negative length in the file header")
                    if pos + length > len(data):
                        raise IndexError
                    item.append(bytes(data[pos : pos + length]))
                    pos += length
                meta[item[0].decode()] = item[1]
    except IndexError:
        raise HeaderTruncated(f"{name}: the data ends inside the Avro header") from None
    except (UnicodeDecodeError, CorruptFile) as exc:
        raise CorruptFile(f"{name}: not a readable Avro file: {exc}") from None
    sync = bytes(data[pos : pos + 16])
    if len(sync) != 16:
        raise HeaderTruncated(f"{name}: the data ends inside the Avro header")
    return meta, sync, pos + 16


def text_metadata(meta: dict[str, bytes], name: str) -> dict[str, str]:
    try:
        return {k: v.decode() for k, v in meta.items()}
    except UnicodeDecodeError as exc:
        raise CorruptFile(f"{name}: Avro file metadata is not UTF-8 text ({exc})") from None


def read_avro_metadata(head: bytes, *, name: str = "<bytes>") -> dict[str, str]:
    """The Avro file metadata from the first bytes of a file. Raises HeaderTruncated when
    `head` stops inside the header (fetch more bytes), CorruptFile when it is not an Avro
    file at all."""
    meta, _, _ = read_header(memoryview(head), name)
    return text_metadata(meta, name)


@dataclass(frozen=True)
class Blocks:
    """An Avro container's data blocks, decompressed: block b's records are the bytes
    buf[starts[b]:ends[b]], counts[b] of them."""

    meta: dict[str, bytes]
    buf: np.ndarray
    starts: np.ndarray
    ends: np.ndarray
    counts: np.ndarray

    def schema(self, name: str) -> Any:
        try:
            return json.loads(self.meta["avro.schema"])
        except (KeyError, ValueError) as exc:
            raise CorruptFile(f"{name}: not a readable Avro file: no valid schema ({exc})") from None

    def contiguous(self) -> Blocks:
        """The same blocks back to back (sync markers dropped), for decoders that walk
        them as one stream."""
        if not len(self.starts) or (self.starts[0] == 0 and (self.starts[1:] == self.ends[:-1]).all()):
            return self  # decompressed blocks already lie back to back from byte 0
        parts = [self.buf[a:b] for a, b in zip(self.starts.tolist(), self.ends.tolist())]
        buf = np.concatenate(parts) if parts else np.zeros(0, np.uint8)
        ends = np.cumsum(self.ends - self.starts)
        return Blocks(self.meta, buf, ends - (self.ends - self.starts), ends, self.counts)


def read_blocks(
    data: bytes,
    name: str,
    *,
    verified: bool = False,
    header: bytes | None = None,
    scratch: Callable[[int], np.ndarray] | None = None,
) -> Blocks:
    """Header, block framing (sync markers checked, GIL released) and decompression: what
    every decoder of Avro containers needs before it reads records (`verified`: see
    `decompress`). `header`: the file's header, when `data` holds only whole blocks from
    it (a ranged read); parsed once per distinct header, not once per call."""
    view = memoryview(data).cast("B") if not isinstance(data, bytes) else memoryview(data)
    if header is None:
        try:
            meta, sync, pos = read_header(view, name)
        except HeaderTruncated:
            raise CorruptFile(f"{name}: not a readable Avro file: header ends early") from None
    else:
        parsed = _parsed_header(header)
        if isinstance(parsed, str):
            raise CorruptFile(f"{name}: {parsed}")
        meta, sync, pos = parsed[0], parsed[1], 0
    buf = np.frombuffer(view, np.uint8)
    starts, ends, counts, err, at = frame_blocks(buf, pos, np.frombuffer(sync, np.uint8))
    if err:
        what = {ERR_SYNC: "sync marker mismatch", ERR_NEGATIVE: "bad block header"}.get(err, "file ends inside a block")
        raise CorruptFile(f"{name}: not a readable Avro file: {what} at byte {at}")
    codec = meta.get("avro.codec", b"null").decode(errors="replace")
    if codec in ("zstandard", "lz4"):
        return _fastavro_blocks(data if header is None else header + data, meta, name)
    if codec != "null":
        buf, starts, ends = decompress(codec, view, starts, ends, name, verified=verified, scratch=scratch)
    return Blocks(meta, buf, starts, ends, counts)


@functools.lru_cache(maxsize=256)
def _parsed_header(header: bytes) -> tuple[dict[str, bytes], bytes] | str:
    """(metadata, sync marker) of a whole Avro header, or what is wrong with it. A reader
    decodes a file's pieces a step at a time, each with the same header: parsing it in
    Python every time cost about a quarter of a short step. Callers must not change the
    metadata dict (it is shared)."""
    try:
        meta, sync, pos = read_header(memoryview(header), "")
    except (HeaderTruncated, CorruptFile) as exc:
        return str(exc).removeprefix(": ")
    if pos != len(header):
        return f"the {len(header)}-byte header has {len(header) - pos} bytes after its sync marker"
    return meta, sync


# Codecs whose blocks decompress in one call (the Avro spec's deflate is raw, no zlib header).
# Files written elsewhere (a Kafka Connect sink) may use any codec of the spec; keyfill's own
# files use null, deflate or snappy.
_WHOLE_BLOCK = {
    "deflate": lambda b: zlib.decompress(b, -15),
    "bzip2": bz2.decompress,
    "xz": lzma.decompress,
}


def _fastavro_blocks(data: bytes, meta: dict[str, bytes], name: str) -> Blocks:
    """Blocks decompressed by fastavro, for the codecs it has optional libraries for
    (zstandard, lz4): slower, but every codec fastavro reads stays readable."""
    raw: list[bytes] = []
    counts: list[int] = []
    try:
        for block in fastavro.block_reader(io.BytesIO(data)):
            raw.append(block.bytes_.getvalue())  # type: ignore[attr-defined]  # fastavro's Block stub omits bytes_
            counts.append(block.num_records)
    except Exception as exc:  # fastavro raises several types on corrupt input or a missing library
        raise CorruptFile(f"{name}: not a readable Avro file: {type(exc).__name__}: {exc}") from None
    lengths = np.array([len(r) for r in raw], np.int64)
    ends = np.cumsum(lengths)
    buf = np.frombuffer(b"".join(raw), np.uint8) if raw else np.zeros(0, np.uint8)
    return Blocks(meta, buf, ends - lengths, ends, np.array(counts, np.int64))


def decompress(
    codec: str,
    view: memoryview,
    starts: np.ndarray,
    ends: np.ndarray,
    name: str,
    *,
    verified: bool = False,
    scratch: Callable[[int], np.ndarray] | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(buffer, starts, ends) of the decompressed blocks. snappy goes straight into one
    buffer sized from the blocks' own length prefixes, all blocks in one compiled call
    (`keygroups.envelope.snappy`); zlib, bz2 and lzma release the GIL per block.

    `verified`: the caller has already checked these compressed bytes against a checksum
    of its own (the piece index's CRC-32C), so snappy's per-block CRC-32 of the output is
    skipped. It is not just CPU: with several threads each small block's CRC call hands the
    GIL over and back, which made short slices' many small blocks decode slower than long
    slices' few large ones (docs/performance.md#snappy-blocks-in-one-call)."""
    sizes = np.empty(len(starts), np.int64)
    try:
        if codec == "snappy":
            if (ends - starts < 4).any():
                raise ValueError("snappy block shorter than its checksum")
            buf = np.frombuffer(view, np.uint8)
            sizes = snappy_lengths(buf, starts, ends - 4)
            if (sizes < 0).any():
                raise ValueError("snappy block without a valid length")
            out_ends = np.cumsum(sizes)
            size = (int(out_ends[-1]) if len(sizes) else 0) + snappy.SLACK
            whole = np.empty(size, np.uint8) if scratch is None else scratch(size)
            bad = snappy.decompress_blocks(buf, starts, ends - 4, whole, out_ends - sizes, out_ends)
            if bad >= 0:
                raise ValueError(f"block {bad + 1} of {len(starts)} is not valid snappy data")
            out = whole[: len(whole) - snappy.SLACK]
            if not verified:
                for e, a, z in zip(ends.tolist(), (out_ends - sizes).tolist(), out_ends.tolist()):
                    if crc32(out[a:z]) != int.from_bytes(view[e - 4 : e], "big"):
                        raise ValueError("snappy block checksum mismatch")
        elif codec in _WHOLE_BLOCK:
            unpack = _WHOLE_BLOCK[codec]
            pieces = [unpack(view[s:e]) for s, e in zip(starts.tolist(), ends.tolist())]
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

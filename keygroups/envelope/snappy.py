"""Raw snappy decompression of many blocks in one compiled call, the GIL released once.

Written here because no library does it: cramjam, pyarrow and python-snappy decompress one
block per call, and each call releases the GIL and takes it back. A replay of 10 s slices
has one small block per piece, and with several threads those hand-offs made a decode step
take longer than the same bytes in large blocks. Here a decode step's blocks go through one
call: about as fast as cramjam per byte, and one GIL hand-off per step
(docs/performance.md#snappy-blocks-in-one-call).

The format is snappy's raw format (format_description.txt in google/snappy): a varint of the
uncompressed length, then literals and back-references. Copies move 8 bytes at a time with
unaligned loads and stores, as the reference decoder does, so the output needs 16 bytes of
slack past its last block. Every length and offset is checked against the block's own input
and output before anything is copied: a damaged block is reported, never read or written
past.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from llvmlite import ir
from numba import types
from numba.extending import intrinsic

from keygroups._numba import Int, njit

SLACK = 16  # bytes past the last block's output that copies may write


# numba's stub gives an intrinsic's call the parameters of its typing function, typingctx
# included: compiled code passes one fewer, hence type: ignore[call-arg] where it is called.
@intrinsic
def _copy8(typingctx: Any, dst: Any, dpos: Any, src: Any, spos: Any) -> Any:
    """dst[dpos:dpos + 8] = src[spos:spos + 8], as one unaligned 8-byte load and store
    (numba compiles a byte loop; a memcpy call per short copy was slower)."""
    sig = types.void(dst, dpos, src, spos)

    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        d, dp, s, sp = args
        da = context.make_array(signature.args[0])(context, builder, d)
        sa = context.make_array(signature.args[2])(context, builder, s)
        word = ir.IntType(64).as_pointer()
        value = builder.load(builder.bitcast(builder.gep(sa.data, [sp]), word), align=1)
        builder.store(value, builder.bitcast(builder.gep(da.data, [dp]), word), align=1)
        return context.get_dummy_value()

    return sig, codegen


@njit(cache=True, nogil=True)
def _preamble(src: np.ndarray, pos: Int, end: Int) -> tuple[np.int64, Int]:
    """(uncompressed length, position after it) of a raw snappy block at `pos`: an unsigned
    LEB128 varint of at most 32 bits; (-1, -1) when it is cut short or too long."""
    n = np.int64(0)
    shift = 0
    while pos < end and shift <= 28:
        c = np.int64(src[pos])
        pos += 1
        n |= (c & 0x7F) << shift
        if c < 0x80:
            return (n, pos) if n < (1 << 32) else (np.int64(-1), -1)
        shift += 7
    return np.int64(-1), -1


@njit(cache=True, nogil=True)
def snappy_lengths(src: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """Each raw snappy block's uncompressed length, from its preamble; -1 for a block whose
    preamble is cut short or too long. One compiled pass instead of a library call per
    block: a replay of short slices has thousands."""
    out = np.empty(len(starts), np.int64)
    for b in range(len(starts)):
        out[b] = _preamble(src, starts[b], ends[b])[0]
    return out


@njit(cache=True, nogil=True)
def decompress_blocks(
    src: np.ndarray, starts: np.ndarray, ends: np.ndarray, out: np.ndarray, out_starts: np.ndarray, out_ends: np.ndarray
) -> int:
    """Decompress raw snappy blocks src[starts[b]:ends[b]] into out[out_starts[b]:out_ends[b]]
    (slots in increasing order, `out` SLACK bytes longer than the last). Returns -1, or the
    first block that is not valid snappy of exactly its slot's length."""
    n_src = len(src)
    n_out = len(out)
    for b in range(len(starts)):
        end = np.int64(ends[b])
        if end > n_src:
            return b
        total, ip = _preamble(src, np.int64(starts[b]), end)
        if total < 0:
            return b
        base = np.int64(out_starts[b])
        op = base
        stop = np.int64(out_ends[b])
        if base + total != stop or stop > n_out - SLACK:
            return b
        while ip < end:
            tag = np.int64(src[ip])
            ip += 1
            kind = tag & 3
            if kind == 0:  # a literal: length - 1 in the tag, or in the 1-4 bytes after it
                n = tag >> 2
                if n >= 60:
                    k = n - 59
                    if ip + k > end:
                        return b
                    n = np.int64(0)
                    for j in range(k):
                        n |= np.int64(src[ip + j]) << (8 * j)
                    ip += k
                n += 1
                if ip + n > end or op + n > stop:
                    return b
                if ip + 16 <= n_src and ip + n + 8 <= n_src:  # two words (most literals: all), then the rest
                    _copy8(out, op, src, ip)  # type: ignore[call-arg]  # numba stub: see _copy8
                    _copy8(out, op + 8, src, ip + 8)
                    j = 16
                    while j < n:
                        _copy8(out, op + j, src, ip + j)
                        j += 8
                else:  # the input's last bytes: no 8-byte read past them
                    for j in range(n):
                        out[op + j] = src[ip + j]
                ip += n
                op += n
                continue
            if kind == 1:  # a copy with an 11-bit offset
                if ip >= end:
                    return b
                n = 4 + ((tag >> 2) & 7)
                offset = ((tag >> 5) << 8) | np.int64(src[ip])
                ip += 1
            elif kind == 2:  # 16-bit offset
                if ip + 2 > end:
                    return b
                n = 1 + (tag >> 2)
                offset = np.int64(src[ip]) | (np.int64(src[ip + 1]) << 8)
                ip += 2
            else:  # 32-bit offset
                if ip + 4 > end:
                    return b
                n = 1 + (tag >> 2)
                offset = (
                    np.int64(src[ip])
                    | (np.int64(src[ip + 1]) << 8)
                    | (np.int64(src[ip + 2]) << 16)
                    | (np.int64(src[ip + 3]) << 24)
                )
                ip += 4
            if offset == 0 or offset > op - base or op + n > stop:
                return b
            at = op - offset
            if offset >= 8:  # each 8 bytes read were written before (by this copy or earlier)
                # two words (most copies: all; the output has SLACK past `stop`), then the rest
                _copy8(out, op, out, at)  # type: ignore[call-arg]  # numba stub: see _copy8
                _copy8(out, op + 8, out, at + 8)
                j = 16
                while j < n:
                    _copy8(out, op + j, out, at + j)
                    j += 8
            else:  # a pattern shorter than 8 bytes repeats: its first bytes one by one, until
                # whole patterns span 8 bytes, then words from that far back (the same bytes)
                span = offset * ((offset + 7) // offset)
                lead = min(n, span - offset)
                for j in range(lead):
                    out[op + j] = out[at + j]
                j = lead
                while j < n:
                    _copy8(out, op + j, out, op + j - span)  # type: ignore[call-arg]  # numba stub: see _copy8
                    j += 8
            op += n
        if op != stop:
            return b
    return -1

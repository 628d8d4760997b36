"""The compiled multi-block snappy decoder (keygroups.envelope.snappy) against cramjam, the
library it stands in for on the read path: same bytes out for anything cramjam compresses,
and damaged or hostile input reported as a bad block, never read or written past."""

from __future__ import annotations

import cramjam
import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from keygroups.envelope.snappy import SLACK, decompress_blocks, snappy_lengths


def _decode(raw: list[bytes], sizes: list[int] | None = None) -> tuple[int, list[bytes]]:
    """decompress_blocks over blocks laid back to back; (its result, each block's output).
    The output buffer has 64 bytes more than the decoder is told it may use: a copy may
    write up to SLACK - 1 bytes past its block's end (two 8-byte words), never further."""
    src = np.frombuffer(b"".join(raw), np.uint8)
    lengths = np.array([len(r) for r in raw], np.int64)
    ends = np.cumsum(lengths)
    starts = ends - lengths
    if sizes is None:
        sizes = snappy_lengths(src, starts, ends).tolist()
    size = np.array(sizes, np.int64)
    out_ends = np.cumsum(size)
    total = int(size.sum())
    out = np.full(total + SLACK + 64, 0xAB, np.uint8)
    bad = decompress_blocks(src, starts, ends, out[: total + SLACK], out_ends - size, out_ends)
    assert (out[total + SLACK :] == 0xAB).all()  # never written past what it was given
    return bad, [bytes(out[a:z]) for a, z in zip((out_ends - size).tolist(), out_ends.tolist())]


repetitive = st.builds(
    lambda unit, times, tail: unit * times + tail,
    st.binary(min_size=1, max_size=24),
    st.integers(1, 400),
    st.binary(max_size=64),
)
block = st.one_of(st.binary(max_size=5000), repetitive)


@settings(max_examples=400, deadline=None)
@given(blocks=st.lists(block, max_size=8))
def test_blocks_decode_as_cramjam_does(blocks):
    """Random and repetitive data (a copy with an offset under 8 repeats a pattern: its first
    bytes one by one, then words from whole patterns back; longer offsets move 8 bytes at a
    time; long literals take the 1-4 byte length forms)."""
    raw = [bytes(cramjam.snappy.compress_raw(b)) for b in blocks]
    bad, out = _decode(raw)
    assert bad == -1
    assert out == blocks
    assert out == [bytes(cramjam.snappy.decompress_raw(r)) for r in raw]


def test_every_tag_kind_including_the_32_bit_offset_copy():
    """cramjam's encoder never emits a copy with a 32-bit offset (it cuts input into 64 KiB
    fragments) nor literals with 3- or 4-byte lengths; the format has them, so other
    writers may. Streams built by hand, checked against cramjam's decoder."""
    lit = bytes(range(70))  # a literal with a 1-byte length (tag 60)
    body = bytes([60 << 2]) + bytes([len(lit) - 1]) + lit
    body += bytes([((10 - 4) << 2) | 1 | ((0 >> 8) << 5), 70])  # 11-bit offset 70, 10 bytes
    body += bytes([((20 - 1) << 2) | 2]) + (33).to_bytes(2, "little")  # 16-bit offset 33, 20 bytes
    body += bytes([((16 - 1) << 2) | 3]) + (5).to_bytes(4, "little")  # 32-bit offset 5, 16 bytes (overlapping)
    big = bytes(range(256)) * 300  # 76,800 bytes: a literal with a 3-byte length (tag 62)
    body += bytes([62 << 2]) + (len(big) - 1).to_bytes(3, "little") + big
    body += bytes([((64 - 1) << 2) | 3]) + (len(big) + 40).to_bytes(4, "little")  # 32-bit offset past 64 KiB
    body += bytes([63 << 2]) + (3 - 1).to_bytes(4, "little") + b"xyz"  # a 4-byte length (tag 63)
    total = 70 + 10 + 20 + 16 + len(big) + 64 + 3
    stream = _with_length(body, total)
    expected = bytes(cramjam.snappy.decompress_raw(stream))
    assert len(expected) == total
    bad, out = _decode([stream])
    assert bad == -1
    assert out == [expected]


def _with_length(body: bytes, n: int) -> bytes:
    """A raw snappy stream: the uncompressed length as an unsigned varint, then `body`."""
    pre = bytearray()
    while True:
        byte = n & 0x7F
        n >>= 7
        pre.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(pre) + body


@settings(max_examples=400, deadline=None)
@given(
    blocks=st.lists(block, min_size=1, max_size=4),
    which=st.integers(0, 3),
    at=st.integers(0, 10_000),
    flip=st.integers(1, 255),
    cut=st.booleans(),
)
def test_damaged_blocks_are_named_not_trusted(blocks, which, at, flip, cut):
    """A flipped byte or a cut block: either the bad block is reported, or (a flip that
    still makes valid snappy) the output is exactly what cramjam makes of the same bytes.
    Blocks before the damaged one decode as before, and nothing is written past the output's
    end (`_decode`)."""
    raw = [bytes(cramjam.snappy.compress_raw(b)) for b in blocks]
    b = which % len(raw)
    damaged = bytearray(raw[b])
    if cut:
        del damaged[at % len(damaged) :]
    else:
        damaged[at % len(damaged)] ^= flip
    raw[b] = bytes(damaged)
    sizes = [len(x) for x in blocks]  # the slots the index would give
    bad, out = _decode(raw, sizes)
    try:
        want = bytes(cramjam.snappy.decompress_raw(raw[b]))
    except Exception:  # cramjam refuses it too
        want = None
    if bad == -1:
        assert want is not None and out[b] == want and len(want) == sizes[b]
    else:
        assert bad == b
        assert out[:b] == blocks[:b]


@settings(max_examples=300, deadline=None)
@given(data=st.binary(min_size=1, max_size=400), size=st.integers(0, 2000))
def test_arbitrary_bytes_never_escape_their_slot(data, size):
    """Bytes that were never snappy, given a slot of any size: decoded only if cramjam reads
    them the same, else reported; nothing is written past the output's end (`_decode`)."""
    bad, out = _decode([data], [size])
    if bad == -1:
        assert bytes(cramjam.snappy.decompress_raw(data)) == out[0]
        assert len(out[0]) == size
    else:
        assert bad == 0


def test_a_slot_that_does_not_match_the_preamble_is_refused():
    raw = [bytes(cramjam.snappy.compress_raw(b"hello world" * 10))]
    assert _decode(raw, [109])[0] == 0
    assert _decode(raw, [111])[0] == 0
    assert _decode(raw, [110])[0] == -1

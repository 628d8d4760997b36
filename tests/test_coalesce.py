"""The bytes a span of pieces is fetched as: parts tile the span exactly within the part
size, the span reaches back to byte 0 for a file's first piece (its header rides along)
and one byte past a file's last piece, and what came back is refused unless it is exactly
as long as the index says."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from keygroups.compacted import Piece
from keygroups.errors import IntegrityError
from reader.coalesce import check_got, parts, span


@settings(max_examples=500, deadline=None)
@given(start=st.integers(0, 10_000), length=st.integers(1, 50_000), part=st.integers(1, 9_000))
def test_parts_tile_the_span_within_the_part_size(start, length, part):
    end = start + length
    got = parts(start, end, part)
    assert len(got) == math.ceil(length / part)
    assert got[0][0] == start and sum(n for _, n in got) == length
    assert all(0 < n <= part for _, n in got)
    assert all(a + n == b for (a, n), (b, _) in zip(got, got[1:]))


@st.composite
def files(draw):
    """A file's pieces back to back after its header, and a run of consecutive ones."""
    header = draw(st.integers(1, 200))
    lengths = draw(st.lists(st.integers(1, 3_000), min_size=1, max_size=8))
    offsets = [header + sum(lengths[:i]) for i in range(len(lengths))]
    size = header + sum(lengths)
    pieces = [Piece(i, 0, "f", o, n, 1, 0, 0, 0, header, size) for i, (o, n) in enumerate(zip(offsets, lengths))]
    a = draw(st.integers(0, len(pieces) - 1))
    z = draw(st.integers(a + 1, len(pieces)))
    return pieces[a:z], size


@settings(max_examples=300, deadline=None)
@given(case=files(), cut=st.integers(-3, 3))
def test_span_and_checked(case, cut):
    run, size = case
    data = bytes(i % 251 for i in range(size))
    start, end = span(run)
    assert start == (0 if run[0].offset == run[0].file_header else run[0].offset)
    assert end == run[-1].end + (run[-1].end == size)  # a byte past the end shows a longer object
    got = data[start : end + cut] if cut > 0 and end == size else data[start : min(end, size) + min(cut, 0)]
    want = run[-1].end - start
    if len(got) == want:
        assert check_got(got, start, run, "s3://b/f") == got
    else:
        with pytest.raises(IntegrityError, match="s3://b/f bytes"):
            check_got(got, start, run, "s3://b/f")


def test_an_object_longer_than_the_index_is_named() -> None:
    p = Piece(0, 0, "f", 10, 5, 1, 0, 0, 0, 10, 15)
    assert span([p]) == (0, 16)
    with pytest.raises(IntegrityError, match="longer than the 15 bytes"):
        check_got(bytes(16), 0, [p], "s3://b/f")
    with pytest.raises(IntegrityError, match="ends at byte 14"):
        check_got(bytes(14), 0, [p], "s3://b/f")

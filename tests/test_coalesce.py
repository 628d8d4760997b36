"""Coalesced ranged GETs: every piece is covered exactly by its run, runs merge only pieces
that lie back to back in one file, and parts tile runs within the part size."""

from __future__ import annotations

import math
from dataclasses import dataclass

from hypothesis import given, settings
from hypothesis import strategies as st

from reader.coalesce import runs


@dataclass(frozen=True)
class P:
    file: str
    offset: int
    length: int


@st.composite
def layouts(draw):
    """Pieces of a few files, each file's pieces back to back, read in an order that
    sometimes jumps between files."""
    pieces = []
    for f in range(draw(st.integers(1, 4))):
        offset = draw(st.integers(0, 100))
        for _ in range(draw(st.integers(1, 8))):
            n = draw(st.integers(1, 5_000))
            pieces.append(P(f"f{f}", offset, n))
            offset += n + draw(st.sampled_from([0, 0, 0, 7]))  # sometimes a gap (a piece not asked for)
    order = draw(st.permutations(range(len(pieces)))) if draw(st.booleans()) else list(range(len(pieces)))
    return [pieces[i] for i in order]


@settings(max_examples=500, deadline=None)
@given(pieces=layouts(), part=st.integers(1, 9_000), cap=st.none() | st.integers(1, 20_000))
def test_runs_cover_pieces_exactly_and_parts_tile_runs(pieces, part, cap):
    data = {f: bytes((i * 31 + len(f)) % 251 for i in range(40_000)) for f in {p.file for p in pieces}}
    got = runs(pieces, cap)
    assert [i for r in got for i in r.pieces] == list(range(len(pieces)))  # every piece once, in order
    for r in got:
        spans = [(pieces[i].offset, pieces[i].offset + pieces[i].length) for i in r.pieces]
        assert all(pieces[i].file == r.file for i in r.pieces)
        assert spans[0][0] == r.start and spans[-1][1] == r.end
        assert all(a[1] == b[0] for a, b in zip(spans, spans[1:]))  # back to back only
        assert cap is None or len(r.pieces) == 1 or r.end - r.start <= cap
        parts = r.parts(part)
        assert len(parts) == math.ceil((r.end - r.start) / part)
        assert parts[0][0] == r.start and sum(n for _, n in parts) == r.end - r.start
        assert all(n <= part for _, n in parts) and all(a + n == b for (a, n), (b, _) in zip(parts, parts[1:]))
        fetched = b"".join(data[r.file][a : a + n] for a, n in parts)
        for i in r.pieces:
            p = pieces[i]
            assert r.slice_of(fetched, p) == data[p.file][p.offset : p.offset + p.length]
    for a, b in zip(got, got[1:]):  # runs not merged could not have been
        first_of_b = pieces[b.pieces[0]]
        assert a.file != first_of_b.file or a.end != first_of_b.offset or cap is not None

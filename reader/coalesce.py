"""Ranged GETs for pieces: consecutive pieces of one segment file are fetched together, in
parts of a size object stores serve well (8-16 MiB), so a short slice costs a share of a GET
instead of a GET of its own. The Spark source plans its reads with `runs`; the replay's
`reader.fetch` builds the same runs incrementally, within its read-ahead budget. Both fetch
a run's `span` in `parts` and check what came back with `checked`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from keygroups.compacted import Piece
from keygroups.errors import IntegrityError


class PieceLike(Protocol):
    file: str
    offset: int
    length: int


@dataclass(frozen=True)
class Run:
    """Pieces that lie back to back in one file, fetched as one span of bytes."""

    file: str
    start: int
    end: int
    pieces: tuple[int, ...]  # their positions in the list given to `runs`

    def parts(self, part_bytes: int) -> list[tuple[int, int]]:
        """(start, length) of the ranged GETs that tile the run, none longer than part_bytes."""
        return parts(self.start, self.end, part_bytes)

    def slice_of(self, data: bytes, piece: PieceLike) -> bytes:
        """A piece's bytes out of the run's bytes."""
        return data[piece.offset - self.start : piece.offset - self.start + piece.length]


def parts(start: int, end: int, part_bytes: int) -> list[tuple[int, int]]:
    """(start, length) of the ranged GETs that tile bytes [start, end), none longer than part_bytes."""
    return [(a, min(part_bytes, end - a)) for a in range(start, end, part_bytes)]


def span(pieces: Sequence[Piece]) -> tuple[int, int]:
    """[start, end) of the bytes to GET for consecutive pieces of one file: from byte 0 when
    the first piece is the file's first, so the header rides along; one byte past the last
    piece when it ends the file, so an object longer than the index says shows."""
    first, last = pieces[0], pieces[-1]
    start = 0 if first.offset == first.file_header else first.offset
    return start, last.end + (last.end == last.file_bytes)


def checked(data: bytes, start: int, pieces: Sequence[Piece], url: str) -> bytes:
    """The bytes got for `span(pieces)` (from `start`), once their length proves the object
    is as long as the index says: no shorter (naming the first piece cut short), no longer
    (naming the last piece)."""
    want = pieces[-1].end - start
    if len(data) < want:
        p = next(q for q in pieces if q.end - start > len(data))
        raise IntegrityError(
            f"{p.where(url)}: the object ends at byte {start + len(data)}; the index says it has {p.file_bytes} bytes"
        )
    if len(data) > want:
        p = pieces[-1]
        raise IntegrityError(f"{p.where(url)}: the object is longer than the {p.file_bytes} bytes the index says")
    return data


def runs(pieces: Sequence[PieceLike], max_run_bytes: int | None = None) -> list[Run]:
    """Pieces, in the order they will be read, grouped into runs: a piece joins the previous
    run when it starts in the same file where that run ends (and the run stays within
    `max_run_bytes`, the read-ahead budget's share)."""
    out: list[Run] = []
    for i, p in enumerate(pieces):
        last = out[-1] if out else None
        if (
            last is not None
            and last.file == p.file
            and last.end == p.offset
            and (max_run_bytes is None or p.offset + p.length - last.start <= max_run_bytes)
        ):
            out[-1] = Run(last.file, last.start, p.offset + p.length, (*last.pieces, i))
        else:
            out.append(Run(p.file, p.offset, p.offset + p.length, (i,)))
    return out

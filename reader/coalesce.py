"""Ranged GETs for pieces: consecutive pieces of one segment file are fetched together as a
*span* of bytes, in parts of a size object stores serve well (8-16 MiB), so a short slice
costs a share of a GET instead of a GET of its own. `reader.fetch` chooses the spans within
its read-ahead budget; this module says which bytes to GET for one (`span`, `parts`) and
checks what came back (`check_got`).
"""

from __future__ import annotations

from collections.abc import Sequence

from keygroups.compacted import Piece
from keygroups.errors import IntegrityError


def parts(start: int, end: int, range_bytes: int) -> list[tuple[int, int]]:
    """(start, length) of the ranged GETs that tile bytes [start, end), none longer than range_bytes."""
    return [(a, min(range_bytes, end - a)) for a in range(start, end, range_bytes)]


def span(pieces: Sequence[Piece]) -> tuple[int, int]:
    """[start, end) of the bytes to GET for consecutive pieces of one file: from byte 0 when
    the first piece is the file's first, so the header rides along; one byte past the last
    piece when it ends the file, so an object longer than the index says shows."""
    first, last = pieces[0], pieces[-1]
    start = 0 if first.offset == first.file_header else first.offset
    return start, last.end + (last.end == last.file_bytes)


def check_got(data: bytes, start: int, pieces: Sequence[Piece], url: str) -> bytes:
    """The bytes got for `span(pieces)` (from `start`), once their length proves the object
    is as long as the index says."""
    check_length(len(data), start, pieces, url)
    return data


def check_length(got: int, start: int, pieces: Sequence[Piece], url: str) -> None:
    """`got` bytes came back for `span(pieces)` (from `start`): no fewer than the index says
    (naming the first piece cut short), no more (naming the last piece)."""
    want = pieces[-1].end - start
    if got < want:
        p = next(q for q in pieces if q.end - start > got)
        raise IntegrityError(
            f"{p.where(url)}: the object ends at byte {start + got}; the index says it has {p.file_bytes} bytes"
        )
    if got > want:
        p = pieces[-1]
        raise IntegrityError(f"{p.where(url)}: the object is longer than the {p.file_bytes} bytes the index says")

"""Ranged GETs for pieces: consecutive pieces of one segment file are fetched together, in
parts of a size object stores serve well (8-16 MiB), so a short slice costs a share of a GET
instead of a GET of its own. The Spark source plans its reads with `runs`; the replay's
`reader.fetch` builds the same runs incrementally, within its read-ahead budget.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol


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
        return [(a, min(part_bytes, self.end - a)) for a in range(self.start, self.end, part_bytes)]

    def slice_of(self, data: bytes, piece: PieceLike) -> bytes:
        """A piece's bytes out of the run's bytes."""
        return data[piece.offset - self.start : piece.offset - self.start + piece.length]


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

"""An Iceberg source's chunks: offset ranges of one partition, planned from where each data
file's rows lie (its extents), so a chunk reads only the files that overlap it and holds
about the target number of rows."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pyiceberg is imported where a table is opened
    from pyiceberg.types import IcebergType


@dataclass(frozen=True)
class DataFileBounds:
    """One data file and where its rows lie: partitions plo..phi, offsets olo..ohi."""

    index: int  # into IcebergSource._tasks
    plo: int
    phi: int
    olo: int
    ohi: int
    records: int
    size: int


def int_bound(column_type: IcebergType, raw: bytes) -> int:
    """A manifest's lower or upper bound of a data file's partition or offset column: an int
    or a long (`IcebergSource._check_schema` admits no other type)."""
    from pyiceberg.conversions import from_bytes
    from pyiceberg.types import PrimitiveType

    assert isinstance(column_type, PrimitiveType), column_type
    return int(from_bytes(column_type, raw))  # typed as giving any literal type; an int column's is an int


@dataclass(frozen=True)
class Extent:
    """The rows of one partition in one data file: offsets lo..hi, about `records` of them."""

    partition: int
    lo: int
    hi: int
    records: float
    size: float
    file: int


# A chunk as planned: partition, lo, hi, data files, estimated bytes.
Range = tuple[int, int, int, tuple[int, ...], float]
# An offset range of one group of overlapping extents: a, b, its extents, estimated rows and bytes.
_Piece = tuple[int, int, list[Extent], float, float]


def cut_ranges(extents: list[Extent], target: int) -> list[Range]:
    """(partition, lo, hi, data files, estimated bytes) per chunk: per partition, extents
    whose offset ranges overlap form a group (its rows can only be ordered together); groups
    of more than `target` rows are cut into equal offset ranges, each reading every file
    that overlaps it, and consecutive small groups are joined up to `target` rows."""
    out: list[Range] = []
    by_partition: dict[int, list[Extent]] = {}
    for e in extents:
        by_partition.setdefault(e.partition, []).append(e)
    for p, es in sorted(by_partition.items()):
        es.sort(key=lambda e: (e.lo, e.hi))
        groups: list[list[Extent]] = []
        highs: list[int] = []  # each group's highest offset
        for e in es:
            if groups and e.lo <= highs[-1]:
                groups[-1].append(e)
                highs[-1] = max(highs[-1], e.hi)
            else:
                groups.append([e])
                highs.append(e.hi)
        pieces: list[_Piece] = []
        for g, hi in zip(groups, highs):
            lo = g[0].lo
            records = sum(e.records for e in g)
            k = max(1, min(math.ceil(records / target), hi - lo + 1))
            width = -(-(hi - lo + 1) // k)
            for a in range(lo, hi + 1, width):
                b = min(hi, a + width - 1)
                inside = [e for e in g if e.lo <= b and e.hi >= a]
                share = [(min(b, e.hi) - max(a, e.lo) + 1) / (e.hi - e.lo + 1) for e in inside]
                pieces.append(
                    (
                        a,
                        b,
                        inside,
                        sum(e.records * s for e, s in zip(inside, share)),
                        sum(e.size * s for e, s in zip(inside, share)),
                    )
                )
        batch: list[_Piece] = []
        batch_records = 0.0
        for piece in pieces:
            if batch and (batch_records + piece[3] > target or len(batch) >= 256):
                out.append(_join(p, batch))
                batch, batch_records = [], 0.0
            batch.append(piece)
            batch_records += piece[3]
        if batch:
            out.append(_join(p, batch))
    return out


def _join(p: int, batch: list[_Piece]) -> Range:
    files = sorted({e.file for piece in batch for e in piece[2]})
    return p, batch[0][0], batch[-1][1], tuple(files), sum(piece[4] for piece in batch)

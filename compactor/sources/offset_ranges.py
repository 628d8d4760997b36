"""Chunks of a table source (Iceberg, Delta): offset ranges of one partition, planned from
where each data file's rows lie (its extents), so a chunk reads only the files that overlap
it and holds about the target number of rows; and the checks every chunk read makes (rows
inside the bounds planned with, no offset twice)."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from compactor.sources.base import SourceChunk
from keygroups.envelope import CorruptFile


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


# A data file's planned bounds: partitions plo..phi, offsets olo..ohi.
Bounds = tuple[int, int, int, int]
# A chunk's plan: partition, lo, hi, the data files it reads.
Planned = tuple[int, int, int, tuple[int, ...]]


def cut_chunks(
    extents: list[Extent], target: int, topic: str
) -> tuple[dict[int, Bounds], dict[str, Planned], list[SourceChunk]]:
    """Each data file's bounds, each chunk's plan by its key, and the chunks in (topic,
    partition, first offset) order, named `partition=<p>/offsets=<lo>-<hi>`."""
    bounds: dict[int, Bounds] = {}
    for e in extents:
        b = bounds.get(e.file, (e.partition, e.partition, e.lo, e.hi))
        bounds[e.file] = (min(b[0], e.partition), max(b[1], e.partition), min(b[2], e.lo), max(b[3], e.hi))
    plan: dict[str, Planned] = {}
    chunks = []
    for p, lo, hi, files, est_size in cut_ranges(extents, target):
        key = f"partition={p}/offsets={lo}-{hi}"
        plan[key] = (p, lo, hi, files)
        chunks.append(SourceChunk(key=key, topic=topic, partition=p, first_offset=lo, size=int(est_size)))
    chunks.sort(key=lambda c: (c.topic, c.partition, c.first_offset))
    return bounds, plan, chunks


def in_range(name: str, part: pa.Array, off: pa.Array, bounds: Bounds, p: int, lo: int, hi: int) -> pa.Array:
    """The mask of a data file's rows of partition p in lo..hi, after checking that every
    row lies inside the bounds the listing planned with (else a row could be missed by every
    chunk); `name` is the data file in errors."""
    if part.null_count or off.null_count:
        raise CorruptFile(f"{name}: {part.null_count + off.null_count} rows without a partition or an offset")
    plo, phi, olo, ohi = bounds
    pmin, pmax = pc.min_max(part).values()
    omin, omax = pc.min_max(off).values()
    if pmin.as_py() < plo or pmax.as_py() > phi or omin.as_py() < olo or omax.as_py() > ohi:
        raise CorruptFile(
            f"{name}: rows in partitions {pmin}..{pmax}, offsets {omin}..{omax}, outside the bounds its table "
            f"metadata or footer gives (partitions {plo}..{phi}, offsets {olo}..{ohi})"
        )
    return pc.and_(pc.equal(part, p), pc.and_(pc.greater_equal(off, lo), pc.less_equal(off, hi)))


def offset_order(
    offsets: np.ndarray, origin: np.ndarray, name_of: Callable[[int], str], p: int, lo: int, hi: int
) -> np.ndarray:
    """The order that sorts a chunk's rows by offset; two rows with one offset are refused,
    naming their data files (`origin`: each row's file index, `name_of` its name)."""
    order = np.argsort(offsets, kind="stable")
    ordered = offsets[order]
    dup = np.flatnonzero(ordered[1:] == ordered[:-1])
    if dup.size:
        files_at = origin[order]
        names = sorted({name_of(int(files_at[dup[0]])), name_of(int(files_at[dup[0] + 1]))})
        raise CorruptFile(
            f"{' and '.join(names)}: partition {p} offset {int(ordered[dup[0]])} appears more than once "
            f"({dup.size} duplicate row(s) in offsets {lo}..{hi})"
        )
    return order

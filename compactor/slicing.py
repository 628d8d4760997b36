"""Cutting an archive into event-time slices without breaking any partition's offset order.

Slice s ends at `(base + s + 1) * duration` ms since the epoch. A record belongs to the
slice in which its partition's *running maximum* timestamp (over all earlier offsets and
itself) falls. The running maximum never decreases along a partition, so each slice is a
contiguous offset range of every partition, and a record that lands in a later slice with
a small timestamp was already below its own partition's maximum: late in the original
order too (DESIGN.md, invariant 3).

Tasks see one chunk at a time. The running maximum of a chunk's records is the larger of
the chunk's own running maximum and the maximum of all earlier chunks of the partition (its
`prefix_max`), which the driver knows from the statistics pass.

Sealing: a slice is published only once no later source record can belong to it. A later
record of partition p lands at or after the slice of p's running maximum so far, so slices
before the earliest of those slices over all partitions (the *seal*) are complete. Records
from the seal on are left for a later compaction, and the hand-off offsets point at each
partition's first one, so a live consumer (or the next append) starts exactly there: a
lagging partition can never deliver a record into a slice whose watermark was emitted.
`seal_all` publishes every slice instead (a topic that will not grow).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import numpy as np

from keygroups.compacted import PartitionRange
from keygroups.errors import KeyfillError, OptionError

NO_PREFIX = np.iinfo(np.int64).min
_UNITS = {"ms": 1, "s": 1000, "m": 60_000, "min": 60_000, "h": 3_600_000, "d": 86_400_000}


def parse_duration(text: str) -> int:
    """'10m', '1h', '90s', '500ms', '1d' -> milliseconds."""
    m = re.fullmatch(r"\s*(\d+)\s*(ms|s|min|m|h|d)\s*", text)
    if not m or int(m[1]) == 0:
        raise OptionError(f"--slice-duration {text!r}: expected a positive duration like 500ms, 90s, 10m, 1h, 1d")
    return int(m[1]) * _UNITS[m[2]]


@dataclass(frozen=True)
class Run:
    """Consecutive records of a chunk whose chunk-local running maximum is in one slice."""

    local_slice: int  # floor(chunk-local running max / duration)
    first_offset: int
    last_offset: int
    records: int
    min_timestamp: int
    max_timestamp: int


@dataclass
class ChunkStats:
    """What the statistics pass measured about one chunk."""

    key: str
    topic: str
    partition: int
    first_offset: int
    last_offset: int
    records: int
    min_timestamp: int
    max_timestamp: int
    runs: list[Run]


def chunk_runs(offsets: np.ndarray, ts: np.ndarray, duration_ms: int) -> list[Run]:
    runmax = np.maximum.accumulate(ts)
    local = runmax // duration_ms
    cuts = np.flatnonzero(np.diff(local)) + 1
    starts = np.concatenate([[0], cuts])
    ends = np.concatenate([cuts, [len(ts)]])
    return [
        Run(
            local_slice=int(local[a]),
            first_offset=int(offsets[a]),
            last_offset=int(offsets[b - 1]),
            records=int(b - a),
            min_timestamp=int(ts[a:b].min()),
            max_timestamp=int(ts[a:b].max()),
        )
        for a, b in zip(starts.tolist(), ends.tolist())
    ]


def record_slices(ts: np.ndarray, prefix_max: int, duration_ms: int, base: int) -> tuple[np.ndarray, np.ndarray]:
    """(slice index, running max) per record of one chunk, in offset order."""
    runmax = np.maximum.accumulate(ts)
    if prefix_max != NO_PREFIX:
        np.maximum(runmax, prefix_max, out=runmax)
    return (runmax // duration_ms - base).astype(np.int32), runmax


class SlicingError(KeyfillError, ValueError):
    """Chunks of a partition overlap, or leave a gap where none is allowed."""


@dataclass
class SlicePlan:
    duration_ms: int
    base: int  # absolute slice number of slice 0
    slices: int
    prefix_max: dict[str, int]  # chunk key -> max timestamp of the partition's earlier chunks
    ranges: dict[int, list[PartitionRange]]  # slice -> partition ranges, by partition
    handoff: dict[int, int]  # partition -> first offset not in the archive
    gaps: list[str] = field(default_factory=list)
    running_max: dict[int, int] = field(default_factory=dict)  # partition -> max timestamp below its hand-off
    withheld: int = 0  # records of unsealed slices, left for a later compaction

    def bounds(self, s: int) -> tuple[int, int]:
        return (self.base + s) * self.duration_ms, (self.base + s + 1) * self.duration_ms


def plan_slices(
    chunks: list[ChunkStats],
    duration_ms: int,
    *,
    allow_gaps: bool = False,
    seal_all: bool = False,
    name=lambda key: key,
) -> SlicePlan:
    """Slice boundaries, per-slice partition ranges and each chunk's prefix max, from the
    statistics pass alone: the sealed slices only, unless `seal_all`. `name` turns a chunk
    key into a URL for error messages."""
    by_partition: dict[int, list[ChunkStats]] = {}
    for c in chunks:
        by_partition.setdefault(c.partition, []).append(c)
    prefix: dict[str, int] = {}
    per_slice: dict[int, dict[int, list[Run]]] = {}  # absolute slice -> partition -> runs
    gaps: list[str] = []
    handoff: dict[int, int] = {}
    final_max: dict[int, int] = {}
    for p, cs in sorted(by_partition.items()):
        cs.sort(key=lambda c: c.first_offset)
        running = NO_PREFIX
        for prev, cur in zip([None, *cs], cs):
            if prev is not None:
                if cur.first_offset <= prev.last_offset:
                    raise SlicingError(
                        f"{name(cur.key)}: offsets {cur.first_offset}..{cur.last_offset} overlap "
                        f"{name(prev.key)} ({prev.first_offset}..{prev.last_offset})"
                    )
                if cur.first_offset != prev.last_offset + 1:
                    gap = (
                        f"partition {p}: offsets {prev.last_offset + 1}..{cur.first_offset - 1} missing "
                        f"between {name(prev.key)} and {name(cur.key)}"
                    )
                    if not allow_gaps:
                        raise SlicingError(gap + " (pass --allow-gaps if the topic is compacted)")
                    gaps.append(gap)
            prefix[cur.key] = running
            floor_slice = None if running == NO_PREFIX else running // duration_ms
            for run in cur.runs:
                s = run.local_slice if floor_slice is None else max(run.local_slice, floor_slice)
                per_slice.setdefault(s, {}).setdefault(p, []).append(run)
            running = max(running, cur.max_timestamp)
        handoff[p] = cs[-1].last_offset + 1
        final_max[p] = running

    if not per_slice:
        raise SlicingError("the source archive holds no records")
    base = min(per_slice)
    seal = max(per_slice) + 1 if seal_all else min(m // duration_ms for m in final_max.values())
    if seal <= base:
        lagging = min(final_max, key=lambda p: final_max[p])
        raise SlicingError(
            f"no slice is sealed yet: partition {lagging}'s running maximum is still in the first slice "
            f"(starting {base * duration_ms} ms), so a later record could belong to it. Compact when more data has "
            "arrived, use a shorter --slice-duration, or pass --seal-all if the topic will not grow"
        )
    withheld = 0
    for s in [s for s in per_slice if s >= seal]:
        for p, runs in per_slice.pop(s).items():
            handoff[p] = min(handoff[p], runs[0].first_offset)
            withheld += sum(r.records for r in runs)
    ranges: dict[int, list[PartitionRange]] = {}
    for s, parts in per_slice.items():
        ranges[s - base] = [
            PartitionRange(
                partition=p,
                first_offset=runs[0].first_offset,
                last_offset=runs[-1].last_offset,
                records=sum(r.records for r in runs),
                min_timestamp=min(r.min_timestamp for r in runs),
                max_timestamp=max(r.max_timestamp for r in runs),
            )
            for p, runs in sorted(parts.items())
        ]
    running_max: dict[int, int] = {}
    for rs in ranges.values():
        for r in rs:
            running_max[r.partition] = max(running_max.get(r.partition, NO_PREFIX), r.max_timestamp)
    return SlicePlan(
        duration_ms=duration_ms,
        base=base,
        slices=seal - base,
        prefix_max=prefix,
        ranges=ranges,
        handoff=handoff,
        gaps=gaps,
        running_max=running_max,
        withheld=withheld,
    )

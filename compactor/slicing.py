"""Cutting an archive into event-time slices without breaking any partition's offset order.

Slice s ends at `(base + s + 1) * duration` ms since the epoch. A record belongs to the
slice in which its partition's *running maximum* timestamp (over all earlier offsets and
itself) falls. The running maximum never decreases along a partition, so each slice is a
contiguous offset range of every partition, and a record that lands in a later slice with
a small timestamp was already below its own partition's maximum: late in the original
order too (docs/design.md, invariant 3).

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

Idle partitions: a partition whose running maximum is more than `idle_after` behind the
newest partition's does not hold the seal back (Flink's idleness, decided on event time so
equal input gives equal archives). When such a partition later delivers records whose
running maximum falls in a slice already published, an append places them in its first
slice: they are *made late* (their timestamps are behind the watermark already emitted),
counted by the compaction and checked by verify. Without `idle_after` no record is ever
made late, and an idle partition holds the seal until it moves.

Appends (`Continuation`): the next compaction reads each partition from its hand-off on and
continues its running maximum, so sealed slices come out exactly as if the grown source had
been compacted at once (docs/design.md, invariant 7).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from compactor.errors import NothingSealed, SlicingError
from keygroups.compacted import PartitionRange

NO_PREFIX = np.iinfo(np.int64).min


@dataclass(frozen=True)
class Stretch:
    """Consecutive records of a chunk whose chunk-local running maximum is in one slice."""

    local_slice: int  # floor(chunk-local running max / duration)
    first_offset: int
    last_offset: int
    records: int
    min_timestamp: int
    max_timestamp: int
    # the stretch's last record: what an append checks if it is the last one archived (compactor.history)
    last_timestamp: int | None = None
    last_digest: str | None = None


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
    stretches: list[Stretch]


def chunk_stretches(
    offsets: np.ndarray, ts: np.ndarray, duration_ms: int, digests: Callable[[list[int]], list[str]] | None = None
) -> list[Stretch]:
    """The chunk's stretches; `digests`: the digests of the records at these row numbers (each
    stretch's last record: a partition's last published record is always one, see plan_slices)."""
    runmax = np.maximum.accumulate(ts)
    local = runmax // duration_ms
    cuts = np.flatnonzero(np.diff(local)) + 1
    starts = np.concatenate([[0], cuts]).tolist()
    ends = np.concatenate([cuts, [len(ts)]]).tolist()
    lasts = [b - 1 for b in ends]
    digest = digests(lasts) if digests is not None else [None] * len(lasts)
    return [
        Stretch(
            local_slice=int(local[a]),
            first_offset=int(offsets[a]),
            last_offset=int(offsets[b - 1]),
            records=int(b - a),
            min_timestamp=int(ts[a:b].min()),
            max_timestamp=int(ts[a:b].max()),
            last_timestamp=int(ts[b - 1]),
            last_digest=d,
        )
        for a, b, d in zip(starts, ends, digest)
    ]


def record_slices(ts: np.ndarray, prefix_max: int, duration_ms: int, base: int) -> tuple[np.ndarray, np.ndarray]:
    """(slice index, running max) per record of one chunk, in offset order."""
    runmax = np.maximum.accumulate(ts)
    if prefix_max != NO_PREFIX:
        np.maximum(runmax, prefix_max, out=runmax)
    return (runmax // duration_ms - base).astype(np.int32), runmax


@dataclass(frozen=True)
class Continuation:
    """What an append continues from: the parent version's slice grid, its published slice
    count (the append's first slice) and, per partition, its hand-off offset and the
    running maximum of the records below it."""

    base: int
    slices: int
    handoff: dict[int, int]
    running_max: dict[int, int]


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
    withheld_by_partition: dict[int, int] = field(default_factory=dict)  # the same, per partition
    first: int = 0  # the first slice this plan publishes (an append's: the parent's slice count)
    made_late: int = 0  # records of idle partitions placed after their own running maximum's slice
    idle: list[int] = field(default_factory=list)  # partitions that did not hold the seal back
    # partition -> the stretch holding its last published record (that record is the stretch's last)
    last_stretches: dict[int, Stretch] = field(default_factory=dict)
    seal_holder: int | None = None  # the partition whose running maximum set the seal (None: seal_all)

    def bounds(self, s: int) -> tuple[int, int]:
        return (self.base + s) * self.duration_ms, (self.base + s + 1) * self.duration_ms


def plan_slices(
    chunks: list[ChunkStats],
    duration_ms: int,
    *,
    allow_gaps: bool = False,
    expect_gaps: bool = False,
    seal_all: bool = False,
    idle_after_ms: int | None = None,
    after: Continuation | None = None,
    name: Callable[[str], str] = lambda key: key,
) -> SlicePlan:
    """Slice boundaries, per-slice partition ranges and each chunk's prefix max, from the
    statistics pass alone: the sealed slices only, unless `seal_all`. With `after`, the
    chunks hold each partition's records from its hand-off on, and the plan publishes the
    slices from `after.slices` on. `expect_gaps`: the source's offsets skip by nature (Kafka
    segments: transaction markers, aborted data), so gaps between chunks are neither errors
    nor recorded. `name` turns a chunk key into a URL for error messages."""
    by_partition: dict[int, list[ChunkStats]] = {p: [] for p in (after.handoff if after else {})}
    for c in chunks:
        by_partition.setdefault(c.partition, []).append(c)
    first = after.slices if after else 0
    # An append places nothing before its first slice: records whose running maximum is behind
    # it (an idle partition's, or a new partition's) are lifted into it, made late.
    floor = (after.base + after.slices) * duration_ms if after else NO_PREFIX
    prefix: dict[str, int] = {}
    per_slice: dict[int, dict[int, list[Stretch]]] = {}  # absolute slice -> partition -> stretches
    gaps: list[str] = []
    handoff: dict[int, int] = {}
    final_max: dict[int, int] = {}
    made_late = 0
    for p, cs in sorted(by_partition.items()):
        cs.sort(key=lambda c: c.first_offset)
        true_max = after.running_max.get(p, NO_PREFIX) if after else NO_PREFIX
        start = after.handoff.get(p) if after else None
        for prev, cur in zip([None, *cs], cs):
            gap = _gap_before(p, prev, cur, start, name)
            if gap is not None and not expect_gaps:
                if not allow_gaps:
                    raise SlicingError(gap + " (pass --allow-gaps if the topic is compacted)")
                gaps.append(gap)
            running = max(true_max, floor)
            prefix[cur.key] = running
            floor_slice = None if running == NO_PREFIX else running // duration_ms
            true_slice = None if true_max == NO_PREFIX else true_max // duration_ms
            for stretch in cur.stretches:
                s = stretch.local_slice if floor_slice is None else max(stretch.local_slice, floor_slice)
                if after and (stretch.local_slice if true_slice is None else max(stretch.local_slice, true_slice)) < s:
                    made_late += stretch.records  # its own running maximum is in a published slice
                per_slice.setdefault(s, {}).setdefault(p, []).append(stretch)
            true_max = max(true_max, cur.max_timestamp)
        # no chunks: a partition of the archive's (`after`), at its hand-off
        handoff[p] = cs[-1].last_offset + 1 if cs or after is None else after.handoff[p]
        final_max[p] = max(true_max, floor)

    if not per_slice and not after:
        raise SlicingError("the source archive holds no records")
    base = after.base if after else min(per_slice)
    seal, lagging, idle = _seal(per_slice, final_max, duration_ms, base, first, seal_all, idle_after_ms, after)
    withheld: dict[int, int] = {}
    for s in [s for s in per_slice if s >= seal]:
        for p, stretches in per_slice.pop(s).items():
            handoff[p] = min(handoff[p], stretches[0].first_offset)
            withheld[p] = withheld.get(p, 0) + sum(r.records for r in stretches)
    ranges = {s - base: _ranges(parts) for s, parts in per_slice.items()}
    running_max: dict[int, int] = dict(after.running_max) if after else {}
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
        withheld=sum(withheld.values()),
        withheld_by_partition=dict(sorted(withheld.items())),
        first=first,
        made_late=made_late,
        idle=idle,
        last_stretches=_last_stretches(per_slice),
        seal_holder=None if seal_all else lagging,
    )


def _gap_before(
    p: int, prev: ChunkStats | None, cur: ChunkStats, start: int | None, name: Callable[[str], str]
) -> str | None:
    """What is missing between chunk `cur` and the one before it in partition p (`prev`, or
    with none the archive's hand-off `start`), or None; SlicingError if they overlap."""
    prev_last = prev.last_offset if prev is not None else (None if start is None else start - 1)
    if prev_last is None or cur.first_offset == prev_last + 1:
        return None
    prev_name = name(prev.key) if prev is not None else f"the archive's hand-off ({start})"
    if cur.first_offset <= prev_last:
        raise SlicingError(
            f"{name(cur.key)}: offsets {cur.first_offset}..{cur.last_offset} overlap {prev_name}"
            + (f" ({prev.first_offset}..{prev.last_offset})" if prev is not None else "")
        )
    missing = f"{prev_last + 1}..{cur.first_offset - 1}"
    return f"partition {p}: offsets {missing} missing between {prev_name} and {name(cur.key)}"


def _seal(
    per_slice: dict[int, dict[int, list[Stretch]]],
    final_max: dict[int, int],
    duration_ms: int,
    base: int,
    first: int,
    seal_all: bool,
    idle_after_ms: int | None,
    after: Continuation | None,
) -> tuple[int, int, list[int]]:
    """The first slice not sealed (absolute), the partition whose running maximum holds it
    there, and the partitions declared idle; NothingSealed if no new slice is sealed."""
    newest = max(final_max.values())
    idle = sorted(p for p, m in final_max.items() if idle_after_ms is not None and m < newest - idle_after_ms)
    holding = {p: m for p, m in final_max.items() if p not in idle}
    lagging = min(holding, key=lambda p: holding[p])  # the partition whose running maximum sets the seal
    if seal_all:
        seal = max([*per_slice, base + first - 1]) + 1
    else:
        seal = min(m // duration_ms for m in holding.values())
    if seal > base + first:
        return seal, lagging, idle
    if after:
        raise NothingSealed(
            f"no new slice is sealed: partition {lagging}'s running maximum is still in the archive's next slice "
            f"(starting {(base + first) * duration_ms} ms), so a later record could belong to it. Append when "
            "more data has arrived, declare quiet partitions idle with --idle-after, or pass --seal-all if the "
            "topic will not grow"
        )
    raise NothingSealed(
        f"no slice is sealed yet: partition {lagging}'s running maximum is still in the first slice "
        f"(starting {base * duration_ms} ms), so a later record could belong to it. Compact when more data has "
        "arrived, use a shorter --slice-duration, declare quiet partitions idle with --idle-after, or pass "
        "--seal-all if the topic will not grow"
    )


def _ranges(parts: dict[int, list[Stretch]]) -> list[PartitionRange]:
    """A published slice's range of each partition, from its stretches."""
    return [
        PartitionRange(
            partition=p,
            first_offset=stretches[0].first_offset,
            last_offset=stretches[-1].last_offset,
            records=sum(r.records for r in stretches),
            min_timestamp=min(r.min_timestamp for r in stretches),
            max_timestamp=max(r.max_timestamp for r in stretches),
        )
        for p, stretches in sorted(parts.items())
    ]


def _last_stretches(per_slice: dict[int, dict[int, list[Stretch]]]) -> dict[int, Stretch]:
    """Each partition's last published stretch. A partition's published records end where its
    first withheld stretch starts, and a stretch is withheld or published whole: its last
    published record is the last of a stretch."""
    last: dict[int, Stretch] = {}
    for parts in per_slice.values():
        for p, stretches in parts.items():
            if p not in last or stretches[-1].last_offset > last[p].last_offset:
                last[p] = stretches[-1]
    return last

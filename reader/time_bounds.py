"""Backfills bounded in time, with the meaning Spark's Kafka source gives its options, so a
bounded read delivers exactly the records the Kafka source would deliver on the same topic:

- `startingTimestamp` T: per partition, from the first offset whose timestamp is at or after T
  (and every offset after it, whatever its timestamp);
- `endingTimestamp` E: up to, not including, the first offset whose timestamp is at or after E;
- the `...OffsetsByTimestamp` forms: a time per partition.

Why the slice index answers this without reading the archive: a record sits in the slice of
its partition's running maximum timestamp, and the first offset whose timestamp is at or after
T is exactly where that running maximum first reaches T. So in partition p every slice before
the slice holding T is out, every slice after it is in, and only in the slice holding T does
the index's per-partition range (`min_timestamp`, `max_timestamp`) sometimes not settle it:
then that slice's pieces are read once, at planning, and the offset taken from the records.
Running maxima of the delivered records are the archive's own, so a bounded read keeps the
no-new-lateness guarantee (docs/design.md, invariant 3).

A partition whose records all stay below T within the archive has its offset past the
hand-off: the live phase asks the broker for it (`offsets_for_times`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from keygroups import compacted, handoff
from keygroups.errors import OptionError
from keygroups.piece_index import PieceIndex, piece_list

SCAN_SLICES = 1024  # slice rows read at a time while looking for a partition's next records


@dataclass(frozen=True)
class ScanReads:
    """How the planning read of a straddled slice fetches: the reader's own settings."""

    read_ahead_bytes: int
    range_bytes: int


@dataclass(frozen=True)
class OffsetBounds:
    """Per partition, the offsets [start, end) a bounded read delivers, and the slices of
    this archive version that can hold them."""

    first_slice: int
    end_slice: int
    starts: dict[int, int] = field(default_factory=dict)  # absent: from the partition's first record
    ends: dict[int, int] = field(default_factory=dict)  # absent: no end within the archive
    # partitions whose first (or last) offset lies past the hand-off: the time to ask the broker
    live_starts_ms: dict[int, int] = field(default_factory=dict)
    live_ends_ms: dict[int, int] = field(default_factory=dict)
    # only slices before cut_until or from cut_from on can hold records out of range
    cut_until: int = 0
    cut_from: int = 1 << 62

    def cuts(self, s: int) -> bool:
        """Slice s may hold records out of range: its records need `keep`."""
        return s < self.cut_until or s >= self.cut_from

    def keep(self, partition: np.ndarray, offset: np.ndarray) -> np.ndarray | None:
        """Which of these records are in range (None: all of them)."""
        mask = None
        for bound, inside in ((self.starts, np.greater_equal), (self.ends, np.less)):
            if not bound:
                continue
            ps = np.fromiter(bound, np.int64, len(bound))
            limits = np.fromiter(bound.values(), np.int64, len(bound))
            order = np.argsort(ps)
            at = np.searchsorted(ps[order], partition).clip(0, len(ps) - 1)
            named = ps[order][at] == partition
            ok = ~named | inside(offset, limits[order][at])
            mask = ok if mask is None else mask & ok
        return mask

    def filter(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        """The batch's records in range."""
        keep = self.keep(batch.column("partition").to_numpy(), batch.column("offset").to_numpy())
        return batch if keep is None else batch.filter(keep)

    def ends_in_archive(self, partitions: Iterable[int]) -> bool:
        """Every partition ends before the hand-off: the read stops with the archive."""
        return all(p in self.ends and p not in self.live_ends_ms for p in partitions)


def partition_times(
    name: str, single: int | None, per: dict[str, dict[int, int]] | None, topic: str, partitions: list[int]
) -> dict[int, int] | None:
    """Partition -> time in ms, from one time for all (`single`, which takes precedence, as in
    Spark's Kafka source) or `{"topic": {partition: ms}}` naming every partition."""
    if single is not None:
        return dict.fromkeys(partitions, single)
    if per is None:
        return None
    ((named, times),) = per.items()
    if named != topic:
        raise OptionError(f"option {name} names topic {named!r}, but the archive holds {topic!r}")
    missing = [p for p in partitions if p not in times]
    if missing:  # as the Kafka source: every partition, so none is read from an unintended place
        raise OptionError(
            f"option {name} must give a time for every partition of {topic}; missing: {', '.join(map(str, missing))}"
        )
    return dict(times)


def first_offsets_at(
    index: PieceIndex, manifest: compacted.Manifest, times: Mapping[int, int], reads: ScanReads
) -> dict[int, tuple[int, int]]:
    """Partition -> (offset, slice) of its first record whose timestamp is at or after its
    time in `times`; a partition whose records within the archive all stay below it is left out."""
    d, base, slices = manifest.slice_duration_ms, manifest.base, manifest.slices
    holding = {p: min(max(t // d - base, -1), slices) for p, t in times.items()}  # the slice holding t
    pending = {p for p, s in holding.items() if s < slices}
    found: dict[int, tuple[int, int]] = {}
    unsettled: dict[int, list[int]] = {}  # slice -> partitions whose offset only its records tell
    at = max(0, min((holding[p] for p in pending), default=slices))
    while pending and at < slices:
        end = min(slices, at + SCAN_SLICES)
        rows = index.slice_rows(at, end, ["slice", "partitions"])
        lists = rows.column("partitions").combine_chunks()
        entries = pc.list_flatten(lists)
        owner = np.asarray(rows.column("slice").to_numpy())[pc.list_parent_indices(lists).to_numpy()]
        cols = {k: entries.field(k).to_numpy() for k in ("partition", "first_offset", "min_timestamp", "max_timestamp")}
        for i in range(len(owner)):  # entries in slice order: each partition's first fitting one settles it
            p = int(cols["partition"][i])
            if p not in pending or owner[i] < holding[p]:
                continue
            s, t = int(owner[i]), times[p]
            if s > holding[p] or cols["min_timestamp"][i] >= t:
                found[p] = (int(cols["first_offset"][i]), s)
            elif cols["max_timestamp"][i] < t:
                continue  # none of this slice's records reach t: the next slice with p settles it
            else:
                unsettled.setdefault(s, []).append(p)
            pending.discard(p)
        at = end
    for s, parts in unsettled.items():
        found |= _scan(index, s, {p: times[p] for p in parts}, reads)
    return found


def _scan(index: PieceIndex, s: int, times: dict[int, int], reads: ScanReads) -> dict[int, tuple[int, int]]:
    """The first offsets at or after each partition's time among slice s's records."""
    from reader.fetch import (
        read_groups,  # the decoder, loaded only when planning scans a slice (reader.spark.split_reader)
    )

    best: dict[int, int] = {}
    pieces = piece_list(index.piece_rows(s, s + 1))
    steps = read_groups(
        index.store, pieces, read_ahead_bytes=reads.read_ahead_bytes, range_bytes=reads.range_bytes, headers=False
    )
    for _, batch in steps:
        partition = batch.column("partition").to_numpy()
        ts = batch.column("timestamp").cast(pa.int64()).to_numpy()
        offsets = batch.column("offset").to_numpy()
        for p, t in times.items():  # the few partitions the index left unsettled
            hit = offsets[(partition == p) & (ts >= t)]
            if len(hit):
                best[p] = min(best.get(p, int(hit.min())), int(hit.min()))
    return {p: (o, s) for p, o in best.items()}


def offset_bounds(
    index: PieceIndex,
    manifest: compacted.Manifest,
    reads: ScanReads,
    starting_ms: Mapping[int, int] | None = None,
    ending_ms: Mapping[int, int] | None = None,
) -> OffsetBounds:
    """The records a read bounded by per-partition start and end times delivers."""
    hand = handoff.offsets(manifest)
    bounds = {"first_slice": 0, "end_slice": manifest.slices, "cut_until": 0, "cut_from": 1 << 62}
    starts, ends, live_starts, live_ends = {}, {}, {}, {}
    if starting_ms:
        found = first_offsets_at(index, manifest, starting_ms, reads)
        for p, t in starting_ms.items():
            if p in found:
                starts[p] = found[p][0]
            else:  # nothing of p from the archive: the live phase asks the broker
                starts[p] = hand.get(p, 0)
                live_starts[p] = t
        bounds["first_slice"] = min((s for _, s in found.values()), default=manifest.slices)
        # a partition read from the broker only has all its archived records out
        bounds["cut_until"] = manifest.slices if live_starts else max((s + 1 for _, s in found.values()), default=0)
    if ending_ms:
        found = first_offsets_at(index, manifest, ending_ms, reads)
        for p, t in ending_ms.items():
            if p in found:
                ends[p] = found[p][0]
            else:
                live_ends[p] = t
        bounds["cut_from"] = min((s for _, s in found.values()), default=1 << 62)
        if not live_ends and set(ending_ms) >= set(hand):  # every partition ends within the archive
            bounds["end_slice"] = max((s + 1 for _, s in found.values()), default=0)
    bounds["end_slice"] = max(bounds["end_slice"], bounds["first_slice"])
    return OffsetBounds(**bounds, starts=starts, ends=ends, live_starts_ms=live_starts, live_ends_ms=live_ends)

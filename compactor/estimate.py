"""`keyfill plan`: what a compaction would produce, from the statistics pass alone, before
any byte is rewritten, and what to change when it looks wrong.

Exact from the statistics: the slice length (derived or given), slices and empty slices,
records published and held back (and the partition holding the seal), keys, groups and
their balance. Estimated: pieces (at most one per group with records in a slice, and never
more than the slice's records), files (each group's payload over the target size, scaled by
the source's compression), the archive's size (the source's bytes plus `PIECE_OVERHEAD` per
piece: a piece's Avro block framing and sync marker and its index row), GETs per GB and
micro-batches of the Spark source at its default trigger (`compacted.TRIGGER_BYTES`).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from compactor import slice_length
from compactor.config import Analysis, Prepared
from keygroups import compacted
from keygroups.assignment import assignment_keys

PIECE_OVERHEAD = 40  # bytes per piece beyond its records: block count and size, sync marker, index row
SHORT_PIECE_RECORDS = 50  # pieces this small on average: blocks compress badly, planning costs per piece


@dataclass
class Estimate:
    source: str
    dest: str
    groups: int
    slice_duration: str
    derived: bool  # the slice length was derived (no --slice-duration)
    slices: int
    empty_slices: int
    records: int  # published
    held_back: int
    held_back_share: float
    seal_holder: int | None
    keys: int
    payload_bytes: int
    source_bytes: int
    pieces: int  # at most
    files: int
    archive_bytes: int  # estimate
    gets_per_gb: float
    micro_batches: int  # of the Spark source at its default trigger
    group_balance: float  # largest group's payload / mean
    recommendations: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def estimate(prepared: Prepared, analysis: Analysis) -> Estimate:
    """The plan of `analysis` (compactor.job.analyse of `prepared`)."""
    cfg, plan, groups = analysis.cfg, analysis.plan, analysis.groups
    assert cfg.slice_duration is not None  # analyse chose it, when not given
    per_slice = np.zeros(max(plan.slices, 1), np.int64)
    for s, ranges in plan.ranges.items():
        per_slice[s] = sum(r.records for r in ranges)
    per_slice = per_slice[plan.first : plan.slices]
    records = int(per_slice.sum())
    payload = analysis.stats.payload
    source_bytes = sum(c.size for c in prepared.chunks)
    ratio = source_bytes / payload if payload else 1.0  # the source's compression, applied to the estimate
    per_record = payload / max(records + plan.withheld, 1)
    pieces = int(np.minimum(per_slice, groups).sum())
    loads = np.bincount(
        analysis.assignment.column("group").to_numpy(),
        weights=analysis.assignment.column("bytes").to_numpy(),
        minlength=groups,
    )
    file_sizes = []
    for load in (loads * ratio).tolist():
        n = max(1, -(-int(load) // cfg.target_file_bytes))
        file_sizes += [int(load) // n] * n
    archive = int(records * per_record * ratio) + pieces * PIECE_OVERHEAD
    batches, room = 0, 0
    for b in (per_slice[per_slice > 0] * per_record * ratio).tolist():
        if batches == 0 or room + b > compacted.TRIGGER_BYTES:
            batches, room = batches + 1, 0
        room += b
    share = plan.withheld / max(records + plan.withheld, 1)
    est = Estimate(
        source=prepared.source.url,
        dest=prepared.dest.url,
        groups=groups,
        slice_duration=cfg.slice_duration,
        derived=prepared.cfg.slice_duration is None,
        slices=plan.slices - plan.first,
        empty_slices=int((per_slice == 0).sum()),
        records=records,
        held_back=plan.withheld,
        held_back_share=share,
        seal_holder=plan.seal_holder,
        keys=assignment_keys(analysis.assignment),
        payload_bytes=payload,
        source_bytes=source_bytes,
        pieces=pieces,
        files=len(file_sizes),
        archive_bytes=archive,
        gets_per_gb=compacted.replay_gets(file_sizes) / max(sum(file_sizes) / 1e9, 1e-9),
        micro_batches=batches,
        group_balance=float(loads.max() / loads.mean()) if loads.sum() else 1.0,
    )
    est.recommendations = _recommend(
        est, slice_length.derive(payload, slice_length.extent_ms_of(analysis.stats.chunks), groups)
    )
    return est


def _recommend(e: Estimate, derived: str) -> list[str]:
    """What to change, in words: the slice length, held-back records, balance, trigger size."""
    out = []
    if e.pieces and e.records / e.pieces < SHORT_PIECE_RECORDS:
        if derived != e.slice_duration:
            out.append(
                f"slices are short for this archive (about {e.records / e.pieces:.0f} records a piece): "
                f"--slice-duration {derived} (what the default derives) makes fewer, larger pieces"
            )
    if e.held_back_share > 0.05:
        out.append(
            f"{e.held_back_share:.0%} of the records would be held back (partition {e.seal_holder} holds the seal): "
            "--idle-after for quiet partitions, or --seal-all if the topic will not grow"
        )
    if e.group_balance > 1.5:
        out.append(
            f"the largest group holds {e.group_balance:.2f}x the mean: a few hot keys outweigh a group's share; "
            "fewer --groups balance better, more cannot split a key"
        )
    if e.micro_batches > 1000:
        out.append(
            f"{e.micro_batches:,} micro-batches at the default trigger: raise maxBytesPerTrigger in the Spark job"
        )
    return out or ["nothing to change"]

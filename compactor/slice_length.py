"""The slice length when `--slice-duration` is not given: derived from the statistics.

A slice is the watermark step and the unit of the barrier; each (slice, group) is a piece
with an Avro block, an index row and, for the Spark source, a share of a micro-batch. Too
short for the data, and a sparse archive turns into pieces of a few records: many slices,
an archive larger than its source (small blocks compress badly) and a backfill of as many
micro-batches (seen on a sparse topic: docs/performance.md#derived-slice-length). Too long,
and the watermark moves in big steps, so a job holds more open windows at once.

Rule: the shortest length of `LADDER` whose slices hold, on average over the archive's
event-time extent, at least `MIN_PIECE_BYTES` of payload per group, capped at `MAX_DERIVED`
(the largest watermark step a backfill should take without being asked). Busy archives
keep the old default, 1 m (terabytes over three months: tens of MB a minute); sparse ones
get hours or a day.

The statistics pass stretches before the length is known, so it cuts its per-chunk stretches (records
whose running maximum stays in one slice) at the ladder's shortest step, `STATS_MS`, and
they are merged into stretches of the chosen length (`coarsen`): every length on the ladder is
a multiple of it, so the merged stretches are exactly the ones a pass at that length would cut.
"""

from __future__ import annotations

import dataclasses

from compactor.slicing import ChunkStats, Stretch

_MIN = 60_000
LADDER = {  # label -> ms: each a multiple of the first
    "1m": _MIN,
    "2m": 2 * _MIN,
    "5m": 5 * _MIN,
    "10m": 10 * _MIN,
    "15m": 15 * _MIN,
    "30m": 30 * _MIN,
    "1h": 60 * _MIN,
    "2h": 120 * _MIN,
    "3h": 180 * _MIN,
    "6h": 360 * _MIN,
    "12h": 720 * _MIN,
    "1d": 1440 * _MIN,
}
STATS_MS = _MIN
MIN_PIECE_BYTES = 64 << 10  # payload per group and slice: blocks large enough to compress as the source's do
MAX_DERIVED = "1d"


def derive(payload_bytes: int, extent_ms: int, groups: int) -> str:
    """The ladder's shortest length whose slices hold at least MIN_PIECE_BYTES per group on
    average over `extent_ms`, at most MAX_DERIVED."""
    for label, ms in LADDER.items():
        slices = max(1, -(-extent_ms // ms))
        if payload_bytes / slices >= MIN_PIECE_BYTES * groups or label == MAX_DERIVED:
            return label
    return MAX_DERIVED


def extent_ms_of(chunks: list[ChunkStats]) -> int:
    """Event time the archive covers, from the chunk summaries."""
    if not chunks:
        return 0
    return max(c.max_timestamp for c in chunks) - min(c.min_timestamp for c in chunks) + 1


def coarsen(chunks: list[ChunkStats], duration_ms: int) -> list[ChunkStats]:
    """The chunk summaries with stretches cut at `duration_ms` (a multiple of STATS_MS), from
    stretches cut at STATS_MS: consecutive stretches in one longer slice merged."""
    factor = duration_ms // STATS_MS
    if factor * STATS_MS != duration_ms:
        raise ValueError(f"{duration_ms} ms is not a multiple of {STATS_MS} ms")
    if factor == 1:
        return chunks
    return [dataclasses.replace(c, stretches=_merge(c.stretches, factor)) for c in chunks]


def _merge(stretches: list[Stretch], factor: int) -> list[Stretch]:
    out: list[Stretch] = []
    for r in stretches:
        s = r.local_slice // factor
        if out and out[-1].local_slice == s:
            last = out[-1]
            out[-1] = dataclasses.replace(
                last,
                last_offset=r.last_offset,
                records=last.records + r.records,
                min_timestamp=min(last.min_timestamp, r.min_timestamp),
                max_timestamp=max(last.max_timestamp, r.max_timestamp),
                last_timestamp=r.last_timestamp,
                last_digest=r.last_digest,
            )
        else:
            out.append(dataclasses.replace(r, local_slice=s))
    return out

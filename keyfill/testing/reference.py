"""The reference a backfill is compared with: the topic as a live consumer reads it.

Each partition in offset order; partitions merged by their running maximum timestamp (the
order a producer fleet writing in real time would have appended them, so a live consumer
sees roughly this); per partition a bounded-out-of-orderness watermark of bound B, and the
job's watermark the minimum over the partitions still producing (Flink's rule, with
partitions that have ended no longer holding it back).

Lateness here is a record's own partition's business: a record is *late in its partition*
when its timestamp is more than B behind the largest earlier timestamp of its partition.
That is the bound keyfill promises (docs/design.md, invariant 3): a record the replay's
watermark declares late is late in its partition. A live job's watermark (the minimum over
partitions) is never above its partition's, so it accepts every record that is on time in
its partition, and the on-time records are where the replay and the topic must agree.
"""

from __future__ import annotations

from dataclasses import dataclass

import pyarrow as pa

from keyfill.synth.topic import Record

MAX_WATERMARK = 2**63 - 1  # the watermark at the end of a bounded stream (Flink's Long.MAX_VALUE)


@dataclass(frozen=True)
class Watermark:
    """No record with an earlier timestamp is on time after this point of the stream."""

    timestamp_ms: int


def records_of(batch: pa.RecordBatch | pa.Table) -> list[Record]:
    """Envelope (or replay) rows as `Record`s."""
    cols = [batch.column(c).to_pylist() for c in ("partition", "offset", "timestamp", "key", "value", "headers")]
    return [
        Record(p, o, round(t.timestamp() * 1000), k, v, tuple((h["key"], h["value"]) for h in hs))
        for p, o, t, k, v, hs in zip(*cols)
    ]


def late_in_partition(records: list[Record], bound_ms: int) -> set[tuple[int, int]]:
    """(partition, offset) of the records more than `bound_ms` behind the largest earlier
    timestamp of their partition (`records`: each partition in offset order)."""
    late: set[tuple[int, int]] = set()
    top: dict[int, int] = {}
    for r in records:
        m = top.get(r.partition)
        if m is not None and r.timestamp < m - bound_ms:
            late.add((r.partition, r.offset))
        top[r.partition] = r.timestamp if m is None else max(m, r.timestamp)
    return late


def live_order(records: list[Record]) -> list[Record]:
    """The partitions merged by running maximum timestamp (ties: partition, then offset)."""
    by_part: dict[int, list[Record]] = {}
    for r in sorted(records, key=lambda r: (r.partition, r.offset)):
        by_part.setdefault(r.partition, []).append(r)
    keyed = []
    for p, recs in by_part.items():
        top = None
        for r in recs:
            top = r.timestamp if top is None else max(top, r.timestamp)
            keyed.append(((top, p, r.offset), r))
    return [r for _, r in sorted(keyed, key=lambda item: item[0])]


def reference_stream(records: list[Record], bound_ms: int) -> list[Record | Watermark]:
    """`live_order(records)` with the watermark after each record that raises it, and the
    final one."""
    order = live_order(records)
    remaining: dict[int, int] = {}
    for r in order:
        remaining[r.partition] = remaining.get(r.partition, 0) + 1
    top: dict[int, int] = {}
    out: list[Record | Watermark] = []
    mark = None
    for r in order:
        out.append(r)
        top[r.partition] = max(top.get(r.partition, r.timestamp), r.timestamp)
        remaining[r.partition] -= 1
        producing = [p for p, n in remaining.items() if n]
        if producing and all(p in top for p in producing):
            wm = min(top[p] for p in producing) - bound_ms
            if mark is None or wm > mark:
                mark = wm
                out.append(Watermark(wm))
    out.append(Watermark(MAX_WATERMARK))
    return out

"""Source chunks as the passes' tasks see them: a small table of chunk indexes (the chunks
themselves travel in the task closure), and a read that refuses empty chunks and,
for an append, drops what the archive already holds."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc

from compactor.sources import SourceArchive, SourceChunk
from keygroups import envelope

CHUNK_COLUMNS = pa.schema([("idx", pa.int32()), ("prefix_max", pa.int64()), ("from_offset", pa.int64())])


def chunk_rows(
    chunks: list[SourceChunk], prefix_max: dict[str, int] | None = None, handoff: dict[int, int] | None = None
) -> pa.Table:
    """One row per chunk: its index, the running maximum timestamp of its partition before it
    (the rewrite pass needs it to slice the chunk's records), and the first offset to read
    (an append's hand-off; 0 for a full compaction)."""
    rows = [
        {"idx": i, "prefix_max": (prefix_max or {}).get(c.key, 0), "from_offset": (handoff or {}).get(c.partition, 0)}
        for i, c in enumerate(chunks)
    ]
    return pa.Table.from_pylist(rows, CHUNK_COLUMNS)


def read_checked(
    source: SourceArchive, chunk: SourceChunk, from_offset: int = 0, *, encoded: bool = False
) -> pa.RecordBatch:
    """The chunk's records from `from_offset` on (possibly none: a chunk straddling an
    append's hand-off whose later records are all below it). `encoded`: as the compaction
    moves them (`SourceArchive.read_encoded`)."""
    batch = source.read_encoded(chunk) if encoded else source.read(chunk)
    if batch.num_rows == 0 and source.contiguous:  # a Kafka segment may hold only markers
        raise envelope.CorruptFile(f"{source.store.url_for(chunk.key)}: chunk holds no records")
    if from_offset and batch.num_rows and batch.column("offset")[0].as_py() < from_offset:
        batch = batch.filter(pc.greater_equal(batch.column("offset"), from_offset))
    return batch


def chunks_from(chunks: list[SourceChunk], handoff: dict[int, int]) -> list[SourceChunk]:
    """The chunks that may hold offsets at or past each partition's hand-off: what an append
    reads. A chunk ends before the next one of its partition starts, so only the one
    straddling the hand-off is read in part (its last offset may be unknown until read)."""
    by_partition: dict[int, list[SourceChunk]] = {}
    for c in sorted(chunks, key=lambda c: (c.partition, c.first_offset)):
        by_partition.setdefault(c.partition, []).append(c)
    out = []
    for p, cs in by_partition.items():
        start = handoff.get(p, 0)
        for c, nxt in zip(cs, [*cs[1:], None]):
            below = (c.last_offset is not None and c.last_offset < start) or (
                nxt is not None and nxt.first_offset <= start
            )
            if not below:
                out.append(c)
    return out

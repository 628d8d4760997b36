"""`keyfill inspect`: what is in a source archive, from headers and (optionally) one scan."""

from __future__ import annotations

import heapq
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from typing import Any

import pyarrow as pa

from compactor.errors import ArchiveError
from compactor.sources import SourceArchive, SourceChunk
from compactor.sources.envelope import ArchiveIndex, build_index, read_chunk
from keygroups.envelope import record_bytes
from keygroups.storage import Storage


@dataclass
class PartitionSummary:
    topic: str
    partition: int
    chunks: int
    records: int
    bytes: int
    first_offset: int
    last_offset: int
    min_timestamp: int
    max_timestamp: int


@dataclass
class KeyVolume:
    key: str | None  # None: the null-key records
    records: int
    bytes: int
    share: float  # of all payload bytes


@dataclass
class ArchiveSummary:
    url: str
    partitions: list[PartitionSummary]
    records: int
    chunks: int
    file_bytes: int
    min_timestamp: int
    max_timestamp: int
    gaps: list[str]
    payload_bytes: int | None = None  # key + value + headers, from the scan
    distinct_keys: int | None = None
    heaviest_keys: list[KeyVolume] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def _header_stats(c: SourceChunk) -> tuple[int, int, int, int]:
    """Records, last offset, least and greatest timestamp, from the chunk's header (an
    envelope chunk's header holds them all)."""
    if c.records is None or c.last_offset is None or c.min_timestamp is None or c.max_timestamp is None:
        raise ArchiveError(f"{c.key}: no record counts, offsets or times in the chunk's header")
    return c.records, c.last_offset, c.min_timestamp, c.max_timestamp


def summarize_index(index: ArchiveIndex) -> ArchiveSummary:
    parts = []
    for (topic, p), chunks in sorted(index.chunks.items()):
        stats = [_header_stats(c) for c in chunks]
        parts.append(
            PartitionSummary(
                topic=topic,
                partition=p,
                chunks=len(chunks),
                records=sum(s[0] for s in stats),
                bytes=sum(c.size for c in chunks),
                first_offset=chunks[0].first_offset,
                last_offset=stats[-1][1],
                min_timestamp=min(s[2] for s in stats),
                max_timestamp=max(s[3] for s in stats),
            )
        )
    return ArchiveSummary(
        url=index.url,
        partitions=parts,
        records=sum(p.records for p in parts),
        chunks=sum(p.chunks for p in parts),
        file_bytes=sum(p.bytes for p in parts),
        min_timestamp=min(p.min_timestamp for p in parts),
        max_timestamp=max(p.max_timestamp for p in parts),
        gaps=list(index.gaps),
    )


def _key_volumes(batch: pa.RecordBatch) -> pa.Table:
    t = pa.table({"key": batch.column("key"), "bytes": record_bytes(batch)})
    return t.group_by("key", use_threads=False).aggregate([("bytes", "sum"), ("bytes", "count")])


def inspect_archive(
    store: Storage, *, top: int = 10, scan: bool = True, progress: bool = False, threads: int = 8
) -> ArchiveSummary:
    """Summary from the index; with `scan`, one pass over the records adds the heaviest keys."""
    index = build_index(store, threads=threads)
    summary = summarize_index(index)
    if not scan:
        return summary
    from tqdm import tqdm

    chunks = index.all_chunks()
    partials: list[pa.Table] = []
    with (
        ThreadPoolExecutor(max_workers=threads) as pool,
        tqdm(total=len(chunks), unit="chunk", desc="scan", disable=not progress) as bar,
    ):
        for t in pool.map(lambda c: _key_volumes(read_chunk(store, c)), chunks):
            partials.append(t)
            bar.update(1)
    _add_heaviest(summary, partials, top)
    return summary


def _add_heaviest(summary: ArchiveSummary, partials: list[pa.Table], top: int) -> None:
    """Payload bytes, distinct keys and the heaviest keys, from per-chunk key volumes."""
    merged = (
        pa.concat_tables(partials)
        .group_by("key", use_threads=False)
        .aggregate([("bytes_sum", "sum"), ("bytes_count", "sum")])
    )
    keys = merged.column("key").to_pylist()
    volume = merged.column("bytes_sum_sum").to_numpy()
    counts = merged.column("bytes_count_sum").to_numpy()
    total = int(volume.sum())
    # Ties broken by key so the listing is stable.
    best = heapq.nsmallest(top, range(len(keys)), key=lambda i: (-int(volume[i]), keys[i] or b""))
    summary.payload_bytes = total
    summary.distinct_keys = sum(1 for k in keys if k is not None)
    summary.heaviest_keys = [
        KeyVolume(
            key=None if keys[i] is None else keys[i].decode("utf-8", "backslashreplace"),
            records=int(counts[i]),
            bytes=int(volume[i]),
            share=float(volume[i]) / total if total else 0.0,
        )
        for i in best
    ]


_ChunkStats = tuple[int, int, int, int, int]  # records, least and greatest offset, least and greatest timestamp


def inspect_source(source: SourceArchive, *, top: int = 10, progress: bool = False, threads: int = 8) -> ArchiveSummary:
    """Any source format: formats without per-chunk statistics in their headers (Kafka
    segments, Kafka Connect) are read once, chunk by chunk, for counts, offsets, times and
    key volumes together."""
    from tqdm import tqdm

    chunks = source.list_chunks()

    def one(chunk: SourceChunk) -> tuple[SourceChunk, _ChunkStats | None, pa.Table]:
        b = source.read(chunk)
        ts = b.column("timestamp").cast(pa.int64()).to_numpy()
        off = b.column("offset").to_numpy()
        stats = (b.num_rows, int(off.min()), int(off.max()), int(ts.min()), int(ts.max())) if b.num_rows else None
        return chunk, stats, _key_volumes(b)

    per: dict[tuple[str, int], list[tuple[SourceChunk, _ChunkStats | None]]] = {}
    partials: list[pa.Table] = []
    with (
        ThreadPoolExecutor(max_workers=threads) as pool,
        tqdm(total=len(chunks), unit="chunk", desc="scan", disable=not progress) as bar,
    ):
        for chunk, chunk_stats, volumes in pool.map(one, chunks):
            per.setdefault((chunk.topic, chunk.partition), []).append((chunk, chunk_stats))
            partials.append(volumes)
            bar.update(1)
    parts = []
    for (topic, p), items in sorted(per.items()):
        stats = [s for _, s in items if s]
        if not stats:
            continue
        parts.append(
            PartitionSummary(
                topic=topic,
                partition=p,
                chunks=len(items),
                records=sum(s[0] for s in stats),
                bytes=sum(c.size for c, _ in items),
                first_offset=min(s[1] for s in stats),
                last_offset=max(s[2] for s in stats),
                min_timestamp=min(s[3] for s in stats),
                max_timestamp=max(s[4] for s in stats),
            )
        )
    summary = ArchiveSummary(
        url=source.url,
        partitions=parts,
        records=sum(p.records for p in parts),
        chunks=len(chunks),
        file_bytes=sum(c.size for c in chunks),
        min_timestamp=min((p.min_timestamp for p in parts), default=0),
        max_timestamp=max((p.max_timestamp for p in parts), default=0),
        gaps=[],
    )
    if partials:
        _add_heaviest(summary, partials, top)
    return summary

"""Phase 2 of the compaction: every record tagged with its slice and group, shuffled by
(slice, group), sorted, and written as one group file per (slice, group), in Spark tasks.
Returns what was written, for the slice metadata."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator

import numpy as np
import pyarrow as pa

from compactor.chunks import chunk_frame, read_checked
from compactor.config import CompactConfig, CompactionError
from compactor.slicing import SlicePlan, record_slices
from compactor.sources import SourceArchive, SourceChunk
from keygroups import compacted, envelope
from keygroups.assignment import MISSING, KeyAssignment, load_assignment
from keygroups.compacted import GroupFile
from keygroups.storage import Storage

RECORD_SCHEMA = (
    "slice int, grp int, order_ts long, partition int, offset long, timestamp long, key binary, "
    "value binary, headers array<struct<key:string,value:binary>>"
)
WRITE_SCHEMA = (
    "slice int, grp int, key string, records long, file_bytes long, payload_bytes long, sha256 string, crc32c string, "
    "min_ts long, max_ts long"
)
_assignment_cache: dict[str, KeyAssignment] = {}


def _load_assignment(dest: Storage) -> KeyAssignment:
    """The key -> group lookup, loaded once per worker process."""
    if dest.url not in _assignment_cache:
        _assignment_cache.clear()
        _assignment_cache[dest.url] = KeyAssignment.from_table(load_assignment(dest))
    return _assignment_cache[dest.url]


def _decode_task(source: SourceArchive, chunks: list[SourceChunk], dest: Storage, duration_ms: int, base: int):
    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        assignment = _load_assignment(dest)
        for rows in batches:
            for row in rows.to_pylist():
                chunk = chunks[row["idx"]]
                batch = read_checked(source, chunk)
                ts = batch.column("timestamp").cast(pa.int64()).to_numpy()
                slices, order_ts = record_slices(ts, row["prefix_max"], duration_ms, base)
                grp = assignment.group_of(batch.column("key"), batch.column("partition").to_numpy())
                if (grp == MISSING).any():
                    raise CompactionError(
                        f"{source.store.url_for(chunk.key)}: a key missing from the assignment (the source changed "
                        "during the compaction?)"
                    )
                yield pa.RecordBatch.from_arrays(
                    [
                        pa.array(slices, pa.int32()),
                        pa.array(grp, pa.int32()),
                        pa.array(order_ts, pa.int64()),
                        batch.column("partition"),
                        batch.column("offset"),
                        batch.column("timestamp").cast(pa.int64()),
                        batch.column("key"),
                        batch.column("value"),
                        batch.column("headers").cast(
                            pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))
                        ),
                    ],
                    names=["slice", "grp", "order_ts", "partition", "offset", "timestamp", "key", "value", "headers"],
                )

    return run


def _write_task(dest: Storage, codec: str, block_bytes: int, fail_after: int | None):
    def flush(pieces: list[pa.RecordBatch], s: int, g: int) -> pa.RecordBatch:
        table = pa.Table.from_batches(pieces).combine_chunks()
        batch = table.to_batches()[0]
        env = envelope.conform(
            pa.RecordBatch.from_arrays(
                [
                    batch.column(c) if c != "timestamp" else batch.column(c).cast(pa.timestamp("ms", tz="UTC"))
                    for c in envelope.ARROW_SCHEMA.names
                ],
                names=envelope.ARROW_SCHEMA.names,
            )
        )
        key, data = compacted.encode_group_file(env, s, g, codec, block_bytes)
        dest.write(key, data)
        ts = batch.column("timestamp").to_numpy()
        return pa.RecordBatch.from_pylist(
            [
                {
                    "slice": s,
                    "grp": g,
                    "key": key,
                    "records": env.num_rows,
                    "file_bytes": len(data),
                    "payload_bytes": int(envelope.record_bytes(env).sum()),
                    "sha256": hashlib.sha256(data).hexdigest(),
                    "crc32c": compacted.crc32c(data),
                    "min_ts": int(ts.min()),
                    "max_ts": int(ts.max()),
                }
            ],
            schema=_WRITE_ARROW,
        )

    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        current: tuple[int, int] | None = None
        pieces: list[pa.RecordBatch] = []
        written = 0
        for batch in batches:
            if batch.num_rows == 0:
                continue
            sl = batch.column("slice").to_numpy()
            gr = batch.column("grp").to_numpy()
            change = np.flatnonzero((np.diff(sl) != 0) | (np.diff(gr) != 0)) + 1
            for a, b in zip(np.r_[0, change].tolist(), np.r_[change, batch.num_rows].tolist()):
                here = (int(sl[a]), int(gr[a]))
                if here != current:
                    if pieces:
                        yield flush(pieces, *current)
                        written += 1
                        if fail_after is not None and written >= fail_after:
                            raise RuntimeError(f"injected failure after {written} group files (test hook)")
                    current, pieces = here, []
                pieces.append(batch.slice(a, b - a))
        if pieces:
            yield flush(pieces, *current)

    return run


_WRITE_ARROW = pa.schema(
    [
        ("slice", pa.int32()),
        ("grp", pa.int32()),
        ("key", pa.string()),
        ("records", pa.int64()),
        ("file_bytes", pa.int64()),
        ("payload_bytes", pa.int64()),
        ("sha256", pa.string()),
        ("crc32c", pa.string()),
        ("min_ts", pa.int64()),
        ("max_ts", pa.int64()),
    ]
)


def run_rewrite(
    spark, cfg: CompactConfig, source: SourceArchive, chunks: list[SourceChunk], dest: Storage, plan: SlicePlan
) -> dict[int, list[GroupFile]]:
    """The group files written, by slice."""
    spark.sparkContext.setJobDescription("keyfill compact: rewrite")
    frame = chunk_frame(spark, chunks, plan.prefix_max)
    records = frame.mapInArrow(_decode_task(source, chunks, dest, cfg.slice_duration_ms, plan.base), RECORD_SCHEMA)
    pairs = plan.slices * cfg.groups
    by_size = int(sum(c.size for c in chunks) / (64 << 20))
    shuffle = max(1, min(pairs, max(spark.sparkContext.defaultParallelism * 2, by_size)))
    written = (
        records.repartition(shuffle, "slice", "grp")
        .sortWithinPartitions("slice", "grp", "order_ts", "partition", "offset")
        .mapInArrow(_write_task(dest, cfg.codec, cfg.block_bytes, cfg.fail_after_files), WRITE_SCHEMA)
        .toArrow()
    )
    files: dict[int, list[GroupFile]] = {}
    for r in written.to_pylist():
        files.setdefault(r["slice"], []).append(
            GroupFile(
                group=r["grp"],
                key=r["key"],
                records=r["records"],
                file_bytes=r["file_bytes"],
                payload_bytes=r["payload_bytes"],
                sha256=r["sha256"],
                crc32c=r["crc32c"],
                min_timestamp=r["min_ts"],
                max_timestamp=r["max_ts"],
            )
        )
    return files

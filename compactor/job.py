"""The compaction job: statistics, packing, slicing, rewrite, metadata, commit.

Spark runs both passes over the source; every byte of I/O happens in Python tasks through
keyfill's storage layer (pip pyspark has neither spark-avro nor s3a), so a cluster needs
only Python packages. The driver sees per-key totals and per-chunk summaries, never records.

Commit protocol: data files and slice metadata are written first, `_manifest.json` last.
Without a manifest there is no archive, so a run that dies part-way leaves nothing visible
and a re-run starts by clearing what it left. An archive being replaced (--overwrite) is
removed only after the new input has been listed and its statistics pass has succeeded, and
only objects of the archive layout are removed.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from compactor.slicing import ChunkStats, Run, chunk_runs, parse_duration, plan_slices, record_slices
from compactor.sources import FORMATS, SourceArchive, SourceChunk, open_source
from keygroups import compacted, envelope
from keygroups.assignment import ASSIGNMENT_SCHEMA, MISSING, KeyAssignment, load_assignment, write_assignment
from keygroups.compacted import GroupFile, Manifest, SliceMeta, SliceSummary
from keygroups.errors import KeyfillError, OptionError
from keygroups.storage import Storage, StorageError, open_storage, overlapping

log = logging.getLogger("keyfill.compact")

DEFAULT_BLOCK_BYTES = 1 << 20
NULL_KEY_POLICIES = ("partition",)


class CompactionError(KeyfillError, RuntimeError):
    """The two passes over the source disagree: the source changed while it was compacted."""


@dataclass(frozen=True)
class CompactConfig:
    source: str
    dest: str
    groups: int
    slice_duration: str = "10m"
    source_format: str = "envelope"
    key_field: str | None = None
    timestamp_field: str | None = None
    topic: str | None = None
    codec: str = "snappy"
    block_bytes: int = DEFAULT_BLOCK_BYTES
    allow_gaps: bool = False
    overwrite: bool = False
    threads: int = 16
    null_keys: str = "partition"
    fail_after_files: int | None = None  # test hook: a rewrite task dies after this many files

    def __post_init__(self) -> None:
        if self.groups < 1:
            raise OptionError("--groups must be at least 1")
        if self.codec not in envelope.CODECS:
            raise OptionError(f"--codec must be one of {', '.join(envelope.CODECS)}")
        if self.source_format not in FORMATS:
            raise OptionError(f"--format must be one of {', '.join(FORMATS)}")
        if self.null_keys not in NULL_KEY_POLICIES:
            raise OptionError(f"--null-keys must be one of {', '.join(NULL_KEY_POLICIES)}")
        if self.block_bytes < 1024:
            raise OptionError("--block-bytes must be at least 1024")
        parse_duration(self.slice_duration)

    @property
    def slice_duration_ms(self) -> int:
        return parse_duration(self.slice_duration)

    def open_source(self) -> SourceArchive:
        return open_source(
            self.source,
            format=self.source_format,
            key_field=self.key_field,
            timestamp_field=self.timestamp_field,
            threads=self.threads,
        )


@dataclass
class CompactResult:
    dest: str
    records: int
    payload_bytes: int
    file_bytes: int
    files: int
    groups: int
    slices: int
    empty_slices: int
    keys: int
    max_group_bytes: int
    mean_group_bytes: float
    seconds: float
    phases: dict[str, float] = field(default_factory=dict)


# --- phase 1: statistics (runs in Spark tasks) -----------------------------------------------

STATS_SCHEMA = "kind int, key binary, null_part int, bytes long, records long, chunk string"
_CHUNK_COLUMNS = "idx int, prefix_max long"  # the chunks themselves travel in the task closure


def _read_checked(source: SourceArchive, chunk: SourceChunk) -> pa.RecordBatch:
    batch = source.read(chunk)
    if batch.num_rows == 0:
        raise envelope.CorruptFile(f"{source.store.url_for(chunk.key)}: chunk holds no records")
    return batch


def _stats_task(source: SourceArchive, chunks: list[SourceChunk], duration_ms: int):
    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for rows in batches:
            for row in rows.to_pylist():
                chunk = chunks[row["idx"]]
                batch = _read_checked(source, chunk)
                offsets = batch.column("offset").to_numpy()
                ts = batch.column("timestamp").cast(pa.int64()).to_numpy()
                weights = envelope.record_bytes(batch)
                t = pa.table({"key": batch.column("key"), "bytes": weights})
                agg = t.group_by("key", use_threads=False).aggregate([("bytes", "sum"), ("bytes", "count")])
                n = agg.num_rows
                keys = agg.column("key")
                null_part = pa.array(
                    np.where(keys.is_null().to_numpy(zero_copy_only=False), chunk.partition, -1), pa.int32()
                )
                stats = ChunkStats(
                    key=chunk.key,
                    topic=chunk.topic,
                    partition=chunk.partition,
                    first_offset=int(offsets[0]),
                    last_offset=int(offsets[-1]),
                    records=batch.num_rows,
                    min_timestamp=int(ts.min()),
                    max_timestamp=int(ts.max()),
                    runs=chunk_runs(offsets, ts, duration_ms),
                )
                # n key rows (kind 0), then one row with the chunk summary (kind 1)
                yield pa.RecordBatch.from_arrays(
                    [
                        pa.array(np.r_[np.zeros(n), [1]].astype(np.int32)),
                        pa.concat_arrays([keys.combine_chunks(), pa.nulls(1, pa.binary())]),
                        pa.concat_arrays([null_part, pa.array([-1], pa.int32())]),
                        pa.concat_arrays([agg.column("bytes_sum").combine_chunks(), pa.array([0], pa.int64())]),
                        pa.concat_arrays([agg.column("bytes_count").combine_chunks(), pa.array([0], pa.int64())]),
                        pa.array([None] * n + [json.dumps(asdict(stats))], pa.string()),
                    ],
                    names=["kind", "key", "null_part", "bytes", "records", "chunk"],
                )

    return run


# --- phase 2: rewrite (runs in Spark tasks) ---------------------------------------------------

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
                batch = _read_checked(source, chunk)
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


# --- driver --------------------------------------------------------------------------------


def _check_destination(source: SourceArchive, dest: Storage, overwrite: bool) -> None:
    """Refuse what would destroy data, before any work: an archive without --overwrite, a
    destination holding foreign files, or a destination and source inside one another
    (clearing one would delete the other, and the source's listing would find the archive)."""
    if overlapping(source.store, dest):
        raise StorageError(
            f"source {source.url} and destination {dest.url} overlap (one lies inside the other); "
            "write the compacted archive to a location outside the source"
        )
    existing = dest.list()
    if not existing:
        return
    if dest.exists(compacted.MANIFEST):
        if not overwrite:
            raise StorageError(f"{dest.url}: a compacted archive exists here; pass --overwrite to replace it")
        return
    foreign = [o.key for o in existing if not compacted.is_archive_key(o.key)]
    if foreign:
        raise StorageError(
            f"{dest.url}: destination holds files that are not a keyfill archive "
            f"(e.g. {dest.url_for(foreign[0])}); choose an empty location"
        )


def _clear_destination(dest: Storage) -> None:
    """Remove the archive being replaced (or what a failed run left): the manifest first, so
    it is invisible at once, then every other object of the archive layout. Files that
    keyfill did not write are left where they are."""
    owned = [o.key for o in dest.list() if compacted.is_archive_key(o.key)]
    if not owned:
        return
    log.info("removing %d files of the previous archive at %s", len(owned), dest.url)
    dest.delete(compacted.MANIFEST)
    dest.delete_many([k for k in owned if k != compacted.MANIFEST])
    kept = [o.key for o in dest.list() if not compacted.is_archive_key(o.key)]
    if kept:
        log.warning(
            "left %d files that keyfill did not write in %s (e.g. %s)", len(kept), dest.url, dest.url_for(kept[0])
        )


def _chunk_rows(chunks: list[SourceChunk], prefix: dict[str, int] | None = None) -> list[tuple]:
    return [(i, (prefix or {}).get(c.key, 0)) for i, c in enumerate(chunks)]


def _packed_assignment(totals: pa.Table, groups: int) -> pa.Table:
    import keygroups

    totals = totals.sort_by([("null_part", "ascending"), ("key", "ascending")])  # canonical order
    weights = totals.column("bytes").to_numpy()
    assigned = keygroups.pack(weights, groups)
    null_part = totals.column("null_part").to_numpy()
    return pa.table(
        {
            "key": totals.column("key"),
            "null_key_partition": pa.array(np.where(null_part >= 0, null_part, 0), pa.int32(), mask=null_part < 0),
            "group": pa.array(assigned, pa.int32()),
            "records": totals.column("records"),
            "bytes": totals.column("bytes"),
        },
        schema=ASSIGNMENT_SCHEMA,
    )


def compact(cfg: CompactConfig, spark) -> CompactResult:
    """Run the whole compaction on `spark`; returns the summary. Raises on any bad input
    with a message naming the object at fault, leaving no visible archive."""
    started = time.perf_counter()
    phases: dict[str, float] = {}
    duration = cfg.slice_duration_ms
    source = cfg.open_source()
    dest = open_storage(cfg.dest, threads=cfg.threads)
    _check_destination(source, dest, cfg.overwrite)

    t = time.perf_counter()
    chunks = source.list_chunks()
    if not chunks:
        raise envelope.CorruptFile(f"{source.url}: no chunks found")
    topics = sorted({c.topic for c in chunks})
    topic = cfg.topic or (topics[0] if len(topics) == 1 else None)
    if topic is None or topic not in topics:
        raise OptionError(f"{source.url}: holds topics {topics}; choose one with --topic")
    chunks = [c for c in chunks if c.topic == topic]
    phases["list"] = time.perf_counter() - t
    log.info("%d chunks of topic %s in %s", len(chunks), topic, source.url)

    sc = spark.sparkContext
    parallel = max(1, min(len(chunks), sc.defaultParallelism * 4))

    # Phase 1: statistics.
    t = time.perf_counter()
    sc.setJobDescription("keyfill compact: statistics")
    chunk_df = spark.createDataFrame(sc.parallelize(_chunk_rows(chunks), parallel), _CHUNK_COLUMNS)
    stats = chunk_df.mapInArrow(_stats_task(source, chunks, duration), STATS_SCHEMA).persist()
    try:
        from pyspark.sql import functions as F

        totals = (
            stats.filter("kind = 0")
            .groupBy("key", "null_part")
            .agg(F.sum("bytes").alias("bytes"), F.sum("records").alias("records"))
            .toArrow()
        )
        chunk_stats = []
        for row in stats.filter("kind = 1").select("chunk").toArrow().column("chunk").to_pylist():
            d = json.loads(row)
            d["runs"] = [Run(**r) for r in d["runs"]]
            chunk_stats.append(ChunkStats(**d))
    finally:
        stats.unpersist()
    phases["statistics"] = time.perf_counter() - t

    # Slicing and packing (driver). Only once the input has proved readable and consistent
    # is the archive being replaced removed.
    t = time.perf_counter()
    plan = plan_slices(chunk_stats, duration, allow_gaps=cfg.allow_gaps, name=source.store.url_for)
    assignment = _packed_assignment(totals, cfg.groups)
    _clear_destination(dest)
    write_assignment(dest, assignment)
    phases["packing"] = time.perf_counter() - t

    # Phase 2: rewrite.
    t = time.perf_counter()
    sc.setJobDescription("keyfill compact: rewrite")
    chunk_df = spark.createDataFrame(sc.parallelize(_chunk_rows(chunks, plan.prefix_max), parallel), _CHUNK_COLUMNS)
    records = chunk_df.mapInArrow(_decode_task(source, chunks, dest, duration, plan.base), RECORD_SCHEMA)
    pairs = plan.slices * cfg.groups
    shuffle = max(1, min(pairs, max(sc.defaultParallelism * 2, int(sum(c.size for c in chunks) / (64 << 20)))))
    written = (
        records.repartition(shuffle, "slice", "grp")
        .sortWithinPartitions("slice", "grp", "order_ts", "partition", "offset")
        .mapInArrow(_write_task(dest, cfg.codec, cfg.block_bytes, cfg.fail_after_files), WRITE_SCHEMA)
        .toArrow()
    )
    phases["rewrite"] = time.perf_counter() - t

    # Metadata and commit.
    t = time.perf_counter()
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
    summaries = []
    for s in range(plan.slices):
        start, end = plan.bounds(s)
        meta = SliceMeta(
            slice=s,
            start_ms=start,
            end_ms=end,
            partitions=plan.ranges.get(s, []),
            groups=sorted(files.get(s, []), key=lambda g: g.group),
        )
        expected = sum(p.records for p in meta.partitions)
        if meta.records != expected:
            raise CompactionError(
                f"slice {s}: wrote {meta.records} records, statistics counted {expected} (the source changed during "
                "the compaction?)"
            )
        compacted.write_json(dest, compacted.slice_meta_key(s), meta.to_json())
        summaries.append(
            SliceSummary(
                slice=s,
                start_ms=start,
                end_ms=end,
                records=meta.records,
                file_bytes=sum(g.file_bytes for g in meta.groups),
                files=len(meta.groups),
            )
        )
    group_records = np.bincount(
        assignment.column("group").to_numpy(), weights=assignment.column("records").to_numpy(), minlength=cfg.groups
    ).astype(np.int64)
    group_bytes = np.bincount(
        assignment.column("group").to_numpy(), weights=assignment.column("bytes").to_numpy(), minlength=cfg.groups
    ).astype(np.int64)
    file_bytes = sum(s.file_bytes for s in summaries)
    n_files = sum(s.files for s in summaries)
    total_records = int(group_records.sum())
    manifest = Manifest(
        source={
            "url": source.url,
            "format": cfg.source_format,
            "key_field": cfg.key_field,
            "timestamp_field": cfg.timestamp_field,
        },
        config={
            "groups": cfg.groups,
            "slice_duration": cfg.slice_duration,
            "slice_duration_ms": duration,
            "codec": cfg.codec,
            "block_bytes": cfg.block_bytes,
            "null_keys": cfg.null_keys,
            "allow_gaps": cfg.allow_gaps,
        },
        topic=topic,
        groups=cfg.groups,
        slice_duration_ms=duration,
        slices=summaries,
        group_records=group_records.tolist(),
        group_payload_bytes=group_bytes.tolist(),
        totals={
            "records": total_records,
            "payload_bytes": int(group_bytes.sum()),
            "file_bytes": file_bytes,
            "files": n_files,
            "keys": int(pc.sum(pc.is_valid(assignment.column("key"))).as_py() or 0),
            "partitions": len(plan.handoff),
            "slices": plan.slices,
        },
        handoff={str(p): o for p, o in sorted(plan.handoff.items())},
        gaps=plan.gaps,
    )
    compacted.write_json(dest, compacted.MANIFEST, manifest.to_json())  # the archive is now visible
    phases["commit"] = time.perf_counter() - t

    return CompactResult(
        dest=dest.url,
        records=total_records,
        payload_bytes=int(group_bytes.sum()),
        file_bytes=file_bytes,
        files=n_files,
        groups=cfg.groups,
        slices=plan.slices,
        empty_slices=sum(1 for s in summaries if s.records == 0),
        keys=manifest.totals["keys"],
        max_group_bytes=int(group_bytes.max()),
        mean_group_bytes=float(group_bytes.mean()),
        seconds=time.perf_counter() - started,
        phases=phases,
    )

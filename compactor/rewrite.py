"""Phase 2 of the compaction: every record tagged with its slice and group, shuffled by
group, sorted, and written as segment files of consecutive slices, in Spark tasks. Returns
the pieces written, for the index."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pyarrow as pa

from compactor.chunks import chunk_batches, chunk_frame, read_checked, spark_ddl
from compactor.config import CompactConfig, CompactionError
from compactor.group_partitioning import group_slots
from compactor.slicing import SlicePlan, record_slices
from compactor.sources import SourceArchive, SourceChunk
from compactor.task_errors import TaskErrors
from keygroups import envelope, piece_index
from keygroups.assignment import MISSING, KeyAssignment, load_assignment
from keygroups.segments import SegmentWriter, Tail
from keygroups.storage import Storage

# A record crosses the shuffle already encoded (`envelope.encode_records`): one binary column
# is far cheaper for Spark to convert and move than key, value and the nested headers.
RECORD_SCHEMA = (
    "slot long, slice int, grp int, order_ts long, partition int, offset long, timestamp long, record binary"
)
# How a rewrite task's records are sorted: by group, then the piece order. A slice is a
# function of the running maximum (`record_slices`), so (order_ts, partition, offset) orders
# a group's slices too; a Spark task holds one group and sorts on those three alone, which
# gives Spark's sort a prefix that discriminates (a constant group id would not).
_ORDER = ("grp", "order_ts", "partition", "offset")
# Columns the shuffle and the sort need and the writers do not: dropped before the sorted
# records cross back into Python (6M records: ~100 MB fewer to convert).
_SORT_ONLY = ("slot", "order_ts", "partition", "offset")
_assignment_cache: dict[str, KeyAssignment] = {}


def _load_assignment(dest: Storage, key: str) -> KeyAssignment:
    """The key -> group lookup, loaded once per worker process."""
    url = dest.url_for(key)
    if url not in _assignment_cache:
        _assignment_cache.clear()
        _assignment_cache[url] = KeyAssignment.from_table(load_assignment(dest, key))
    return _assignment_cache[url]


def _decode_task(
    source: SourceArchive,
    chunks: list[SourceChunk],
    dest: Storage,
    assignment_key: str,
    duration_ms: int,
    base: int,
    published: int,
    slots: np.ndarray,
):
    """Tags each record with its slice, group and the group's shuffle slot
    (`compactor.group_partitioning`); drops records of slices past the `published` ones
    (unsealed: left for a later compaction)."""

    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        assignment = _load_assignment(dest, assignment_key)
        for rows in batches:
            for row in rows.to_pylist():
                chunk = chunks[row["idx"]]
                batch = read_checked(source, chunk, row["from_offset"])
                if not batch.num_rows:
                    continue
                ts = batch.column("timestamp").cast(pa.int64()).to_numpy()
                slices, order_ts = record_slices(ts, row["prefix_max"], duration_ms, base)
                sealed = slices < published  # the rest is left for a later compaction (slicing.py)
                if not sealed.all():
                    batch, ts, slices, order_ts = batch.filter(sealed), ts[sealed], slices[sealed], order_ts[sealed]
                    if not batch.num_rows:
                        continue
                grp = assignment.group_of(batch.column("key"), batch.column("partition").to_numpy())
                if (grp == MISSING).any():
                    raise CompactionError(
                        f"{source.store.url_for(chunk.key)}: a key missing from the assignment (the source changed "
                        "during the compaction?)"
                    )
                yield pa.RecordBatch.from_arrays(
                    [
                        pa.array(slots[grp], pa.int64()),
                        pa.array(slices, pa.int32()),
                        pa.array(grp, pa.int32()),
                        pa.array(order_ts, pa.int64()),
                        batch.column("partition"),
                        batch.column("offset"),
                        pa.array(ts, pa.int64()),
                        envelope.encode_records(batch),
                    ],
                    names=["slot", "slice", "grp", "order_ts", "partition", "offset", "timestamp", "record"],
                )

    return run


def _write_task(
    dest: Storage,
    run_id: str,
    codec: str,
    block_bytes: int,
    target_bytes: int,
    tails: dict[int, Tail],
):
    """Each task holds whole groups (sorted by group, slice, then the piece order): one
    SegmentWriter per group (continuing the group's tail, for an append), fed one slice's
    records at a time; yields the index rows of the pieces written."""

    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        writer: SegmentWriter | None = None
        current: tuple[int, int] | None = None  # (group, slice) of `rows`
        rows: list[pa.RecordBatch] = []
        finished: set[int] = set()  # groups this task has begun

        def written(close: bool = False) -> Iterator[pa.RecordBatch]:
            """Index rows of the pieces in files written since the last call (with `close`,
            the group's last file too)."""
            if close:
                writer.close()
            new = writer.take()
            if new:
                yield piece_index.piece_table(new).cast(_SPARK_PIECES).to_batches()[0]

        def add() -> Iterator[pa.RecordBatch]:
            piece = pa.Table.from_batches(rows)
            records = piece.column("record")
            if records.num_chunks != 1:  # one buffer for the piece (large: it may pass 2 GiB)
                records = records.cast(pa.large_binary()).combine_chunks()
            else:
                records = records.chunk(0)
            writer.add_encoded(current[1], records, piece.column("timestamp").to_numpy())
            yield from written()

        for batch in batches:
            if batch.num_rows == 0:
                continue
            sl = batch.column("slice").to_numpy()
            gr = batch.column("grp").to_numpy()
            change = np.flatnonzero((np.diff(sl) != 0) | (np.diff(gr) != 0)) + 1
            for a, b in zip(np.r_[0, change].tolist(), np.r_[change, batch.num_rows].tolist()):
                here = (int(gr[a]), int(sl[a]))
                if here != current:
                    if rows:
                        yield from add()
                    if current is None or here[0] != current[0]:  # a new group: a writer of its own
                        if writer is not None:
                            yield from written(close=True)
                        if here[0] in finished:  # the sort keeps a task's groups apart; never write one twice
                            raise RuntimeError(f"group {here[0]} came back after other groups in one rewrite task")
                        finished.add(here[0])
                        writer = SegmentWriter(
                            dest,
                            here[0],
                            run_id,
                            codec=codec,
                            block_bytes=block_bytes,
                            target_bytes=target_bytes,
                            tail=tails.get(here[0]),
                        )
                    current, rows = here, []
                rows.append(batch.slice(a, b - a))
        if rows:
            yield from add()
        if writer is not None:
            yield from written(close=True)

    return run


# The index rows as Spark carries them: Spark has no unsigned integers.
_SPARK_PIECES = pa.schema([f.with_type(pa.int64()) if f.type == pa.uint32() else f for f in piece_index.PIECE_SCHEMA])
_SPARK_DDL = spark_ddl(_SPARK_PIECES)


def run_rewrite(
    spark,
    cfg: CompactConfig,
    groups: int,
    source: SourceArchive,
    chunks: list[SourceChunk],
    dest: Storage,
    plan: SlicePlan,
    run: str,
    assignment_key: str,
    handoff: dict[int, int] | None = None,
    tails: dict[int, Tail] | None = None,
    errors: TaskErrors | None = None,
) -> pa.Table:
    """The pieces written (PIECE_SCHEMA rows), in files named by `run`.

    Records are shuffled by group, so one task sees a group's records of every slice in
    order and cuts its segment files at slice boundaries near the target size (files of
    exactly the sizes the layout promises, no small tails from split groups). A task holds
    one piece and one file in memory at most; Spark spills the sort. `handoff`: for an
    append, each partition's first offset to write; `tails`: the groups' last files it
    continues (`compactor.append.tails`). `spark=None`: the same tasks run in this process
    (`compactor.job.compact`)."""
    write = _write_task(dest, run, cfg.codec, cfg.block_bytes, cfg.target_file_bytes, tails or {})
    if spark is None:
        slots = np.zeros(groups, np.int64)  # no shuffle to steer
        decode = _decode_task(source, chunks, dest, assignment_key, plan.duration_ms, plan.base, plan.slices, slots)
        return _rewrite_in_process(decode(iter(chunk_batches(chunks, plan.prefix_max, handoff))), write)
    frame = chunk_frame(spark, chunks, plan.prefix_max, handoff)
    slots = group_slots(spark, groups)
    decode = _decode_task(source, chunks, dest, assignment_key, plan.duration_ms, plan.base, plan.slices, slots)
    records = frame.mapInArrow(errors.guard(decode) if errors else decode, RECORD_SCHEMA)
    action = (
        records.repartition(groups, "slot")  # task g holds group g alone
        .sortWithinPartitions(*_ORDER[1:])
        .drop(*_SORT_ONLY)
        .mapInArrow(write, _SPARK_DDL)
        .toArrow
    )
    written = errors.run(spark.sparkContext, "rewrite", action) if errors else action()
    return written.cast(piece_index.PIECE_SCHEMA)


def _rewrite_in_process(decoded: Iterator[pa.RecordBatch], write) -> pa.Table:
    """The shuffle and sort of `run_rewrite` without Spark: every record in memory at once,
    sorted as the Spark tasks sort theirs, written by one task (it takes groups one after
    another, as a Spark task holding several would)."""
    batches = list(decoded)
    if not batches:
        return piece_index.PIECE_SCHEMA.empty_table()
    records = pa.Table.from_batches(batches).sort_by([(c, "ascending") for c in _ORDER]).drop_columns(list(_SORT_ONLY))
    written = write(iter(records.combine_chunks().to_batches()))
    return pa.Table.from_batches(list(written), _SPARK_PIECES).cast(piece_index.PIECE_SCHEMA)

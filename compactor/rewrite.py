"""Phase 2 of the compaction: every record tagged with its slice and group, shuffled by
group in sorted parcels, merged, and written as segment files of consecutive slices, in Spark
tasks. Returns the pieces written, for the index."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import numpy.typing as npt
import pyarrow as pa

from compactor.append import Carried
from compactor.chunks import chunk_rows, read_checked
from compactor.config import Analysis, Prepared
from compactor.errors import CompactionError
from compactor.execution import Execution, Rows, Task
from compactor.group_partitioning import heaviest_first
from compactor.shuffle_codec import pack, unpack
from compactor.slicing import record_slices
from compactor.sources import SourceArchive, SourceChunk
from keygroups import piece_index
from keygroups.assignment import MISSING, cached_assignment, group_sums
from keygroups.envelope.buffers import binary_buffers, take_binary
from keygroups.envelope.encoder import leading_fields
from keygroups.segments import SegmentWriter, Tail
from keygroups.storage import Storage

# What crosses the shuffle is not a record but a *parcel*: one map task's records of one group,
# sorted in piece order and encoded (`envelope.encode_records`), one Arrow IPC message of
# PARCEL_SCHEMA. Spark moves, sorts and hands to Python a few large values per group, not a row
# per record (whose conversions and sort took more than decoding and writing; measured with
# bench_scale: docs/performance.md#parcels-not-rows-through-the-rewrites-shuffle). The write
# task merges a group's parcels.
PARCEL_SCHEMA = pa.schema(
    [
        ("slice", pa.int32()),
        ("order_ts", pa.int64()),
        ("record", pa.large_binary()),  # as the map holds it and the merge needs it: no cast per parcel
    ]
)
# A record's partition, offset and timestamp are the first fields of its encoding: the map sorts
# by them, the write task reads them back from the record (`envelope.encoder.leading_fields`) rather than
# receive them (8% of the parcels' bytes, compressed).
_SORTED = pa.schema(
    [
        ("slice", pa.int32()),
        ("order_ts", pa.int64()),
        ("partition", pa.int32()),
        ("offset", pa.int64()),
        ("timestamp", pa.int64()),
        ("record", pa.large_binary()),
    ]
)
_HELD = pa.schema([("grp", pa.int32()), *_SORTED])
# lo: the parcel's first slice; parcel: packed (shuffle_codec)
PARCELS = pa.schema([("slot", pa.int64()), ("grp", pa.int32()), ("lo", pa.int32()), ("parcel", pa.binary())])
# Record bytes a map task gathers before it sorts them into parcels: 32 KiB per group (so a parcel
# rarely carries less), between 2 and 64 MiB. A small flush sorts in cache, and the
# compaction was faster with it though each write task merges more parcels (measured:
# docs/performance.md#flush-size-of-the-rewrites-map-tasks).
FLUSH_PER_GROUP = 32 << 10
FLUSH_BYTES = (2 << 20, 64 << 20)


def flush_bytes(groups: int) -> int:
    return min(max(groups * FLUSH_PER_GROUP, FLUSH_BYTES[0]), FLUSH_BYTES[1])


# Record bytes in one parcel at most: a write task holds the parcels that reach past the slice it
# writes (one per map flush that straddles it), so this bounds its memory beside the piece.
PARCEL_BYTES = 4 << 20


def _parcels_task(
    source: SourceArchive,
    chunks: list[SourceChunk],
    dest: Storage,
    assignment_key: str,
    duration_ms: int,
    base: int,
    published: int,
    slots: npt.NDArray[np.int64],
    shuffle_codec: str | None = None,
) -> Task:
    """Tags each record with its slice and group, drops records of slices past the
    `published` ones (unsealed: left for a later compaction), and yields the records as parcels
    (PARCELS rows) every `flush_bytes(groups)`, each addressed to its group's shuffle slot
    (`compactor.group_partitioning`)."""

    flush = flush_bytes(len(slots))

    def task(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        assignment = cached_assignment(dest, assignment_key)
        held: list[pa.RecordBatch] = []
        size = 0
        for rows in batches:
            for row in rows.to_pylist():
                chunk = chunks[row["idx"]]
                batch = read_checked(source, chunk, row["from_offset"], encoded=True)
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
                records = batch.column("record")  # large_binary: what is held may pass 2 GiB
                held.append(
                    pa.RecordBatch.from_arrays(
                        [
                            pa.array(grp, pa.int32()),
                            pa.array(slices, pa.int32()),
                            pa.array(order_ts, pa.int64()),
                            batch.column("partition").cast(pa.int32()),
                            batch.column("offset").cast(pa.int64()),
                            pa.array(ts, pa.int64()),
                            records,
                        ],
                        schema=_HELD,  # PARCEL_SCHEMA's types exactly: a parcel is read back by that schema
                    )
                )
                size += records.nbytes
                if size >= flush:
                    yield from _parcels(held, slots, shuffle_codec)
                    held, size = [], 0
        if held:
            yield from _parcels(held, slots, shuffle_codec)

    return task


def _parcels(held: list[pa.RecordBatch], slots: npt.NDArray[np.int64], codec: str | None) -> Iterator[pa.RecordBatch]:
    """The held records sorted by group and piece order, cut at group changes and every
    PARCEL_BYTES, each parcel one Arrow IPC record batch message (PARCEL_SCHEMA, not repeated in
    each): PARCELS rows, in batches of about PARCEL_BYTES (a binary column's offsets are
    32-bit; Spark converts a batch at a time)."""
    table = _sort_by(pa.Table.from_batches(held).combine_chunks(), ("grp", *_PIECE_ORDER))
    grp, slices = table.column("grp").to_numpy(), table.column("slice").to_numpy()
    record_offsets = binary_buffers(table.column("record").chunk(0)).offsets
    ends = record_offsets[1:] - record_offsets[0]  # bytes of the records up to each one
    body = table.select(PARCEL_SCHEMA.names)
    messages: list[bytes | pa.Buffer] = []
    rows: list[tuple[int, int, int]] = []
    size = 0
    a = 0
    for end in np.r_[np.flatnonzero(np.diff(grp)) + 1, len(grp)].tolist():
        while a < end:  # parcels of the group's records [a, end): PARCEL_BYTES at most, one record at least
            before = int(ends[a - 1]) if a else 0
            b = min(max(int(np.searchsorted(ends, before + PARCEL_BYTES, side="right")), a + 1), end)
            # one chunk (`_sort_by` builds it): a slice of it serialises as it is, no concatenation
            messages.append(pack(body.slice(a, b - a).to_batches()[0].serialize(), codec))
            rows.append((int(slots[grp[a]]), int(grp[a]), int(slices[a])))
            size += len(messages[-1])
            a = b
            if size >= PARCEL_BYTES:
                yield _parcel_rows(rows, messages)
                messages, rows, size = [], [], 0
    if rows:
        yield _parcel_rows(rows, messages)


def _parcel_rows(rows: list[tuple[int, int, int]], messages: list[bytes | pa.Buffer]) -> pa.RecordBatch:
    bounds = np.r_[0, np.cumsum([len(m) for m in messages], dtype=np.int64)]
    if bounds[-1] >= 2**31:  # unreachable while PARCEL_BYTES is small: a batch ends once it passes PARCEL_BYTES
        raise RuntimeError(f"{bounds[-1]} bytes of parcels in one batch: more than a binary column holds")
    data = np.concatenate([np.frombuffer(m, np.uint8) for m in messages])
    parcels = pa.Array.from_buffers(
        pa.binary(), len(rows), [None, pa.py_buffer(bounds.astype(np.int32)), pa.py_buffer(data)]
    )
    cols = [pa.array(c, t) for c, t in zip(zip(*rows), (pa.int64(), pa.int32(), pa.int32()))]
    return pa.RecordBatch.from_arrays([*cols, parcels], schema=PARCELS)


class _Pending:
    """The parcels a write task has read whose records it has not written yet, each sorted in
    piece order (so by slice)."""

    def __init__(self) -> None:
        self.parcels: list[tuple[pa.RecordBatch, np.ndarray]] = []  # (records, their slices)
        self.low = np.iinfo(np.int64).max  # the lowest slice held

    def add(self, parcel: pa.RecordBatch) -> None:
        """A parcel (PARCEL_SCHEMA), held with the fields read back from its records (_SORTED)."""
        if parcel.num_rows:
            sl = parcel.column("slice").to_numpy()
            records = parcel.column("record")
            part, off, ts = leading_fields(records)
            columns = [parcel.column("slice"), parcel.column("order_ts"), pa.array(part), pa.array(off), pa.array(ts)]
            self.parcels.append((pa.RecordBatch.from_arrays([*columns, records], schema=_SORTED), sl))
            self.low = min(self.low, int(sl[0]))

    def take_below(self, bound: int | None) -> pa.Table | None:
        """The held records of slices below `bound` (None: all), merged in piece order."""
        if bound is not None and bound <= self.low:
            return None  # the common case, a parcel that starts where the last one did: no scan
        heads, keep = [], []
        for parcel, sl in self.parcels:
            cut = len(sl) if bound is None else int(np.searchsorted(sl, bound, side="left"))
            if cut:
                heads.append(parcel.slice(0, cut))
            if cut < len(sl):
                keep.append((parcel.slice(cut), sl[cut:]))
        self.parcels = keep
        self.low = min((int(sl[0]) for _, sl in keep), default=np.iinfo(np.int64).max)
        if not heads:
            return None
        merged = pa.Table.from_batches(heads).combine_chunks()  # large_binary: a piece may pass 2 GiB
        return _sort_by(merged, _PIECE_ORDER) if len(heads) > 1 else merged


# How a group's records follow each other in its pieces. A slice is a function of the running
# maximum (`record_slices`), so this orders a group's slices too.
_PIECE_ORDER = ("order_ts", "partition", "offset")


def _sort_by(table: pa.Table, keys: tuple[str, ...]) -> pa.Table:
    """The table (the rewrite's columns, one chunk each, no nulls) sorted by `keys`, the first
    the most significant; the record bytes as large_binary. Arrow's sort_by and take copy the
    record bytes item by item through a builder (`take_binary`)."""
    idx = np.lexsort([table.column(k).to_numpy() for k in reversed(keys)])
    return pa.table(
        {
            n: take_binary(c.chunk(0), idx) if n == "record" else pa.array(c.to_numpy()[idx], c.type)
            for n, c in zip(table.column_names, table.columns)
        }
    )


def _write_task(
    dest: Storage,
    run_id: str,
    codec: str,
    block_bytes: int,
    target_bytes: int,
    tails: dict[int, Tail],
    shuffle_codec: str | None = None,
) -> Task:
    """Each task holds whole groups, their parcels sorted by group and first slice: one
    SegmentWriter per group (continuing the group's tail, for an append). Before it reads a
    parcel that starts at slice s, every slice below s is complete in the parcels read so far, so
    those records are merged and written, slice by slice; yields the index rows of the
    pieces written."""

    def task(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        writer: SegmentWriter | None = None
        pending = _Pending()
        finished: set[int] = set()  # groups this task has begun

        def written_rows(writer: SegmentWriter, close: bool = False) -> Iterator[pa.RecordBatch]:
            """Index rows of the pieces in files written since the last call (with `close`,
            the group's last file too)."""
            if close:
                writer.close()
            new = writer.take()
            if new:
                yield piece_index.piece_table(new).cast(_SPARK_PIECES).to_batches()[0]

        def write_below(writer: SegmentWriter, bound: int | None) -> Iterator[pa.RecordBatch]:
            records = pending.take_below(bound)
            if records is None:
                return
            sl = records.column("slice").to_numpy()
            ts = records.column("timestamp").to_numpy()
            data = records.column("record").chunk(0)
            _, offsets, values = data.buffers()
            cuts = np.r_[0, np.flatnonzero(np.diff(sl)) + 1, len(sl)].tolist()
            for a, b in zip(cuts[:-1], cuts[1:]):
                # the piece's records as an array of their own over the same bytes: a slice
                # (an array offset) would be copied before it is compressed (binary_buffers)
                piece = pa.Array.from_buffers(
                    pa.large_binary(), b - a, [None, offsets.slice((data.offset + a) * 8), values]
                )
                writer.add_encoded(int(sl[a]), piece, ts[a:b])
                yield from written_rows(writer)

        for batch in batches:
            groups, lo, parcels = batch.column("grp").to_numpy(), batch.column("lo").to_numpy(), batch.column("parcel")
            for i in range(batch.num_rows):
                g = int(groups[i])
                if writer is None or g != writer.group:  # a new group: a writer of its own
                    if writer is not None:
                        yield from write_below(writer, None)
                        yield from written_rows(writer, close=True)
                    if g in finished:  # the sort keeps a task's groups apart; never write one twice
                        raise RuntimeError(f"group {g} came back after other groups in one rewrite task")
                    finished.add(g)
                    writer = SegmentWriter(
                        dest,
                        g,
                        run_id,
                        codec=codec,
                        block_bytes=block_bytes,
                        target_bytes=target_bytes,
                        tail=tails.get(g),
                    )
                yield from write_below(writer, int(lo[i]))
                pending.add(pa.ipc.read_record_batch(_message(parcels[i].as_buffer(), shuffle_codec), PARCEL_SCHEMA))
        if writer is not None:
            yield from write_below(writer, None)
            yield from written_rows(writer, close=True)

    return task


def _message(parcel: pa.Buffer, codec: str | None) -> pa.Buffer:
    """A parcel's message in memory of its own: its tail may outlive Spark's batch (PARCEL_BATCH_BYTES)."""
    if codec is None:
        return pa.py_buffer(np.frombuffer(parcel, np.uint8).copy())
    return unpack(parcel, codec)


# The index rows as Spark carries them: Spark has no unsigned integers.
_SPARK_PIECES = pa.schema([f.with_type(pa.int64()) if f.type == pa.uint32() else f for f in piece_index.PIECE_SCHEMA])


def rewrite_groups(prepared: Prepared, analysis: Analysis, carried: Carried, execution: Execution[Rows]) -> pa.Table:
    """The pieces written (PIECE_SCHEMA rows), in files named by the run.

    Records are shuffled by group, so one task sees a group's records of every slice in
    order and cuts its segment files at slice boundaries near the target size (files of
    exactly the sizes the layout promises, no small tails from split groups). A task holds
    one file, one piece and the unwritten ends of the parcels that straddle it (`_write_task`).
    An append reads each partition from its hand-off (`Prepared.handoff`) and continues the
    groups' last files (`Carried.tails`). In one process a task holds every group, one after
    another. The tasks are handed the values they use, never `prepared` (its lease is the
    driver's)."""
    cfg, plan, groups = analysis.cfg, analysis.plan, analysis.groups
    source, chunks, dest = prepared.source, prepared.chunks, prepared.dest
    # a task per group, the heaviest started first (the assignment's bytes: an append's too)
    slots = heaviest_first(execution.slots(groups), group_sums(analysis.assignment, "bytes", groups))
    ship = _parcels_task(
        source, chunks, dest, prepared.assignment_key, plan.duration_ms, plan.base, plan.slices, slots, execution.codec
    )
    write = _write_task(
        dest, prepared.run, cfg.codec, cfg.block_bytes, cfg.target_file_bytes, carried.tails, execution.codec
    )
    parcels = execution.map(chunk_rows(chunks, plan.prefix_max, prepared.handoff), ship, PARCELS)
    # an append's tail cut short or missing: the archive's error
    written = execution.shuffle("rewrite", parcels, groups, write, _SPARK_PIECES, ("grp", "lo"), PARCEL_BATCH_BYTES)
    return written.cast(piece_index.PIECE_SCHEMA)


# What Spark hands a write task at once: Spark cuts its Arrow batches at 10,000 rows, which
# for parcels (up to PARCEL_BYTES each) could reach its 2 GiB ceiling per batch.
PARCEL_BATCH_BYTES = 64 << 20

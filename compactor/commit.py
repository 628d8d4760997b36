"""The last phase of the compaction: the piece index, then the version that makes the
archive visible. Checks that the rewrite wrote exactly what the statistics counted."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from compactor.append import Carried
from compactor.config import Analysis, CompactConfig, Prepared
from compactor.errors import CompactionError
from compactor.history import last_records
from compactor.slicing import SlicePlan
from compactor.vacuum import named_files
from keygroups import compacted, piece_index
from keygroups.assignment import assignment_keys, group_sums
from keygroups.compacted import Manifest, SliceMeta
from keygroups.manifest import ArchiveConfig, LastRecord, SourceRef, Totals
from keygroups.piece_index import PieceIndex
from keygroups.segments import Tail
from keygroups.storage import Storage


def slice_metas(plan: SlicePlan, pieces: pa.Table) -> list[SliceMeta]:
    """Bounds, partition ranges, records and bytes of every slice this run published (empty
    slices too)."""
    s = pieces.column("slice").to_numpy()
    records = np.bincount(s, weights=pieces.column("records").to_numpy(), minlength=plan.slices).astype(np.int64)
    nbytes = np.bincount(s, weights=pieces.column("length").to_numpy(), minlength=plan.slices).astype(np.int64)
    if len(records) > plan.slices or records[: plan.first].any():
        raise CompactionError(f"the rewrite wrote slices outside {plan.first}..{plan.slices - 1}")
    metas = []
    for i in range(plan.first, plan.slices):
        start, end = plan.bounds(i)
        ranges = plan.ranges.get(i, [])
        expected = sum(r.records for r in ranges)
        if int(records[i]) != expected:
            raise CompactionError(
                f"slice {i}: wrote {int(records[i])} records, statistics counted {expected} (the source changed "
                "during the compaction?)"
            )
        metas.append(SliceMeta(i, start, end, int(records[i]), int(nbytes[i]), partitions=ranges))
    return metas


@dataclass(frozen=True)
class WrittenIndex:
    """What `write_index` wrote: the index files by name, the index's runs, the slices this
    run published, and for an append the rows of the old index file it rewrote and the
    tails whose rows moved to the new files (`repoint`)."""

    files: dict[str, Any]
    runs: list[list[Any]]
    metas: list[SliceMeta]
    old_pieces: pa.Table | None
    dropped: list[Tail]


def write_index(prepared: Prepared, plan: SlicePlan, carried: Carried, pieces: pa.Table) -> WrittenIndex:
    """The piece index of this run's slices. An append (`prepared.grows`) rewrites the index
    file holding its first new slice with that file's old rows too: `carried.index_rows`
    (read to choose the tails), and `carried.tails`, the tails the rewrite may have
    continued."""
    dest, run, continues = prepared.dest, prepared.run, prepared.grows
    old_pieces = carried.index_rows
    metas = slice_metas(plan, pieces)
    index_slices, index_pieces = piece_index.slice_table(metas), pieces
    runs: list[list[Any]] = [[0, run]]
    dropped: list[Tail] = []
    if continues is not None:
        start = piece_index.file_start(plan.first)
        old = PieceIndex.of(dest, continues)
        old_pieces, dropped = repoint(old_pieces, pieces, carried.tails, run)
        index_slices = pa.concat_tables(
            [old.slice_rows(start, plan.first), index_slices.cast(piece_index.SLICE_SCHEMA)]
        )
        index_pieces = pa.concat_tables([old_pieces, pieces.cast(piece_index.PIECE_SCHEMA)])
        runs = [e for e in continues.index_runs if e[0] < start] + [[start, run]]
    files = piece_index.write_index(dest, index_slices, index_pieces, run)
    return WrittenIndex(files, runs, metas, old_pieces, dropped)


def _totals(
    prior: Totals, analysis: Analysis, index: WrittenIndex, pieces: pa.Table, records: int, payload: int
) -> Totals:
    """The archive's totals: the parent's (an append's), carried on with this run's."""
    plan = analysis.plan
    sizes = file_sizes(pieces)
    filled = [m for m in index.metas if m.records]
    dropped = index.dropped
    return Totals(
        records=records,
        payload_bytes=payload,
        # a continued tail is inside one of this run's files now
        file_bytes=prior.file_bytes - sum(d.file_bytes for d in dropped) + sum(sizes),
        files=prior.files - len(dropped) + len(sizes),
        largest_file_bytes=max([prior.largest_file_bytes, *sizes]),
        pieces=prior.pieces + pieces.num_rows,
        keys=assignment_keys(analysis.assignment),
        partitions=len(plan.handoff),
        slices=plan.slices,
        empty_slices=prior.empty_slices + len(index.metas) - len(filled),
        end_ms=filled[-1].end_ms if filled else prior.end_ms,
        made_late=prior.made_late + plan.made_late,
    )


def archive_config(cfg: CompactConfig, groups: int) -> ArchiveConfig:
    """The settings the version records: the run's, the derived ones settled."""
    if cfg.slice_duration is None:
        raise CompactionError("the slice duration is still to be derived: nothing to record")
    return ArchiveConfig(
        groups=groups,
        slice_duration=cfg.slice_duration,
        slice_duration_ms=cfg.slice_duration_ms,
        codec=cfg.codec,
        block_bytes=cfg.block_bytes,
        target_file_bytes=cfg.target_file_bytes,
        null_keys=cfg.null_keys,
        allow_gaps=cfg.allow_gaps,
        seal_all=cfg.seal_all,
        idle_after=cfg.idle_after,
    )


def write_manifest(prepared: Prepared, analysis: Analysis, carried: Carried, pieces: pa.Table) -> Manifest:
    """The index first (`write_index`), the version last: the archive is visible from then on
    (as version parent + 1; CommitConflict if another writer got there first). `pieces`: what
    the rewrite wrote. An append (`prepared.grows`, the version it grows) carries its parent's
    totals, gaps, runs and index files on."""
    dest, run, parent, continues, lease = prepared.dest, prepared.run, prepared.parent, prepared.grows, prepared.lease
    cfg, plan, groups, assignment = analysis.cfg, analysis.plan, analysis.groups, analysis.assignment
    index = write_index(prepared, plan, carried, pieces)
    prior = continues or _EMPTY
    # what was written: the assignment's counts include an unsealed tail
    group_records = group_sums(pieces, "records", groups) + np.asarray(prior.group_records or 0, np.int64)
    group_bytes = group_sums(assignment, "bytes", groups)
    group_file_bytes = group_sums(pieces, "length", groups) + np.asarray(prior.group_file_bytes or 0, np.int64)
    manifest = Manifest(
        source=prior.source or SourceRef(prepared.source.url, cfg.source_format, cfg.options.kwargs()),
        config=archive_config(cfg, groups),
        topic=prepared.topic,
        groups=groups,
        slice_duration_ms=cfg.slice_duration_ms,
        base=plan.base,
        slices=plan.slices,
        group_records=group_records.tolist(),
        group_payload_bytes=group_bytes.tolist(),
        group_file_bytes=group_file_bytes.tolist(),
        totals=_totals(prior.totals, analysis, index, pieces, int(group_records.sum()), int(group_bytes.sum())),
        handoff=dict(sorted(plan.handoff.items())),
        running_max=dict(sorted(plan.running_max.items())),
        last_records=last_records(plan, prior.last_records),
        held_back=dict(sorted(plan.withheld_by_partition.items())),
        gaps=[*prior.gaps, *plan.gaps],
        version=(parent or 0) + 1,
        parent=parent,
        kind="compact" if continues is None else "append",
        run=run,
        assignment=prepared.assignment_key,
        index_runs=index.runs,
        runs=[*prior.runs, run],
        dropped=[d.key for d in index.dropped],  # this version's only: vacuum reads every version's
    )
    named, _ = named_files(manifest)
    manifest.index_files = {k: v for k, v in {**prior.index_files, **index.files}.items() if k in named}
    manifest.archive = compacted.content_id(manifest) if continues is None else continues.archive
    if lease is not None:
        lease.check()
    check_named(dest, manifest, [pieces, index.old_pieces] if index.old_pieces is not None else [pieces])
    compacted.commit(dest, manifest)
    return manifest


def check_named(dest: Storage, manifest: Manifest, pieces: list[pa.Table]) -> None:
    """Before the version object is created: every object the version names that this run
    wrote or re-pointed exists, segment files at the size the index records. One LIST, not a
    HEAD per file. (The files it shares with its parent are named by the parent, the latest
    version, which vacuum always keeps.) A file deleted meanwhile, by a vacuum or by hand,
    fails the commit instead of publishing a version that cannot be read."""
    present = {o.key: o.size for o in dest.list()}
    named, _ = named_files(manifest)
    named.discard(compacted.version_key(manifest.version))
    wanted: dict[str, int | None] = dict.fromkeys(sorted(named))
    for table in pieces:
        if table.num_rows:
            sizes = _sizes_by_file(table)
            wanted |= dict(zip(sizes.column("file").to_pylist(), sizes.column("file_bytes_max").to_pylist()))
    for key, size in wanted.items():
        found = present.get(key)
        if found is None or (size is not None and found != size):
            what = "missing" if found is None else f"{found} bytes, the index records {size}"
            raise CompactionError(
                f"{dest.url_for(key)}: {what}, yet version {manifest.version} would name it (deleted or replaced "
                "while this run wrote, e.g. by a vacuum); nothing of this run is committed: run it again"
            )


class _Nothing:
    """What a full compaction continues from: nothing."""

    source: SourceRef | None = None
    group_records: list[int] = []
    group_file_bytes: list[int] = []
    totals = Totals()
    gaps: list[str] = []
    runs: list[str] = []
    last_records: dict[int, LastRecord] = {}
    index_files: dict[str, dict[str, Any]] = {}


_EMPTY = _Nothing()


def _sizes_by_file(pieces: pa.Table) -> pa.Table:
    """(file, file_bytes_max): each segment file's size (headers included), once per file."""
    return pieces.group_by("file").aggregate([("file_bytes", "max")])


def file_sizes(pieces: pa.Table) -> list[int]:
    """Each segment file's size (headers included), once per file."""
    if not pieces.num_rows:
        return []
    sizes: list[int] = _sizes_by_file(pieces).column("file_bytes_max").to_pylist()
    return sizes


def repoint(old_rows: pa.Table, pieces: pa.Table, continued: dict[int, Tail], run: str) -> tuple[pa.Table, list[Tail]]:
    """The old index rows with the pieces of the tails this run continued moved to their new
    files (same byte ranges and checksums, the new file's size), and those tails: files
    this version no longer reads (`Manifest.dropped`). Column-wise: the rewritten index
    file holds up to 4,096 slices x groups rows."""
    written = _sizes_by_file(pieces)
    new_size = dict(zip(written.column("file").to_pylist(), written.column("file_bytes_max").to_pylist()))
    # a tail was continued when the group had new records: its new file is among those written
    moved = [(t, compacted.segment_key(g, t.first_slice, run)) for g, t in continued.items()]
    moved = [(t, key) for t, key in moved if key in new_size]
    if not moved:
        return old_rows, []
    at = pc.index_in(old_rows.column("file"), value_set=pa.array([t.key for t, _ in moved], pa.string()))
    hit = pc.is_valid(at)
    files = pc.if_else(hit, pc.take(pa.array([key for _, key in moved], pa.string()), at), old_rows.column("file"))
    sizes_type = old_rows.schema.field("file_bytes").type
    new_sizes = pa.array([new_size[key] for _, key in moved], sizes_type)
    sizes = pc.if_else(hit, pc.take(new_sizes, at), old_rows.column("file_bytes"))
    rows = old_rows.set_column(old_rows.schema.get_field_index("file"), "file", files)
    rows = rows.set_column(rows.schema.get_field_index("file_bytes"), "file_bytes", sizes)
    return rows.cast(old_rows.schema), [t for t, _ in moved]

"""What an append (`keyfill compact --append`) takes from the version it continues: the
layout, where each partition resumes, and the key assignment, which it extends.

An append reads only the source records from the hand-off offsets on, so its cost follows
the new data, not the archive. It keeps the archive's groups, slice grid and identity
(`Manifest.archive`): readers and Spark queries follow it as the same archive, grown.

Existing keys keep their group (a key's records stay in one group across versions, so a
reader's per-key order needs nothing new); new keys are placed where the appended part's
group loads stay lowest (`keygroups.place`, started from the loads the existing keys bring
to the appended part).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from compactor.config import Analysis, CompactConfig, Prepared
from compactor.slicing import Continuation
from compactor.sources import SourceArchive
from keygroups import compacted, piece_index
from keygroups.assignment import MISSING, KeyAssignment, bucket_rows, exact_rows, is_bucket
from keygroups.errors import OptionError
from keygroups.piece_index import PieceIndex
from keygroups.segments import Tail


def continuing(cfg: CompactConfig, parent: compacted.Manifest, source: SourceArchive) -> CompactConfig:
    """`cfg` with the archive's layout; refuses an append the archive cannot take."""
    url = parent.source.url
    if parent.config.seal_all:
        raise OptionError(
            f"version {parent.version} of the archive was compacted with --seal-all (every slice published: no later "
            "record can be placed without making it late); compact the grown source again with --overwrite"
        )
    if url != source.url or parent.source.format != cfg.source_format:
        raise OptionError(
            f"--append: the archive was compacted from {url} ({parent.source.format}), not {source.url} "
            f"({cfg.source_format}); an append continues the same source"
        )
    if cfg.topic not in (None, parent.topic):
        raise OptionError(f"--topic {cfg.topic}: the archive holds topic {parent.topic}")
    if cfg.groups not in (None, parent.groups):
        raise OptionError(f"--groups {cfg.groups}: an append keeps the archive's {parent.groups} groups")
    if cfg.slice_duration is not None and cfg.slice_duration_ms != parent.slice_duration_ms:
        raise OptionError(
            f"--slice-duration {cfg.slice_duration}: an append keeps the archive's slices of "
            f"{parent.config.slice_duration}"
        )
    c = parent.config
    return dataclasses.replace(
        cfg,
        groups=parent.groups,
        slice_duration=c.slice_duration,
        topic=parent.topic,
        source_options=cfg.options.continued(parent.source.options),
        codec=c.codec,
        block_bytes=c.block_bytes,
        target_file_bytes=c.target_file_bytes,
        null_keys=c.null_keys,
        allow_gaps=cfg.allow_gaps or c.allow_gaps,
    )


def continuation(parent: compacted.Manifest) -> Continuation:
    return Continuation(
        base=parent.base,
        slices=parent.slices,
        handoff=dict(parent.handoff),
        running_max=dict(parent.running_max),
    )


def extend_assignment(
    old: pa.Table, totals: pa.Table, groups: int, buckets: pa.Table | None = None
) -> tuple[pa.Table, int]:
    """The assignment with the append's keys: existing keys keep their group, new ones are
    placed onto the appended part's loads. Per-key records and bytes add up what the
    statistics passes counted (packing weights: withheld records are counted by the
    compaction that left it and again by the one that publishes it). A bucketed archive's
    keys without an entry stay in their bucket's group, new keys included: only new null-key
    pseudo-keys are placed (`buckets`: the append's bucket sums, in the archive's bucket
    count). Returns the table and the number of keys placed."""
    import keygroups

    known = KeyAssignment.from_table(old)
    grp = known.group_of(totals.column("key"), totals.column("null_part").to_numpy())
    existing = grp != MISSING
    weights = totals.column("bytes").to_numpy()
    loads = np.bincount(grp[existing], weights=weights[existing], minlength=groups).astype(np.int64)
    bucketed = is_bucket(old)
    old_buckets = old.filter(pa.array(bucketed)).sort_by("bucket")
    if buckets is not None:
        if buckets.num_rows != old_buckets.num_rows:
            raise AssertionError(f"an append's {buckets.num_rows} buckets against the archive's {old_buckets.num_rows}")
        loads += np.bincount(
            old_buckets.column("group").to_numpy(), weights=buckets.column("bytes").to_numpy(), minlength=groups
        ).astype(np.int64)
    new = totals.filter(pa.array(~existing)).sort_by([("null_part", "ascending"), ("key", "ascending")])
    placed = keygroups.place(new.column("bytes").to_numpy(), loads) if new.num_rows else np.zeros(0, np.int32)
    added = pa.concat_tables([exact_rows(totals.filter(pa.array(existing)), grp[existing]), exact_rows(new, placed)])
    old_exact = old.filter(pa.array(~bucketed))
    merged = (
        pa.concat_tables([old_exact, added])
        .group_by(["key", "null_key_partition"], use_threads=False)
        .aggregate([("group", "min"), ("records", "sum"), ("bytes", "sum")])
        .rename_columns({"group_min": "group", "records_sum": "records", "bytes_sum": "bytes"})
        .sort_by([("null_key_partition", "ascending"), ("key", "ascending")])
    )
    null_part = merged.column("null_key_partition").fill_null(-1).to_numpy()
    merged = exact_rows(
        pa.table(
            {
                "key": merged.column("key"),
                "null_part": null_part,
                "bytes": merged.column("bytes"),
                "records": merged.column("records"),
            }
        ),
        merged.column("group").to_numpy(),
    )
    if merged.num_rows != old_exact.num_rows + new.num_rows or int(pc.sum(pc.is_null(merged.column("group"))).as_py()):
        raise AssertionError("assignment merge lost or duplicated keys")
    if old_buckets.num_rows:
        sums = {c: old_buckets.column(c).to_numpy() for c in ("bytes", "records", "keys")}
        if buckets is not None:
            sums = {c: v + buckets.column(c).to_numpy() for c, v in sums.items()}
        grown = pa.table({"bucket": old_buckets.column("bucket"), **sums})
        merged = pa.concat_tables([merged, bucket_rows(grown, old_buckets.column("group").to_numpy())])
    return merged, new.num_rows


def tails(old_rows: pa.Table, start: int, target_bytes: int) -> dict[int, Tail]:
    """Each group's last segment file that the append continues (keygroups.segments): one
    smaller than the target whose pieces all lie in the index file the append rewrites
    anyway (`old_rows`: its rows, slices `start` on), so continuing it re-points only rows
    that are rewritten. A group's older tail stays a file of its own: at most one small file
    per group and index file (4,096 slices), not one per append."""
    if not old_rows.num_rows:
        return {}
    last = old_rows.sort_by([("group", "ascending"), ("slice", "descending")])
    grp = last.column("group").to_numpy()
    first_rows = np.flatnonzero(np.r_[True, grp[1:] != grp[:-1]])
    out = {}
    for row in last.take(pa.array(first_rows)).to_pylist():
        first_slice = compacted.segment_first_slice(row["file"])
        if row["file_bytes"] < target_bytes and first_slice >= start:
            out[row["group"]] = Tail(row["file"], first_slice, row["file_bytes"], row["file_header"])
    return out


@dataclass(frozen=True)
class Carried:
    """What an append carries over from the version it grows into both its rewrite and its
    commit: the rows of the index file it rewrites (`index_rows`: that file's slices before
    the first new one) and the groups' last files it continues (`tails`). One object, read
    once, because the two phases must agree on it: the rewrite writes after those tails and
    the commit re-points their rows. A full compaction carries nothing."""

    index_rows: pa.Table | None = None  # None: a full compaction, no index file rewritten
    tails: dict[int, Tail] = field(default_factory=dict)


def carry_over(prepared: Prepared, analysis: Analysis) -> Carried:
    """What the run carries over (`Carried`): nothing, unless it appends."""
    if prepared.grows is None:
        return Carried()
    first = analysis.plan.first
    start = piece_index.file_start(first)
    rows = PieceIndex.of(prepared.dest, prepared.grows).piece_rows(start, first)
    return Carried(rows, tails(rows, start, analysis.cfg.target_file_bytes))

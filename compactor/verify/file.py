"""The audit's check of one segment file on its own (`keyfill verify`): size, the pieces'
tiling, byte ranges, CRC-32C and record counts, key order, group membership, slice offset
ranges. Run per file by the audit's read task (`compactor.verify.records`), in this process or
on Spark."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from keygroups import compacted, envelope
from keygroups.assignment import MISSING, KeyAssignment, load_assignment
from keygroups.batch_join import join_batches
from keygroups.compacted import Piece
from keygroups.errors import ObjectNotFound
from keygroups.storage import Storage


def _key_order_violations(batch: pa.RecordBatch) -> list[str]:
    """Keys (null keys per partition) whose records are not in offset order in the file."""
    if batch.num_rows < 2:
        return []
    enc = pc.dictionary_encode(batch.column("key"))
    kid = enc.indices.fill_null(-1).to_numpy(zero_copy_only=False).astype(np.int64)
    part = batch.column("partition").to_numpy().astype(np.int64)
    off = batch.column("offset").to_numpy()
    pos = np.arange(batch.num_rows)
    order = np.lexsort((pos, kid, part))
    same = (kid[order][1:] == kid[order][:-1]) & (part[order][1:] == part[order][:-1])
    bad = np.flatnonzero(same & (off[order][1:] <= off[order][:-1]))
    out = []
    for i in bad[:3].tolist():
        a, b = order[i], order[i + 1]
        key = batch.column("key")[int(a)].as_py()
        out.append(f"key {key!r} (partition {part[a]}): offset {off[b]} follows {off[a]}")
    return out


class FileChecker:
    """Checks one segment file on its own: size, the pieces' tiling, byte ranges, CRC-32C and
    record counts, key order, group membership, slice offset ranges. Picklable, so Spark
    tasks can run it."""

    def __init__(self, dest: Storage, manifest: compacted.Manifest):
        self.dest = dest
        self.manifest = manifest
        self.assignment = KeyAssignment.from_table(load_assignment(dest, manifest.assignment))

    def __call__(
        self, key: str, pieces: list[Piece], ranges: dict[int, list[compacted.PartitionRange]]
    ) -> tuple[pa.RecordBatch, np.ndarray, list[tuple[str, str]]]:
        """(records, the start of each record's slice, problems)."""
        dest = self.dest
        problems: list[tuple[str, str]] = []
        name = dest.url_for(key)
        try:
            data = dest.read(key)
        except ObjectNotFound as exc:  # the archive lacks a file it names; any other StorageError
            # (a timeout, a refused request) says nothing of the archive: it ends the audit
            problems.append(("checksums", f"{name}: {exc}"))
            return envelope.empty_batch(), np.zeros(0, np.int64), problems
        size = pieces[0].file_bytes
        if len(data) != size:
            problems.append(("checksums", f"{name}: {len(data)} bytes, the index says {size}"))
        at = pieces[0].file_header
        batches, tags = [], []
        group = pieces[0].group
        for p in pieces:
            if p.offset != at or p.group != group or p.file_bytes != size or p.file_header != pieces[0].file_header:
                problems.append(("checksums", f"{p.where(name)}: does not follow the previous piece (at byte {at})"))
            at = p.end
            try:
                batch = compacted.read_piece(data[: p.file_header], data[p.offset : p.end], p, name)
            except compacted.FormatError as exc:
                problems.append(("checksums", str(exc)))
                continue
            batches.append(batch)
            tags.append(np.full(batch.num_rows, self.manifest.bounds(p.slice)[0], np.int64))
            problems += self._slice_bounds(p, batch, ranges.get(p.slice, []), name)
        if at != size:
            problems.append(("checksums", f"{name}: the pieces end at byte {at}, the file at {size}"))
        if not batches:
            return envelope.empty_batch(), np.zeros(0, np.int64), problems
        batch = join_batches(batches)
        problems += [("key_order", f"{name}: {v}") for v in _key_order_violations(batch)]
        problems += self._membership(batch, group, name)
        return batch, np.concatenate(tags), problems

    def _membership(self, batch: pa.RecordBatch, group: int, name: str) -> list[tuple[str, str]]:
        problems = []
        keys = batch.column("key")
        null = keys.is_null().to_numpy(zero_copy_only=False)
        parts = batch.column("partition").to_numpy()
        grp = self.assignment.group_of(keys, parts)
        missing = ~null & (grp == MISSING)
        if missing.any():
            problems.append(("key_order", f"{name}: {int(missing.sum())} records with keys not in the assignment"))
        elif (grp[~null] != group).any():
            problems.append(("key_order", f"{name}: holds keys the assignment puts in other groups"))
        for p in np.unique(parts[null]).tolist():
            if self.assignment.null_groups.get(p) != group:
                problems.append(
                    (
                        "key_order",
                        f"{name}: null-key records of partition {p} belong to group "
                        f"{self.assignment.null_groups.get(p)}",
                    )
                )
        return problems

    @staticmethod
    def _slice_bounds(
        piece: Piece, batch: pa.RecordBatch, ranges: list[compacted.PartitionRange], name: str
    ) -> list[tuple[str, str]]:
        problems = []
        by_partition = {r.partition: r for r in ranges}
        parts = batch.column("partition").to_numpy()
        offsets = batch.column("offset").to_numpy()
        for p in np.unique(parts).tolist():
            r = by_partition.get(p)
            o = offsets[parts == p]
            if r is None or o.min() < r.first_offset or o.max() > r.last_offset:
                allowed = "none" if r is None else f"{r.first_offset}..{r.last_offset}"
                problems.append(
                    (
                        "slice_bounds",
                        f"{piece.where(name)}: partition {p} offsets {o.min()}..{o.max()} outside the slice's "
                        f"range {allowed}",
                    )
                )
        return problems

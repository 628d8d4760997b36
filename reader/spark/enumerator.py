"""The Spark source's archive phase, planned on the driver: which slices a micro-batch takes
(`ArchivePlanner.admit`) and their pieces bundled by group into input partitions
(`GroupsPartition`). Its roles apart, as a FLIP-27 source splits them: this module
enumerates the archive, `reader.spark.live` the live topic after it, `reader.spark.split_reader`
reads either in a task, and `reader.spark` adapts the three to PySpark's Data Source API."""

from __future__ import annotations

import heapq
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np

from keygroups import compacted, handoff
from keygroups.errors import ObjectNotFound
from keygroups.piece_index import PieceIndex, piece_list, row_group_of, row_group_start
from keygroups.storage import Storage, open_storage
from reader.errors import ArchiveChanged, DataSourceOptionError, VersionGone
from reader.memory import bounded_read_ahead
from reader.spark.api import InputPartition
from reader.spark.options import PACED_WITHOUT_START, Options
from reader.spark.pushdown import Pushdown
from reader.time_bounds import OffsetBounds, ScanReads, offset_bounds, partition_times

NAME = "keyfill"


@dataclass(frozen=True)
class GroupsPartition(InputPartition):
    """One Spark input partition: some key groups' pieces over a range of slices, group by
    group, each group's in slice order (the order they are read in)."""

    pieces: tuple[compacted.Piece, ...]
    topic: str = ""  # the archive's topic: the rows' `topic`
    bounds: OffsetBounds | None = None  # a time-bounded read: the offsets of each partition it delivers


# Compacted bytes a core past which a batch gets more input partitions than cores (a batch
# read of a whole archive): a failed task re-reads about this much. A streaming micro-batch
# (512 MiB by default) stays at one task per core.
TASK_BYTES = 1 << 30


@dataclass(frozen=True)
class Limits:
    """A micro-batch's admission limits over the archive (None: no limit of that kind)."""

    slices: int | None = None
    bytes: int | None = None
    rows: int | None = None


class ArchivePlanner:
    """The driver's view of the archive: the manifest of the version being planned, and index
    rows as planning needs them (a version never changes; `refresh` moves to a newer one).
    It lives in the planning process only: a task is given the options, never this."""

    def __init__(self, opts: Options):
        self.opts = opts
        self._store: Storage | None = None
        self._manifest: compacted.Manifest | None = None
        self._index: PieceIndex | None = None
        self._bounds: tuple[int, OffsetBounds | None] | None = None  # (version, bounds)

    @property
    def store(self) -> Storage:
        if self._store is None:
            self._store = open_storage(self.opts.path)
        return self._store

    @property
    def manifest(self) -> compacted.Manifest:
        if self._manifest is None:
            self._manifest = compacted.load_manifest(self.store)
            if self.opts.starting_slice > self._manifest.slices:
                raise DataSourceOptionError(
                    f"option startingSlice={self.opts.starting_slice}: {self.store.url} has "
                    f"{self._manifest.slices} slices"
                )
        return self._manifest

    def refresh(self) -> compacted.Manifest:
        """Move to the latest version if one was committed since: an append's slices become
        plannable. A newer version of another archive is loaded too; `position` then refuses
        the query's offsets."""
        current = self.manifest
        latest = compacted.versions(self.store)
        if latest and latest[-1] > current.version:
            self._manifest = compacted.load_manifest(self.store, latest[-1])
            self._index = None
        return self.manifest

    @property
    def index(self) -> PieceIndex:
        if self._index is None:
            self._index = PieceIndex.of(self.store, self.manifest)
        return self._index

    @property
    def fingerprint(self) -> str:
        """The archive's id, in every offset, so a checkpoint cannot silently resume against a
        recompacted archive (equal inputs and config give equal ids)."""
        return self.manifest.archive

    def offset(self, s: int) -> dict[str, Any]:
        return {"slice": s, "archive": self.fingerprint, "version": self.manifest.version}

    def position(self, offset: dict[str, Any]) -> int:
        """The slice of an offset of this archive."""
        if offset.get("archive") != self.fingerprint:
            raise ArchiveChanged(
                f"{self.store.url}: the query's checkpoint holds offsets of archive {offset.get('archive')}, but this "
                f"archive is {self.fingerprint} (recompacted since?). Restart the query with a new checkpoint "
                "location, or point it at the archive it started on."
            )
        if int(offset["slice"]) > self.manifest.slices:
            raise ArchiveChanged(
                f"{self.store.url}: the query's checkpoint is at slice {offset['slice']} of version "
                f"{offset.get('version')}, but version {self.manifest.version} has {self.manifest.slices} slices"
            )
        return int(offset["slice"])

    def manifest_of(self, version: int) -> compacted.Manifest:
        """The manifest of `version` (a version never changes)."""
        if version == self.manifest.version:
            return self.manifest
        return compacted.load_manifest(self.store, version)

    @property
    def topic(self) -> str:
        """The topic the time options and the live phase name (`subscribe`, else the archive's)."""
        return (self.opts.kafka and self.opts.kafka.topic) or self.manifest.topic

    def paced_start_ms(self) -> int:
        """The earliest starting time of a paced read (`Options.parse` refuses pacing without one)."""
        times = self.times("starting")
        if times is None:
            raise DataSourceOptionError(PACED_WITHOUT_START)
        return min(times.values())

    @property
    def bounds(self) -> OffsetBounds | None:
        """The offsets the time options select, on this version (None: no time bound)."""
        if self._bounds is None or self._bounds[0] != self.manifest.version:
            starting, ending = self.times("starting"), self.times("ending")
            found = None
            if starting is not None or ending is not None:
                reads = ScanReads(bounded_read_ahead(self.opts.read_ahead_bytes, 1), self.opts.range_bytes)
                found = offset_bounds(self.index, self.manifest, reads, starting, ending)
            self._bounds = (self.manifest.version, found)
        return self._bounds[1]

    def times(self, which: str) -> dict[int, int] | None:
        """Partition -> the `which` ("starting" or "ending") time in ms, from the options."""
        o = self.opts
        per = getattr(o, f"{which}_offsets_by_timestamp")
        single = getattr(o, f"{which}_timestamp")
        partitions = sorted(handoff.offsets(self.manifest))
        return partition_times(f"{which}OffsetsByTimestamp", single, per, self.topic, partitions)

    def first_slice(self) -> int:
        """Where a read starts: startingSlice, or the first slice a time bound lets in."""
        return max(self.opts.starting_slice, self.bounds.first_slice if self.bounds else 0)

    def end_slice(self) -> int:
        """Past the last slice a read takes from this version."""
        return min(self.manifest.slices, self.bounds.end_slice) if self.bounds else self.manifest.slices

    def admit(self, first: int, slices: int, limits: Limits) -> int:
        """Where a micro-batch from slice `first` ends: past the most slices within every
        limit, but at least one slice with records, however large; empty slices are free."""
        if limits == Limits():
            return slices
        end, taken, nbytes, rows = first, 0, 0, 0
        while end < slices:
            row_group_end = min(slices, row_group_start(row_group_of(end) + 1))  # sizes a row group at a time
            for n, b in zip(*(x.tolist() for x in self.slice_sizes(end, row_group_end))):
                if n:
                    over = (
                        (limits.slices is not None and taken + 1 > limits.slices)
                        or (limits.bytes is not None and nbytes + b > limits.bytes)
                        or (limits.rows is not None and rows + n > limits.rows)
                    )
                    if over and taken:
                        return end
                    taken, nbytes, rows = taken + 1, nbytes + b, rows + n
                end += 1
        return end

    @contextmanager
    def _version_kept(self) -> Iterator[None]:
        """An index object missing while this version is planned: VersionGone when the version
        itself was deleted meanwhile (a vacuum; a query with AvailableNow stays on the version
        it started on), else the store's own error."""
        try:
            yield
        except ObjectNotFound as exc:
            latest = compacted.versions(self.store)
            if not latest or self.manifest.version in latest:
                raise
            raise VersionGone.of(exc.url, latest[-1]) from None

    def slice_sizes(self, first: int, end: int) -> tuple[np.ndarray, np.ndarray]:
        """Records and bytes of slices [first, end), from the slice index alone."""
        with self._version_kept():
            rows = self.index.slice_rows(first, end)
        return rows.column("records").to_numpy(), rows.column("bytes").to_numpy()

    def plan(self, first: int, end: int, pushed: Pushdown | None = None) -> list[GroupsPartition]:
        """Input partitions for slices [first, end): `numPartitions` bundles of groups
        balanced by bytes (a group is never split: its records keep their order), by default
        `partitions_for` them; only the pieces that can hold a match of `pushed` filters."""
        by_group: dict[int, list[compacted.Piece]] = {}
        with self._version_kept():
            table = self.index.piece_rows(first, end)
        if pushed is not None:
            table = pushed.pieces(table)
        for p in piece_list(table):
            p.check(self.manifest.groups, self.store.url_for)
            by_group.setdefault(p.group, []).append(p)
        groups = sorted(by_group)
        if not groups:
            return []
        weights = [sum(p.length for p in by_group[g]) for g in groups]
        bundles = min(self.opts.num_partitions or self.partitions_for(sum(weights), len(groups)), len(groups))
        owner = balance(weights, bundles)
        parts = []
        for b in range(bundles):
            mine = tuple(p for i, g in enumerate(groups) if owner[i] == b for p in by_group[g])
            if mine:
                parts.append(GroupsPartition(mine, self.manifest.topic, self.bounds))
        return parts

    def partitions_for(self, total_bytes: int, groups: int) -> int:
        """The default number of input partitions: the session's cores, or a multiple of
        them when the batch holds over TASK_BYTES a core (so every wave of tasks is full),
        at most one per group. A task per group paid its fixed costs (a Python task on
        Spark, its first GETs waiting with nothing to overlap them) once per group, and more
        tasks than cores read fewer rows/s (docs/spark-source.md#input-partitions). Without
        the session's cores (Spark Connect), one per group."""
        cores = self.opts.session_cores
        if cores is None:
            return groups
        return cores * max(1, -(-total_bytes // (cores * TASK_BYTES)))


def balance(weights: list[int], bundles: int) -> list[int]:
    """The bundle of each weight: the heaviest first, each into the lightest bundle so far
    (greedy LPT, at most 4/3 of the best possible heaviest bundle). Not keygroups' packing:
    it loads numba and its kernels, 0.3 s of every streaming query's start in the process
    that plans it, to balance a few hundred groups over a handful of tasks."""
    loads = [(0, b) for b in range(bundles)]
    owner = [0] * len(weights)
    for i in sorted(range(len(weights)), key=lambda i: (-weights[i], i)):
        load, b = heapq.heappop(loads)
        owner[i] = b
        heapq.heappush(loads, (load + weights[i], b))
    return owner

"""The Spark source's input partitions, without Spark's reader classes, planned on the
driver (`SourcePlanner`: whole slices of the archive per micro-batch, their pieces bundled
by group into `GroupsPartition`s, then the live topic's offset ranges); `reader.spark_read`
reads them in a task, `reader.spark` adapts both to PySpark's Data Source API."""

from __future__ import annotations

import heapq
from dataclasses import dataclass
from typing import Any

import numpy as np
from pyspark.sql.datasource import InputPartition

from keygroups import compacted, handoff
from keygroups.errors import KeyfillError
from keygroups.piece_index import PieceIndex, piece_list
from keygroups.storage import Storage, open_storage
from reader.errors import ArchiveChanged, SourceOptionError
from reader.kafka_live import (
    KafkaOptions,
    KafkaRange,
    check_available,
    offsets_at_times,
    partition_marks,
    plan_ranges,
)
from reader.memory import bounded_read_ahead
from reader.pushdown import Pushdown
from reader.spark_options import PACED_WITHOUT_START, Options
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


class SourcePlanner:
    """Driver-side view of the archive: the manifest of the version being planned, and index
    rows as planning needs them (a version never changes; `refresh` moves to a newer one)."""

    def __init__(self, opts: Options):
        self.opts = opts
        self._store: Storage | None = None
        self._manifest: compacted.Manifest | None = None
        self._index: PieceIndex | None = None
        self._bounds: tuple[int, OffsetBounds | None] | None = None  # (version, bounds)
        self._found: dict[tuple[str, int], int] = {}  # ("start" | "end", partition) -> offset in the topic

    def __getstate__(self) -> dict[str, Any]:  # read() needs only the options
        return {"opts": self.opts, "_store": None, "_manifest": None, "_index": None, "_bounds": None, "_found": {}}

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
                raise SourceOptionError(
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
        return (self.opts.kafka and self.opts.kafka.topic) or self.manifest.topic

    @property
    def kafka(self) -> KafkaOptions:
        """The live phase's settings: only a read with kafka.* options plans a live phase."""
        if self.opts.kafka is None:
            raise KeyfillError(f"{self.opts.path}: no kafka.* options, so no live phase to read")
        return self.opts.kafka

    def paced_start_ms(self) -> int:
        """The earliest starting time of a paced read (`Options.parse` refuses pacing without one)."""
        times = self.times("starting")
        if times is None:
            raise SourceOptionError(PACED_WITHOUT_START)
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

    def goes_live(self) -> bool:
        """With kafka.* options, unless an ending time falls within the archive everywhere."""
        b = self.bounds
        return self.opts.kafka is not None and not (b and b.ends_in_archive(handoff.offsets(self.manifest)))

    def switch_offsets(self, version: int) -> dict[int, int]:
        """Where the live phase starts: the hand-off of `version`, or for a partition whose
        starting time lies past it, its first offset at or after that time in the topic (none
        yet: the partition's end now, as the Kafka source's startingOffsetsByTimestampStrategy=latest)."""
        out = handoff.offsets(self.manifest_of(version))
        late = self.bounds.live_starts_ms if self.bounds else {}
        if late:
            high = {p: h for p, (_, h) in partition_marks(self.kafka, self.topic).items()}
            for p, o in self._found_at("start", late, out, high).items():
                out[p] = max(out.get(p, 0), high.get(p, 0) if o is None else o)
        return out

    def _found_at(
        self, kind: str, times: dict[int, int], starts: dict[int, int], high: dict[int, int]
    ) -> dict[int, int | None]:
        """`offsets_at_times` of the topic, each partition's answer kept once found (it never
        changes: records are only added after it)."""
        known = {p: self._found.get((kind, p)) for p in times}
        asked = {p: t for p, t in times.items() if known[p] is None}
        for p, o in offsets_at_times(self.kafka, self.topic, asked, starts, high).items():
            if o is not None:
                self._found[(kind, p)] = known[p] = o
        return known

    def live_ends(self, marks: dict[int, tuple[int, int]]) -> dict[int, int]:
        """Per partition, where an ending time stops the live phase (a partition it stops
        within the archive: at the hand-off); a partition without: the topic's end now."""
        end = {p: high for p, (_, high) in marks.items()}
        b = self.bounds
        if b is None or self.opts.kafka is None:
            return end
        hand = handoff.offsets(self.manifest)
        for p in b.ends:
            if p in end:
                end[p] = min(end[p], hand.get(p, 0))
        for p, o in self._found_at("end", b.live_ends_ms, hand, dict(end)).items():
            if o is not None and p in end:
                end[p] = min(end[p], o)
        return end

    def live_positions(self, offset: dict[str, Any], end: dict[str, Any] | None = None) -> dict[int, int]:
        """The Kafka offsets an offset stands for: its own in the live phase; at the switch,
        the hand-off of the version the first live offset (`end`) was planned on."""
        if "kafka" in offset:
            return {int(p): int(o) for p, o in offset["kafka"].items()}
        start = self.switch_offsets(int((end or offset)["version"]))
        for p, o in (end or {}).get("kafka", {}).items():
            # at most the end planned: a start the broker resolved by time stays what it was then
            start[int(p)] = min(start.get(int(p), 0), int(o))
        return start

    def live_ranges(self, start: dict[str, Any], end: dict[str, Any]) -> list[KafkaRange]:
        """Input partitions for the live offsets between two offsets: one per Kafka partition
        (or more with minPartitions), each checked against what the topic still holds."""
        k = self.kafka
        first = self.live_positions(start, end)
        last = {int(p): int(o) for p, o in end["kafka"].items()}
        marks = partition_marks(k, self.topic)
        wanted = {p: first.get(p, 0) for p in set(first) | set(last)}
        first = check_available(self.topic, wanted, marks, k.fail_on_data_loss)
        return plan_ranges(self.topic, first, last, k.min_partitions, self.manifest.assignment)

    def slice_sizes(self, first: int, end: int) -> tuple[np.ndarray, np.ndarray]:
        """Records and bytes of slices [first, end), from the slice index alone."""
        rows = self.index.slice_rows(first, end)
        return rows.column("records").to_numpy(), rows.column("bytes").to_numpy()

    def plan(self, first: int, end: int, pushed: Pushdown | None = None) -> list[GroupsPartition]:
        """Input partitions for slices [first, end): `numPartitions` bundles of groups
        balanced by bytes (a group is never split: its records keep their order), by default
        `partitions_for` them; only the pieces that can hold a match of `pushed` filters."""
        by_group: dict[int, list[compacted.Piece]] = {}
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
        owner = balanced(weights, bundles)
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


def balanced(weights: list[int], bundles: int) -> list[int]:
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

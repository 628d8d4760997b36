"""The Spark source's live phase, planned on the driver: where it starts (the hand-off of the
version read last, or a starting time past it), how far each micro-batch reads, and its
offset ranges as input partitions (`reader.kafka_live.KafkaRange`). The archive it follows
is `reader.spark.enumerator.ArchivePlanner`'s; a task reads a range with
`reader.spark.split_reader.read_live` (docs/kafka-live.md)."""

from __future__ import annotations

from typing import Any

from keygroups import handoff
from keygroups.errors import KeyfillError
from reader.kafka_live import (
    KafkaOptions,
    KafkaRange,
    cap_ends,
    check_available,
    offsets_at_times,
    partition_marks,
    plan_ranges,
)
from reader.spark.enumerator import ArchivePlanner


class LivePlanner:
    """The topic after the archive: its offsets per micro-batch, and what the broker answered
    that never changes (the first offset at or after a time, once found)."""

    def __init__(self, archive: ArchivePlanner):
        self.archive = archive
        self.marks: dict[int, tuple[int, int]] = {}  # partition -> (low, high), as last asked
        self._found: dict[tuple[str, int], int] = {}  # ("start" | "end", partition) -> offset in the topic

    @property
    def kafka(self) -> KafkaOptions:
        """The live phase's settings: only a read with kafka.* options plans a live phase."""
        opts = self.archive.opts
        if opts.kafka is None:
            raise KeyfillError(f"{opts.path}: no kafka.* options, so no live phase to read")
        return opts.kafka

    def goes_live(self) -> bool:
        """With kafka.* options, unless an ending time falls within the archive everywhere."""
        b = self.archive.bounds
        return self.archive.opts.kafka is not None and not (
            b and b.ends_in_archive(handoff.offsets(self.archive.manifest))
        )

    def switch_offsets(self, version: int) -> dict[int, int]:
        """Where the live phase starts: the hand-off of `version`, or for a partition whose
        starting time lies past it, its first offset at or after that time in the topic (none
        yet: the partition's end now, as the Kafka source's startingOffsetsByTimestampStrategy=latest)."""
        out = handoff.offsets(self.archive.manifest_of(version))
        b = self.archive.bounds
        late = b.live_starts_ms if b else {}
        if late:
            high = {p: h for p, (_, h) in partition_marks(self.kafka, self.archive.topic).items()}
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
        for p, o in offsets_at_times(self.kafka, self.archive.topic, asked, starts, high).items():
            if o is not None:
                self._found[(kind, p)] = known[p] = o
        return known

    def ends(self, marks: dict[int, tuple[int, int]]) -> dict[int, int]:
        """Per partition, where an ending time stops the live phase (a partition it stops
        within the archive: at the hand-off); a partition without: the topic's end now."""
        end = {p: high for p, (_, high) in marks.items()}
        b = self.archive.bounds
        if b is None or self.archive.opts.kafka is None:
            return end
        hand = handoff.offsets(self.archive.manifest)
        for p in b.ends:
            if p in end:
                end[p] = min(end[p], hand.get(p, 0))
        for p, o in self._found_at("end", b.live_ends_ms, hand, dict(end)).items():
            if o is not None and p in end:
                end[p] = min(end[p], o)
        return end

    def positions(self, offset: dict[str, Any], end: dict[str, Any] | None = None) -> dict[int, int]:
        """The Kafka offsets an offset stands for: its own in the live phase; at the switch,
        the hand-off of the version the first live offset (`end`) was planned on."""
        if "kafka" in offset:
            return {int(p): int(o) for p, o in offset["kafka"].items()}
        start = self.switch_offsets(int((end or offset)["version"]))
        for p, o in (end or {}).get("kafka", {}).items():
            # at most the end planned: a start the broker resolved by time stays what it was then
            start[int(p)] = min(start.get(int(p), 0), int(o))
        return start

    def latest(
        self, start: dict[str, Any], at: dict[str, Any], most: int | None, target: dict[int, int] | None
    ) -> dict[str, Any]:
        """The next live offset from `at`, at most `most` records past it and never past
        `target` (Trigger.AvailableNow's); `start` itself when the topic has nothing new."""
        k = self.kafka
        topic = self.archive.topic
        marks = self.marks = partition_marks(k, topic)
        positions = {int(p): int(o) for p, o in at["kafka"].items()}
        for p in marks:
            positions.setdefault(p, 0)  # a partition added since the archive, or while the query runs
        positions = check_available(topic, positions, marks, k.fail_on_data_loss)
        ends = self.ends(marks)
        latest = {p: max(positions[p], ends.get(p, marks[p][1])) for p in positions}
        if target is not None:
            latest = {p: max(positions[p], min(latest[p], target.get(p, 0))) for p in positions}
        end = cap_ends(positions, latest, most)
        if "kafka" in start and end == {int(p): int(o) for p, o in start["kafka"].items()}:
            return start
        if "kafka" not in start and end == positions:
            return start  # nothing live yet: stay at the archive's end, no empty batch
        return at | {"kafka": {str(p): o for p, o in sorted(end.items())}}

    def ranges(self, start: dict[str, Any], end: dict[str, Any]) -> list[KafkaRange]:
        """Input partitions for the live offsets between two offsets: one per Kafka partition
        (or more with minPartitions), each checked against what the topic still holds."""
        k = self.kafka
        topic = self.archive.topic
        first = self.positions(start, end)
        last = {int(p): int(o) for p, o in end["kafka"].items()}
        marks = partition_marks(k, topic)
        wanted = {p: first.get(p, 0) for p in set(first) | set(last)}
        first = check_available(topic, wanted, marks, k.fail_on_data_loss)
        return plan_ranges(topic, first, last, k.min_partitions, self.archive.manifest.assignment)

"""What a compaction is asked to do (`CompactConfig`, checked once, at the boundary), what a
run settles before it rewrites anything (`Prepared`, `Analysis`: what its phases are handed)
and what it reports (`CompactResult`)."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from compactor import defaults
from compactor.sources import SourceArchive, SourceChunk, SourceOptions, source_class, source_options
from keygroups import bounds, compacted, envelope
from keygroups.bounds import within
from keygroups.durations import parse_duration
from keygroups.errors import OptionError
from keygroups.storage import Storage

if TYPE_CHECKING:  # the phases' state types: `import compactor.config` loads no Spark-side module
    from compactor.lease import Lease
    from compactor.slicing import Continuation, SlicePlan
    from compactor.statistics import Statistics

NULL_KEY_POLICIES = ("partition",)


@dataclass(frozen=True)
class CompactConfig:
    source: str
    dest: str
    groups: int | None = None  # None: derived from the statistics (compactor.defaults)
    slice_duration: str | None = None  # None: derived from the statistics (compactor.slice_length)
    source_format: str = defaults.SOURCE_FORMAT
    # The format's own options by name, e.g. {"timestamp_field": "ts"} for kafka-connect;
    # held as the format's options object (`KafkaConnectOptions`) once checked.
    source_options: Mapping[str, Any] | SourceOptions = field(default_factory=dict)
    topic: str | None = None
    codec: str = defaults.CODEC
    block_bytes: int = defaults.BLOCK_BYTES
    target_file_bytes: int = defaults.TARGET_FILE_BYTES
    allow_gaps: bool = False
    seal_all: bool = False  # publish every slice, sealed or not (a topic that will not grow)
    idle_after: str | None = None  # a partition this far behind the newest does not hold the seal back
    overwrite: bool = False
    append: bool = False  # continue the archive at DEST from its hand-off offsets
    threads: int = defaults.IO_THREADS
    null_keys: str = "partition"
    max_held_back: float | None = None  # fail, committing nothing, when a larger share of records would be held back
    exact_keys: int | None = None  # distinct keys up to which every key gets an exact entry (None: the bucket count)

    def __post_init__(self) -> None:
        if self.groups is not None:
            within("--groups", self.groups, 1, bounds.MAX_GROUPS, "a segment file and an index row per slice each")
        within("--target-file-bytes", self.target_file_bytes, 4096, bounds.MAX_TARGET_FILE_BYTES)
        within("--block-bytes", self.block_bytes, 1024, bounds.MAX_BLOCK_BYTES)
        within("--threads", self.threads, 1, bounds.MAX_THREADS)
        if self.exact_keys is not None:
            within("--exact-keys", self.exact_keys, 0, 2**62, "keys with an exact entry in the assignment")
        if self.codec not in envelope.CODECS:
            raise OptionError(f"--codec must be one of {', '.join(envelope.CODECS)}")
        object.__setattr__(self, "source_options", source_options(self.source_format, self.source_options))
        if self.null_keys not in NULL_KEY_POLICIES:
            raise OptionError(f"--null-keys must be one of {', '.join(NULL_KEY_POLICIES)}")
        if self.slice_duration is not None:
            within("--slice-duration", parse_duration(self.slice_duration), 1, bounds.MAX_DURATION_MS)
        if self.idle_after is not None:
            within("--idle-after", parse_duration(self.idle_after, option="--idle-after"), 1, bounds.MAX_DURATION_MS)
        if self.max_held_back is not None and not 0 <= self.max_held_back <= 1:
            raise OptionError(f"--max-held-back {self.max_held_back}: must be a fraction between 0 and 1")
        if self.append and self.overwrite:
            raise OptionError("--append and --overwrite exclude each other: one grows the archive, one replaces it")

    @property
    def slice_duration_ms(self) -> int:
        if self.slice_duration is None:
            raise AttributeError("the slice duration is derived from the statistics: not known yet")
        return parse_duration(self.slice_duration)

    @property
    def idle_after_ms(self) -> int | None:
        return None if self.idle_after is None else parse_duration(self.idle_after, option="--idle-after")

    @property
    def options(self) -> SourceOptions:
        """`source_options` as `__post_init__` checked them: the format's options object."""
        assert isinstance(self.source_options, SourceOptions)
        return self.source_options

    def open_source(self) -> SourceArchive:
        return source_class(self.source_format).open(self.source, self.options, threads=self.threads)


@dataclass
class Prepared:
    """What a compaction settles before Spark starts (`compactor.job.prepare`): the options,
    the source's chunks, the destination's latest version and the run's lease. Every check
    here fails in seconds, not after a Spark start-up and a statistics pass. The phases after
    it (`analyse`, the rewrite, the commit) take it whole rather than its fields one by one."""

    cfg: CompactConfig  # an append's: with the archive's layout (the slice length may be unknown yet)
    source: SourceArchive
    dest: Storage
    parent: int | None
    grows: compacted.Manifest | None
    topic: str
    listed: list[SourceChunk]  # the topic's chunks
    chunks: list[SourceChunk]  # those this run reads (an append's: from the hand-off on)
    start: Continuation | None
    run: str
    lease: Lease | None  # None: a dry run (keyfill plan)
    list_seconds: float

    @property
    def handoff(self) -> dict[int, int] | None:
        """An append's first offset to read of each partition; None: a full compaction."""
        return None if self.start is None else self.start.handoff

    @property
    def assignment_key(self) -> str:
        """Where the run writes its key assignment, which its rewrite tasks read."""
        return compacted.assignment_key(self.run)

    @contextmanager
    def abandoned_on_error(self) -> Iterator[None]:
        """Mark the run failed (vacuum may take what it wrote) if the block raises."""
        try:
            yield
        except BaseException:
            if self.lease is not None:
                self.lease.release(failed=True)
            raise


@dataclass(frozen=True)
class Analysis:
    """What a compaction settles from the statistics pass alone (`compactor.job.analyse`):
    the slice length, the slices, the groups and the key assignment. All a dry run
    (`keyfill plan`) needs; the rewrite and the commit read it beside `Prepared`."""

    cfg: CompactConfig  # the run's options with the slice duration chosen: what the rewrite and the commit use
    stats: Statistics
    plan: SlicePlan
    groups: int
    assignment: pa.Table
    new_keys: int


@dataclass
class CompactResult:
    dest: str
    records: int
    payload_bytes: int
    file_bytes: int
    files: int
    pieces: int
    groups: int
    slices: int
    empty_slices: int
    keys: int
    max_group_bytes: int
    mean_group_bytes: float
    seconds: float
    replay_gets: int = 0  # GETs a replay makes with its default GET size (compacted.replay_gets)
    range_bytes: int = 0  # the largest GET of a replay by default (`range_bytes`, --range-bytes, rangeBytes)
    phases: dict[str, float] = field(default_factory=dict)
    version: int = 1  # the version committed
    withheld: int = 0  # source records of unsealed slices, left for a later compaction
    kind: str = "compact"  # or "append"
    first_slice: int = 0  # the first slice this run published (an append's: the parent's slice count)
    new_records: int = 0  # records this run published
    new_keys: int = 0  # keys this run placed
    made_late: int = 0  # records of idle partitions this run placed after their own slice (--idle-after)
    idle: list[int] = field(default_factory=list)  # partitions that did not hold the seal back
    run: str = ""  # this run's id: `keyfill versions` names each version's
    archive: str = ""  # the archive's id, in every offset a reader of it checkpoints

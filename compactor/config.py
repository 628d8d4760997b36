"""What a compaction is asked to do and what it reports: checked once, at the boundary."""

from __future__ import annotations

from dataclasses import dataclass, field

from compactor.slicing import parse_duration
from compactor.sources import FORMATS, SourceArchive, open_source
from keygroups import envelope
from keygroups.errors import KeyfillError, OptionError

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

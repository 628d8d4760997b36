"""What every source format gives the compactor: a list of chunks, each a contiguous offset
range of one partition, and a way to read one chunk as envelope records.

The compactor never trusts header bounds for correctness: its statistics pass measures
every chunk.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

import pyarrow as pa

from keygroups.errors import KeyfillError
from keygroups.storage import Storage


class ArchiveError(KeyfillError, ValueError):
    """The source archive breaks its format: overlapping chunks, metadata that lies, ..."""


@dataclass(frozen=True)
class SourceChunk:
    """One chunk file. Fields after `size` come from file headers where the format has
    them (the envelope format does), else None until the chunk is read."""

    key: str  # relative to the source root
    topic: str
    partition: int
    first_offset: int
    size: int
    last_offset: int | None = None
    records: int | None = None
    min_timestamp: int | None = None
    max_timestamp: int | None = None


class SourceArchive(ABC):
    """A source archive; picklable, so Spark tasks can read chunks themselves."""

    store: Storage
    # Whether consecutive records of a partition have consecutive offsets (gaps are then
    # missing data, refused without --allow-gaps), and whether every chunk holds records.
    contiguous = True
    # Whether the source itself has vetted the offset gaps it leaves (the kafka-connect
    # source with --allow-dropped: each one a thinned file), so slicing accepts them as
    # --allow-gaps would.
    gaps_vetted = False
    # Whether the source URL is a storage root (open_storage); False: the source opens it
    # itself (an Iceberg metadata file or catalog URL), and it is never a compacted archive.
    storage_url = True

    @property
    def url(self) -> str:
        return self.store.url

    @abstractmethod
    def list_chunks(self) -> list[SourceChunk]:
        """All chunks, sorted by (topic, partition, first offset)."""

    @abstractmethod
    def read(self, chunk: SourceChunk) -> pa.RecordBatch:
        """The chunk's records as `keygroups.envelope.ARROW_SCHEMA`, in offset order.
        Raises CorruptFile naming the object (and offset where known) on bad data."""

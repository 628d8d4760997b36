"""What every source format gives the compactor: a list of chunks, each a contiguous offset
range of one partition, and a way to read one chunk as envelope records; and what it
declares for the registry (`compactor.sources`): its `--format` name, its own options
(`SourceOptions`) and the file names of its layout.

The compactor never trusts header bounds for correctness: its statistics pass measures
every chunk.
"""

from __future__ import annotations

import dataclasses
import re
import types
import typing
from abc import ABC, abstractmethod
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar

import pyarrow as pa

from keygroups import envelope
from keygroups.errors import OptionError
from keygroups.storage import Storage, open_storage


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


def option(help: str, default: Any = None, *, metavar: str | None = None) -> Any:
    """A field of a format's options: `help` is its flag's help text (the flag is the field
    name with dashes, `key_field` -> `--key-field`; a bool field, False by default, is a
    switch)."""
    if default is True:
        raise AssertionError("a bool option is a switch that turns something on: False by default")
    return dataclasses.field(default=default, metadata={"help": help, "metavar": metavar})


@dataclass(frozen=True)
class Option:
    """One option of a format as the command line offers it."""

    name: str  # the field, and the key in `source_options` and in a manifest's `source`
    flag: str  # --key-field
    help: str
    switch: bool  # a bool: the flag takes no value
    metavar: str | None


_Options = TypeVar("_Options", bound="SourceOptions")


def flag_of(name: str) -> str:
    return "--" + name.replace("_", "-")


@dataclass(frozen=True)
class SourceOptions:
    """A format's own options, one typed field each (declared with `option()`), checked when
    built. This class itself is the options of a format that takes none; a format with
    options subclasses it (e.g. `KafkaConnectOptions`)."""

    def __post_init__(self) -> None:
        hints = typing.get_type_hints(type(self))
        for f in dataclasses.fields(self):
            value, wanted = getattr(self, f.name), hints[f.name]
            union = typing.get_origin(wanted) in (typing.Union, types.UnionType)
            allowed = typing.get_args(wanted) if union else (wanted,)
            if not isinstance(value, allowed) or (isinstance(value, bool) and bool not in allowed):
                names = " or ".join("None" if t is type(None) else t.__name__ for t in allowed)
                raise OptionError(f"{flag_of(f.name)} ({f.name}): {value!r} is not {names}")

    @classmethod
    def options(cls) -> Iterator[Option]:
        for f in dataclasses.fields(cls):
            switch = isinstance(f.default, bool)
            yield Option(f.name, flag_of(f.name), f.metadata.get("help", ""), switch, f.metadata.get("metavar"))

    def kwargs(self) -> dict[str, Any]:
        """The options as keyword arguments of the format's class."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}

    def continued(self: _Options, recorded: Mapping[str, Any]) -> _Options:
        """The options an append uses, given those the archive recorded (its manifest's
        `source`): by default the archive's, so the appended records read as its own did."""
        kept = {f.name: recorded[f.name] for f in dataclasses.fields(self) if f.name in recorded}
        return dataclasses.replace(self, **kept)


class SourceArchive(ABC):
    """A source archive; picklable, so Spark tasks can read chunks themselves.

    A format declares, for the registry (`compactor.sources.FORMATS`): `format`, its
    `--format` name; `Options`, its own options (a `SourceOptions` dataclass: their flags and
    help come from it); `layouts`, the file names of its layout (for errors that name the
    format a listing looks like). The registry opens it with `open`."""

    format: ClassVar[str]
    Options: ClassVar[type[SourceOptions]] = SourceOptions
    layouts: ClassVar[tuple[re.Pattern[str], ...]] = ()

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
    # Whether `read_encoded` costs no more than `read` (the record bytes are the file's own):
    # the statistics pass then reads chunks that way too.
    reads_encoded = False

    if TYPE_CHECKING:
        # What `open` calls: every format's constructor takes its store (or, where
        # `storage_url` is False, the URL itself), `threads`, and its options by name.
        def __init__(self, where: Storage | str, /, *, threads: int = 16, **options: Any) -> None: ...

    @classmethod
    def open(cls, url: str, options: SourceOptions, *, threads: int = 16) -> SourceArchive:
        """The archive at `url` with `options` (this format's `Options`)."""
        where = open_storage(url, threads=threads) if cls.storage_url else url
        return cls(where, threads=threads, **options.kwargs())

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

    def read_encoded(self, chunk: SourceChunk) -> pa.RecordBatch:
        """The chunk's records as the compaction moves them (`envelope.ENCODED_SCHEMA`), in
        offset order, checked as `read` checks them. A format whose files hold envelope
        records already encoded as a piece holds them gives those bytes (the envelope
        format); the others are read and encoded."""
        return envelope.encoded_batch(self.read(chunk))

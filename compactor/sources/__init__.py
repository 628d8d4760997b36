"""Source archives, chosen by `--format` from the registry `FORMATS`; a format that needs
more than one module is a package of its own, so its helpers sit with it:

- `envelope`: keyfill's own partition-ordered archive (`compactor.sources.envelope`);
- `kafka-connect`: the Kafka Connect S3 sink's layout, Avro, JSON or Parquet files
  (`compactor.sources.kafka_connect`);
- `kafka-segments`: Kafka's own log segments, a broker's log directory or tiered storage as
  the Aiven RemoteStorageManager uploads it (`compactor.sources.kafka_segments`);
- `iceberg`: a topic materialised as an Iceberg table, Redpanda Iceberg Topics' schema
  (`compactor.sources.iceberg`);
- `delta`: a topic kept as a Delta Lake table in the Kafka source's columns, a bronze table
  (`compactor.sources.delta`).

Each yields `SourceChunk`s and reads them as envelope records (`compactor.sources.base`).
A format is its class: it declares its `--format` name, its own options (a `SourceOptions`
dataclass, whose fields give the command line its flags) and its file names; listing the
class in `FORMATS` is all the registry, the command line, `CompactConfig` and the manifest
need. Options are given by name, as a mapping (`{"timestamp_field": "ts"}`), and checked by
the format they belong to (`source_options`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from compactor.errors import ArchiveError
from compactor.sources.base import Option, SourceArchive, SourceChunk, SourceOptions
from compactor.sources.delta import DeltaSource
from compactor.sources.envelope import EnvelopeSource
from compactor.sources.hints import register
from compactor.sources.iceberg import IcebergSource
from compactor.sources.kafka_connect import KafkaConnectSource
from compactor.sources.kafka_segments import KafkaSegmentsSource
from keygroups.errors import OptionError

FORMATS: dict[str, type[SourceArchive]] = {
    source.format: source
    for source in (EnvelopeSource, KafkaConnectSource, KafkaSegmentsSource, IcebergSource, DeltaSource)
}
register(FORMATS)  # the formats an error's hint names (compactor.sources.hints)

__all__ = [
    "FORMATS",
    "ArchiveError",
    "Option",
    "SourceArchive",
    "SourceChunk",
    "SourceOptions",
    "open_source",
    "source_class",
    "source_options",
]


def source_class(format: str) -> type[SourceArchive]:
    if format not in FORMATS:
        raise OptionError(f"unknown source format {format!r}: --format must be one of {', '.join(FORMATS)}")
    return FORMATS[format]


def source_options(format: str, given: Mapping[str, Any] | SourceOptions | None = None) -> SourceOptions:
    """`given` checked as `format`'s options: a mapping of option names (what the format's
    flags set), or its options object itself. An option the format does not take is an
    OptionError naming its flag and the formats that take it."""
    cls = source_class(format).Options
    if isinstance(given, SourceOptions):
        if type(given) is not cls:
            raise OptionError(f"{type(given).__name__} are not the options of --format {format} ({cls.__name__})")
        return given
    given = dict(given or {})
    takes = {o.name for o in cls.options()}
    for name in given:
        if name not in takes:
            raise OptionError(_not_taken(name, format, takes))
    return cls(**given)


def _not_taken(name: str, format: str, takes: set[str]) -> str:
    owners = [f for f, source in FORMATS.items() for o in source.Options.options() if o.name == name]
    own = ", ".join(o.flag for o in FORMATS[format].Options.options() if o.name in takes) or "no options of its own"
    if owners:
        flag = next(o.flag for o in FORMATS[owners[0]].Options.options() if o.name == name)
        return f"{flag} ({name}) is an option of --format {' and '.join(owners)}; --format {format} takes {own}"
    return f"unknown source option {name!r}; --format {format} takes {own}"


def open_source(
    url: str,
    *,
    format: str = "envelope",
    options: Mapping[str, Any] | SourceOptions | None = None,
    threads: int = 16,
) -> SourceArchive:
    """The source archive at `url` in the given layout, with its options by name
    (`open_source(url, format="kafka-connect", options={"timestamp_field": "ts"})`)."""
    return source_class(format).open(url, source_options(format, options), threads=threads)

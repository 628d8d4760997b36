"""The second source format: a topic archived by Confluent's Kafka Connect S3 sink with its
default partitioner, in AvroFormat, JsonFormat or ParquetFormat, each file's format read
off its extension (see docs/kafka-connect-source.md).

    <root>/topics/<topic>/partition=<p>/<topic>+<p>+<start offset><ext>            values
    <root>/topics/<topic>/partition=<p>/<topic>+<p>+<start offset>.keys<ext>       store.kafka.keys=true
    <root>/topics/<topic>/partition=<p>/<topic>+<p>+<start offset>.headers<ext>    store.kafka.headers=true

    <ext>: .avro | .json | .json.gz | [.snappy|.gz|.lzo|.br|.lz4hadoop|.zstd|.lz4raw].parquet

The connector keeps no offsets, timestamps or partitions inside the files: the offset of a
record is the file's start offset plus its position, the timestamp comes from a field of the
value (`timestamp_field`), the key from the keys file or a value field (`key_field`). A file
holding fewer records than the next file's start offset implies was thinned by the
connector (dropped tombstones, filtering SMTs); that is refused unless `allow_dropped`.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from compactor.errors import ArchiveError
from compactor.sources.base import SourceArchive, SourceChunk, SourceOptions, option
from compactor.sources.hints import hint
from compactor.sources.kafka_connect.file_formats import EXTENSIONS, FileFormat
from compactor.sources.kafka_connect.records import check_count, timestamps_ms
from keygroups.envelope import ARROW_SCHEMA, HEADER_TYPE
from keygroups.errors import OptionError
from keygroups.storage import Storage

__all__ = [
    "KafkaConnectSource",
    "KafkaConnectOptions",
    "ConnectChunk",
    "KEYS_SUFFIX",
    "HEADERS_SUFFIX",
]

KEYS_SUFFIX = ".keys.avro"
HEADERS_SUFFIX = ".headers.avro"
TOPICS_DIR = "topics"  # the connector's `topics.dir` default

_EXT = "|".join(re.escape(e) for e in sorted(EXTENSIONS, key=len, reverse=True))
# Kafka topic names are [a-zA-Z0-9._-]+, so '+' safely separates the name's parts.
_FILE = rf"(?P<ftopic>[^/+]+)\+(?P<fpart>\d+)\+(?P<start>\d+)(?P<kind>\.keys|\.headers)?(?P<ext>{_EXT})"
_IN_TOPICS_DIR = re.compile(rf"^(?P<topic>[^/]+)/partition=(?P<part>\d+)/{_FILE}$")
_UNDER_ROOT = re.compile(rf"^{TOPICS_DIR}/(?P<topic>[^/]+)/partition=(?P<part>\d+)/{_FILE}$")
_SHAPE = "<topic>/partition=<p>/<topic>+<p>+<start offset>[.keys|.headers]<.avro|.json[.gz]|[.<codec>].parquet>"


def file_format(key: str) -> FileFormat:
    m = re.search(rf"(?:{_EXT})$", key)
    if not m:
        raise ArchiveError(f"{key}: not a Kafka Connect file extension ({', '.join(EXTENSIONS)})")
    return EXTENSIONS[m.group(0)]


@dataclass(frozen=True)
class ConnectChunk(SourceChunk):
    """A value file with what the listing knows about it: its keys and headers files, and
    the next value file of its partition (whose start offset bounds this file's records)."""

    keys_file: str | None = None
    headers_file: str | None = None
    next_file: str | None = None
    next_offset: int | None = None


# --- the source ---------------------------------------------------------------------------


@dataclass(frozen=True)
class KafkaConnectOptions(SourceOptions):
    """What the files do not say: where the event time and the key are, and whether thinned
    files are accepted (docs/kafka-connect-source.md)."""

    timestamp_field: str | None = option("value field holding the event time (required)", metavar="FIELD")
    key_field: str | None = option("value field holding the key (when no .keys.* files)", metavar="FIELD")
    allow_dropped: bool = option(
        "accept files holding fewer records than the next file's start offset implies (dropped tombstones, "
        "filtering SMTs, compacted topics); their records are numbered from the file's start",
        default=False,
    )

    def continued(self, recorded: Mapping[str, Any]) -> KafkaConnectOptions:
        """The archive's fields; thinned files accepted if the archive or this run accepts them."""
        kept = super().continued(recorded)
        return dataclasses.replace(kept, allow_dropped=self.allow_dropped or bool(recorded.get("allow_dropped")))


class KafkaConnectSource(SourceArchive):
    """A Kafka Connect S3 sink archive (default partitioner; Avro, JSON or Parquet files)
    read as envelope records.

    Root: the store may be rooted at the folder that holds `topics/` (the connector's
    `topics.dir`, default "topics") or at the topics folder itself. Which one is decided from
    the listing: if any key looks like `topics/<topic>/partition=<p>/<file>`, the root is the
    parent and only keys under `topics/` are considered; otherwise keys must look like
    `<topic>/partition=<p>/<file>`. Use the second form for a non-default `topics.dir`.

    Per record of a value file `<topic>+<p>+<start><ext>`:
    - offset = start + position in the file. A file holding fewer records than the next
      file's start implies had records dropped by the connector: refused (ArchiveError)
      unless `allow_dropped`, which keeps start + position (see the docs for why); more
      records than that is an overlap, always refused;
    - timestamp = value field `timestamp_field` in epoch ms (or a timestamp type's unit,
      floored to ms). A tombstone takes the timestamp of the record before it in the file,
      or after it if it leads;
    - key = the keys file's record when it exists, else value field `key_field`, else null;
    - value = Avro and Parquet: compact JSON text of the record (`encode_json`); JSON: the
      line's bytes as the connector wrote them; null stays null;
    - headers = the headers file's records when it exists, else none.

    Picklable: it holds the store and the options only.
    """

    format = "kafka-connect"
    Options = KafkaConnectOptions
    layouts = (_UNDER_ROOT, _IN_TOPICS_DIR)

    def __init__(
        self,
        store: Storage,
        *,
        key_field: str | None = None,
        timestamp_field: str | None = None,
        allow_dropped: bool = False,
        threads: int = 16,
    ):
        if not timestamp_field:
            raise OptionError(
                f"{store.url}: the Kafka Connect layout needs timestamp_field (--timestamp-field): "
                "its files keep no Kafka timestamps, so name the value field holding the event time"
            )
        self.store = store
        self.key_field = key_field or None
        self.timestamp_field = timestamp_field
        self.allow_dropped = allow_dropped
        self.gaps_vetted = allow_dropped  # each gap it leaves is a thinned file it checked (base.py)
        self.threads = threads

    def __repr__(self) -> str:
        return (
            f"KafkaConnectSource({self.store.url!r}, key_field={self.key_field!r}, "
            f"timestamp_field={self.timestamp_field!r}, allow_dropped={self.allow_dropped!r})"
        )

    # -- listing

    def list_chunks(self) -> list[SourceChunk]:
        """One chunk per value file (a `ConnectChunk`), from a single listing. Raises
        ArchiveError for names outside the layout, two value files of a partition with the
        same start offset, and keys/headers files without their value file or two of a kind
        for one."""
        url = self.store.url_for
        listing = [o for o in self.store.list() if o.key.endswith(tuple(EXTENSIONS))]
        if any(_UNDER_ROOT.match(o.key) for o in listing):
            pattern, shape = _UNDER_ROOT, f"{TOPICS_DIR}/{_SHAPE}"
            listing = [o for o in listing if o.key.startswith(TOPICS_DIR + "/")]
        else:
            pattern, shape = _IN_TOPICS_DIR, _SHAPE
        chunks: dict[tuple[str, int, int], ConnectChunk] = {}
        stems: dict[str, str] = {}  # value file key -> its stem
        siblings: dict[tuple[str, str], str] = {}  # (stem, kind) -> key
        for obj in listing:
            m = pattern.match(obj.key)
            if not m:
                raise ArchiveError(
                    f"{url(obj.key)}: not a Kafka Connect S3 sink file ({shape}); only the default "
                    "partitioner's layout is read" + hint([obj.key], "kafka-connect")
                )
            topic, part = m["topic"], int(m["part"])
            if m["ftopic"] != topic or int(m["fpart"]) != part:
                raise ArchiveError(
                    f"{url(obj.key)}: file name says topic {m['ftopic']} partition {int(m['fpart'])}, "
                    f"its folder says topic {topic} partition {part}"
                )
            stem = obj.key[: m.start("kind") if m["kind"] else m.start("ext")]
            if m["kind"]:
                seen = siblings.setdefault((stem, m["kind"]), obj.key)
                if seen != obj.key:
                    raise ArchiveError(f"{url(seen)} and {url(obj.key)}: two {m['kind'][1:]} files for one value file")
                continue
            start = int(m["start"])
            chunk = ConnectChunk(key=obj.key, topic=topic, partition=part, first_offset=start, size=obj.size)
            other = chunks.setdefault((topic, part, start), chunk)
            if other is not chunk:
                raise ArchiveError(
                    f"{url(other.key)} and {url(obj.key)}: two value files of {topic} partition {part} "
                    f"start at offset {start}"
                )
            stems[obj.key] = stem
        if not chunks:
            raise ArchiveError(
                f"{self.store.url}: no Kafka Connect value files ({shape}) found"
                + hint((o.key for o in self.store.list()), "kafka-connect")
            )
        value_stems = set(stems.values())
        for (stem, _), key in siblings.items():
            if stem not in value_stems:
                raise ArchiveError(f"{url(key)}: has no value file ({url(stem)}<.avro|.json|...>)")
        ordered = [chunks[k] for k in sorted(chunks)]
        out: list[SourceChunk] = []
        for c, nxt in zip(ordered, [*ordered[1:], None]):
            # the next value file of the same partition
            following = nxt if nxt is not None and (nxt.topic, nxt.partition) == (c.topic, c.partition) else None
            stem = stems[c.key]
            out.append(
                dataclasses.replace(
                    c,
                    keys_file=siblings.get((stem, ".keys")),
                    headers_file=siblings.get((stem, ".headers")),
                    next_file=following.key if following else None,
                    next_offset=following.first_offset if following else None,
                )
            )
        return out

    # -- reading

    def read(self, chunk: SourceChunk) -> pa.RecordBatch:
        if not isinstance(chunk, ConnectChunk):
            raise TypeError(f"{chunk.key}: read a chunk of this source's list_chunks() (its keys/headers files)")
        url = self.store.url_for
        with ThreadPoolExecutor(max_workers=2) as pool:  # the siblings' GETs overlap the value's
            keys_f = pool.submit(self.store.read, chunk.keys_file) if chunk.keys_file else None
            headers_f = pool.submit(self.store.read, chunk.headers_file) if chunk.headers_file else None
            data = self.store.read(chunk.key)
            keys_data = keys_f.result() if keys_f else None
            headers_data = headers_f.result() if headers_f else None

        name = url(chunk.key)
        first = chunk.first_offset
        values = file_format(chunk.key).values(data, name, first, self.timestamp_field, self.key_field)
        n = len(values)
        self._check_next(chunk, n)
        ts = timestamps_ms(values, name, first, self.timestamp_field)

        if chunk.keys_file and keys_data is not None:  # keys_data: read when there is a keys file
            keys_name = url(chunk.keys_file)
            keys = file_format(chunk.keys_file).keys(keys_data, keys_name, first)
            check_count(keys_name, "keys", len(keys), name, n, first)
        elif self.key_field:
            keys = values.field_keys
        else:
            keys = pa.nulls(n, pa.binary())

        if chunk.headers_file and headers_data is not None:
            headers_name = url(chunk.headers_file)
            headers = file_format(chunk.headers_file).headers(headers_data, headers_name, first)
            check_count(headers_name, "headers", len(headers), name, n, first)
        else:
            headers = pa.ListArray.from_arrays(np.zeros(n + 1, np.int32), pa.array([], HEADER_TYPE))

        return pa.RecordBatch.from_arrays(
            [
                pa.array(np.full(n, chunk.partition, np.int32)),
                pa.array(first + np.arange(n, dtype=np.int64)),
                pa.array(ts).view(pa.timestamp("ms", tz="UTC")),
                keys,
                values.values,
                headers,
            ],
            schema=ARROW_SCHEMA,
        )

    def _check_next(self, chunk: ConnectChunk, n: int) -> None:
        """The next file's start offset bounds this file's records: more is an overlap, fewer
        means the connector dropped records (or a file is missing) and positions after the
        drop are not the records' offsets."""
        if chunk.next_offset is None or chunk.next_file is None:  # both set, or neither (the last file)
            return
        url = self.store.url_for
        owned = chunk.next_offset - chunk.first_offset
        if n > owned:
            raise ArchiveError(
                f"{url(chunk.key)}: holds {n} records from offset {chunk.first_offset}, but the next file "
                f"{url(chunk.next_file)} starts at offset {chunk.next_offset}, {owned} later: the files overlap"
            )
        if n < owned and not self.allow_dropped:
            raise ArchiveError(
                f"{url(chunk.key)}: holds {n} records, but the next file {url(chunk.next_file)} starts "
                f"at offset {chunk.next_offset}, so offsets {chunk.first_offset}..{chunk.next_offset - 1} "
                f"({owned} records) belong to it: {owned - n} were dropped by the connector "
                "(behavior.on.null.values=ignore, a filtering SMT, a compacted topic) or a file is missing, "
                "and the offsets of the records after a drop are unknown. Pass --allow-dropped to number "
                "the file's records from its start offset (docs/kafka-connect-source.md)"
            )

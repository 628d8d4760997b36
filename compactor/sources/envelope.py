"""The native source format: a partition-ordered archive of envelope chunks.

    <root>/<topic>/partition=<p>/<first offset, 20 digits>.avro

Each chunk holds a contiguous offset range of one partition in offset order, and its Avro
file metadata carries the offset and timestamp bounds, so the whole index comes from one
listing plus the first few KB of each file (see docs/envelope-archive.md).
"""

from __future__ import annotations

import hashlib
import re
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from typing import Any, NamedTuple

import numpy as np
import pyarrow as pa

from compactor.errors import ArchiveError
from compactor.sources.base import SourceArchive, SourceChunk
from compactor.sources.hints import hint
from keygroups import envelope
from keygroups.envelope import CorruptFile, HeaderTruncated
from keygroups.errors import OptionError
from keygroups.storage import Storage

FORMAT = "keyfill.envelope-chunk/1"
OFFSET_DIGITS = 20  # int64 offsets have at most 19 digits; names sort as numbers
_CHUNK_RE = re.compile(r"^(?P<topic>[^/]+)/partition=(?P<partition>\d+)/(?P<first>\d+)\.avro$")
_HEAD_BYTES = (8 * 1024, 256 * 1024)


def chunk_key(topic: str, partition: int, first_offset: int) -> str:
    return f"{topic}/partition={partition}/{first_offset:0{OFFSET_DIGITS}d}.avro"


def chunk_metadata(batch: pa.RecordBatch, topic: str) -> dict[str, str]:
    """Avro file metadata for a chunk; also checks the batch is a valid chunk."""
    if batch.num_rows == 0:
        raise OptionError("a chunk must hold at least one record")
    parts = batch.column("partition").to_numpy(zero_copy_only=False)
    offsets = batch.column("offset").to_numpy(zero_copy_only=False)
    ts = batch.column("timestamp").cast(pa.int64()).to_numpy(zero_copy_only=False)
    if (parts != parts[0]).any():
        raise OptionError("a chunk holds records of exactly one partition")
    if len(offsets) > 1 and (np.diff(offsets) <= 0).any():
        raise OptionError("a chunk's offsets must strictly increase")
    return {
        "keyfill.format": FORMAT,
        "keyfill.topic": topic,
        "keyfill.partition": str(int(parts[0])),
        "keyfill.first_offset": str(int(offsets[0])),
        "keyfill.last_offset": str(int(offsets[-1])),
        "keyfill.min_timestamp": str(int(ts.min())),
        "keyfill.max_timestamp": str(int(ts.max())),
        "keyfill.records": str(batch.num_rows),
    }


def encode_chunk(batch: pa.RecordBatch, topic: str, *, codec: str = "snappy") -> tuple[str, bytes]:
    """(key, file bytes) of one chunk. The sync marker is derived from the chunk's position
    so the same records always give the same bytes."""
    meta = chunk_metadata(batch, topic)
    key = chunk_key(topic, int(meta["keyfill.partition"]), int(meta["keyfill.first_offset"]))
    marker = hashlib.blake2b(key.encode(), digest_size=16).digest()
    return key, envelope.encode_avro(batch, codec=codec, metadata=meta, sync_marker=marker)


def write_chunk(store: Storage, batch: pa.RecordBatch, topic: str, *, codec: str = "snappy") -> str:
    key, data = encode_chunk(batch, topic, codec=codec)
    store.write(key, data)
    return key


class Header(NamedTuple):
    """What a chunk's header gives beyond its name (the fields of `SourceChunk` other
    formats may leave None until the chunk is read)."""

    last_offset: int
    records: int
    min_timestamp: int
    max_timestamp: int


def header_of(chunk: SourceChunk) -> Header:
    """The header fields of a chunk `read_chunk_header` made (every chunk of an index)."""
    last, records, lo, hi = chunk.last_offset, chunk.records, chunk.min_timestamp, chunk.max_timestamp
    if last is None or records is None or lo is None or hi is None:
        raise AssertionError(f"{chunk.key}: not a chunk read from its envelope header")
    return Header(last, records, lo, hi)


def read_chunk_header(store: Storage, key: str, size: int) -> SourceChunk:
    """SourceChunk from the first bytes of a chunk file, fetching more only if the header is
    longer than the first read."""
    name = store.url_for(key)
    m = _CHUNK_RE.match(key)
    if not m:
        raise ArchiveError(f"{name}: not a chunk name (<topic>/partition=<p>/<first offset>.avro)")
    meta = None
    for n in (*_HEAD_BYTES, size):
        head = store.read_range(key, 0, n)
        try:
            meta = envelope.read_avro_metadata(head, name=name)
            break
        except HeaderTruncated:
            if len(head) < n or n >= size:
                raise CorruptFile(f"{name}: truncated Avro header ({len(head)} bytes)") from None
    assert meta is not None
    try:
        info = SourceChunk(
            key=key,
            size=size,
            topic=meta["keyfill.topic"],
            partition=int(meta["keyfill.partition"]),
            first_offset=int(meta["keyfill.first_offset"]),
            last_offset=int(meta["keyfill.last_offset"]),
            min_timestamp=int(meta["keyfill.min_timestamp"]),
            max_timestamp=int(meta["keyfill.max_timestamp"]),
            records=int(meta["keyfill.records"]),
        )
    except (KeyError, ValueError) as exc:
        raise ArchiveError(f"{name}: missing or bad keyfill chunk metadata ({exc})") from None
    if (info.topic, info.partition, info.first_offset) != (
        m["topic"],
        int(m["partition"]),
        int(m["first"]),
    ):
        raise ArchiveError(
            f"{name}: file name says topic {m['topic']} partition {int(m['partition'])} first offset "
            f"{int(m['first'])}, its metadata says topic {info.topic} partition {info.partition} "
            f"first offset {info.first_offset}"
        )
    header = header_of(info)
    if header.last_offset < info.first_offset or header.records < 1:
        raise ArchiveError(f"{name}: metadata offsets {info.first_offset}..{info.last_offset} are empty")
    return info


@dataclass
class ArchiveIndex:
    """Partitions and their chunks in offset order, built without reading records."""

    url: str
    chunks: dict[tuple[str, int], list[SourceChunk]] = field(default_factory=dict)
    gaps: list[str] = field(default_factory=list)

    @property
    def topics(self) -> list[str]:
        return sorted({t for t, _ in self.chunks})

    def partitions(self, topic: str | None = None) -> list[int]:
        return sorted(p for t, p in self.chunks if topic is None or t == topic)

    def partition_chunks(self, partition: int, topic: str | None = None) -> list[SourceChunk]:
        topic = topic or self._only_topic()
        return list(self.chunks.get((topic, partition), []))

    def all_chunks(self) -> list[SourceChunk]:
        return [c for k in sorted(self.chunks) for c in self.chunks[k]]

    def overlapping(self, start_ms: int, end_ms: int) -> list[SourceChunk]:
        """Chunks that may hold a record with start_ms <= timestamp < end_ms."""
        return [
            c for c in self.all_chunks() if (h := header_of(c)).min_timestamp < end_ms and h.max_timestamp >= start_ms
        ]

    @property
    def records(self) -> int:
        return sum(header_of(c).records for c in self.all_chunks())

    @property
    def bytes(self) -> int:
        return sum(c.size for c in self.all_chunks())

    def _only_topic(self) -> str:
        topics = self.topics
        if len(topics) != 1:
            raise ArchiveError(f"{self.url}: holds topics {topics}; name one")
        return topics[0]

    def to_json(self) -> dict[str, Any]:
        return {"url": self.url, "chunks": [asdict(c) for c in self.all_chunks()], "gaps": self.gaps}


def build_index(store: Storage, *, threads: int = 16) -> ArchiveIndex:
    """Index an archive from a listing plus each chunk's header (parallel ranged GETs).

    Raises ArchiveError when two chunks of a partition overlap; offset gaps (compacted
    topics have them) are recorded in `gaps`.
    """
    everything = store.list()
    listing = [o for o in everything if o.key.endswith(".avro")]
    if not listing:
        raise ArchiveError(
            f"{store.url}: no envelope chunks (<topic>/partition=<p>/<offset>.avro) found"
            + hint((o.key for o in everything), "envelope")
        )
    for o in listing:
        if not _CHUNK_RE.match(o.key):
            raise ArchiveError(
                f"{store.url_for(o.key)}: not a chunk name (<topic>/partition=<p>/<first offset>.avro)"
                + hint([o.key], "envelope")
            )
    with ThreadPoolExecutor(max_workers=max(1, threads)) as pool:
        infos = list(pool.map(lambda o: read_chunk_header(store, o.key, o.size), listing))
    index = ArchiveIndex(url=store.url)
    for info in infos:
        index.chunks.setdefault((info.topic, info.partition), []).append(info)
    for (topic, partition), chunks in index.chunks.items():
        chunks.sort(key=lambda c: c.first_offset)
        for prev, cur in zip(chunks, chunks[1:]):
            prev_last = header_of(prev).last_offset
            if cur.first_offset <= prev_last:
                raise ArchiveError(
                    f"{store.url_for(cur.key)}: offsets {cur.first_offset}..{cur.last_offset} overlap "
                    f"{store.url_for(prev.key)} ({prev.first_offset}..{prev_last})"
                )
            if cur.first_offset != prev_last + 1:
                index.gaps.append(
                    f"{topic} partition {partition}: offsets {prev_last + 1}..{cur.first_offset - 1} missing"
                )
    return index


def read_chunk(store: Storage, chunk: SourceChunk) -> pa.RecordBatch:
    """All records of a chunk, checked against its header (`check_chunk_batch`)."""
    name = store.url_for(chunk.key)
    return check_chunk_batch(name, chunk, envelope.decode_avro(store.read(chunk.key), name=name)[1])


def check_chunk_batch(name: str, chunk: SourceChunk, batch: pa.RecordBatch) -> pa.RecordBatch:
    """`batch`, the records of `chunk`, once checked against its header: one partition,
    offsets strictly increasing within the header's bounds, the promised record count."""
    parts = batch.column("partition").to_numpy(zero_copy_only=False)
    offsets = batch.column("offset").to_numpy(zero_copy_only=False)
    if batch.num_rows != chunk.records:
        raise CorruptFile(f"{name}: holds {batch.num_rows} records, its header promises {chunk.records}")
    bad = np.flatnonzero(parts != chunk.partition)
    if bad.size:
        raise CorruptFile(f"{name}: record at offset {offsets[bad[0]]} has partition {parts[bad[0]]}")
    down = np.flatnonzero(np.diff(offsets) <= 0)
    if down.size:
        raise CorruptFile(f"{name}: offset {offsets[down[0] + 1]} follows {offsets[down[0]]}; not in offset order")
    if offsets[0] != chunk.first_offset or offsets[-1] != chunk.last_offset:
        raise CorruptFile(
            f"{name}: records span offsets {offsets[0]}..{offsets[-1]}, header says "
            f"{chunk.first_offset}..{chunk.last_offset}"
        )
    return batch


class EnvelopeSource(SourceArchive):
    """The envelope archive as a compactor source: chunk bounds come from the headers."""

    format = "envelope"
    layouts = (_CHUNK_RE,)
    reads_encoded = True

    def __init__(self, store: Storage, *, threads: int = 16):
        self.store = store
        self.threads = threads

    def list_chunks(self) -> list[SourceChunk]:
        return build_index(self.store, threads=self.threads).all_chunks()

    def read(self, chunk: SourceChunk) -> pa.RecordBatch:
        return read_chunk(self.store, chunk)

    def read_encoded(self, chunk: SourceChunk) -> pa.RecordBatch:
        name = self.store.url_for(chunk.key)
        return check_chunk_batch(name, chunk, envelope.decode_encoded(self.store.read(chunk.key), name=name))

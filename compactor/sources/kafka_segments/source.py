"""Kafka's own log segments as a source (`--format kafka-segments`, docs/kafka-segments-source.md).

Two layouts, told apart by their names:

- a broker's log directory, as `log.dirs` holds it:

      <root>/<topic>-<partition>/<base offset, 20 digits>.log      the segment: record batches
      <root>/<topic>-<partition>/<base offset, 20 digits>.txnindex aborted transactions (optional)

- KIP-405 tiered storage as the Aiven RemoteStorageManager uploads it (zstd chunk
  compression on or off; encryption refused), see `compactor.sources.kafka_segments.tiered`:

      <root>/<topic>-<topic id>/<partition>/<start offset, 20 digits>-<segment id>.log
      <root>/<topic>-<topic id>/<partition>/<start offset, 20 digits>-<segment id>.indexes
      <root>/<topic>-<topic id>/<partition>/<start offset, 20 digits>-<segment id>.rsm-manifest

A segment is a chunk. Records come out in offset order per partition with control batches
(transaction markers) and the batches of aborted transactions left out, so offsets skip
where Kafka's do (markers, aborted data, compaction): gaps inside and between segments are
expected of this format. Aborted transactions are read from the transaction indexes (every
segment's, at listing time: a transaction's abort marker may sit in a later segment than
its data).

Tiered segments are listed from their manifests (every one read at listing time: start and
end offsets, chunk index, encryption, where the transaction index sits). Uploads that cover
the same offsets are cut so each offset is read once (`tiered.cover`): a chunk's
`first_offset` is where its reading starts, its `last_offset` the manifest's end offset.
"""

from __future__ import annotations

import logging
import re
import struct
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

import pyarrow as pa

import compactor.sources.kafka_segments.tiered as tiered
from compactor.errors import ArchiveError
from compactor.sources.base import SourceArchive, SourceChunk
from compactor.sources.hints import hint
from compactor.sources.kafka_segments.record_batches import Aborted, decode_segment
from keygroups.envelope import CorruptFile
from keygroups.storage import Storage

_BROKER = re.compile(r"^(?:.*/)?(?P<topic>[^/]+)-(?P<part>\d+)/(?P<base>\d{20})\.(?P<kind>log|txnindex)$")
log = logging.getLogger("keyfill.sources")
_TXN_ENTRY = struct.Struct(">hqqqq")  # version, producer id, first offset, last offset, last stable offset
_Item = TypeVar("_Item")
_Result = TypeVar("_Result")


def parse_txnindex(data: bytes, name: str) -> list[Aborted]:
    """A transaction index: 34-byte entries, one per aborted transaction."""
    if len(data) % _TXN_ENTRY.size:
        raise CorruptFile(f"{name}: {len(data)} bytes is not a whole number of 34-byte transaction index entries")
    out = []
    for version, pid, first, last, _lso in _TXN_ENTRY.iter_unpack(data):
        if version != 0:
            raise CorruptFile(f"{name}: transaction index entry version {version}; keyfill reads version 0")
        out.append(Aborted(pid, first, last))
    return out


class KafkaSegmentsSource(SourceArchive):
    """Log segments of a broker's log directory, or of Aiven tiered storage."""

    format = "kafka-segments"
    layouts = (_BROKER, tiered.KEY)

    contiguous = False  # offsets skip at markers, aborted transactions and compaction

    def __init__(self, store: Storage, threads: int = 16) -> None:
        self.store = store
        self.threads = threads
        self._aborted: dict[tuple[str, int], list[Aborted]] | None = None
        self.overlaps: list[tiered.Overlap] = []  # tiered offsets uploaded twice, read once (last listing)

    def __getstate__(self) -> dict[str, Any]:
        return {"store": self.store, "threads": self.threads, "_aborted": self._aborted, "overlaps": []}

    def _map(self, fn: Callable[[_Item], _Result], items: list[_Item]) -> list[_Result]:
        with ThreadPoolExecutor(max(1, min(self.threads, len(items) or 1))) as pool:
            return list(pool.map(fn, items))

    def list_chunks(self) -> list[SourceChunk]:
        chunks: list[SourceChunk] = []
        txn: list[tuple[str, int, str]] = []  # topic, partition, transaction index
        remote: dict[str, dict[str, int]] = {}  # tiered segment stem -> kind -> object size
        listing = self.store.list()
        for o in listing:
            if m := tiered.KEY.match(o.key):
                remote.setdefault(m["stem"], {})[m["kind"]] = o.size
                continue
            m = _BROKER.match(o.key)
            if not m:
                continue
            if m["kind"] == "log":
                chunks.append(
                    SourceChunk(
                        key=o.key, topic=m["topic"], partition=int(m["part"]), first_offset=int(m["base"]), size=o.size
                    )
                )
            else:
                txn.append((m["topic"], int(m["part"]), o.key))
        found = self._map(lambda t: (t[0], t[1], parse_txnindex(self.store.read(t[2]), self.store.url_for(t[2]))), txn)
        tiered_chunks, tiered_aborted = self._list_tiered(remote)
        aborted: dict[tuple[str, int], list[Aborted]] = {}
        for topic, part, entries in found + tiered_aborted:
            aborted.setdefault((topic, part), []).extend(entries)
        self._aborted = aborted
        chunks += tiered_chunks
        if not chunks and listing:
            raise ArchiveError(
                f"{self.store.url}: no Kafka log segments (<topic>-<p>/<20-digit base offset>.log, or tiered "
                "<topic>-<id>/<p>/<offset>-<id>.log) found" + hint((o.key for o in listing), "kafka-segments")
            )
        chunks.sort(key=lambda c: (c.topic, c.partition, c.first_offset))
        return chunks

    def _list_tiered(
        self, remote: dict[str, dict[str, int]]
    ) -> tuple[list[SourceChunk], list[tuple[str, int, list[Aborted]]]]:
        """Chunks of the tiered segments (overlaps cut, see `tiered.cover`) and their
        aborted transactions. A `.log` without a manifest is an upload that never finished
        (the plugin writes the manifest last, and Kafka references a segment only after it):
        skipped, and the offsets only it would hold are caught as missing by `cover`."""
        url = self.store.url_for
        listed = []
        for stem, kinds in sorted(remote.items()):
            if "rsm-manifest" not in kinds:
                if "log" in kinds:
                    log.warning("%s: no .rsm-manifest beside it (an unfinished upload): skipped", url(stem + ".log"))
                continue
            if "log" not in kinds:
                raise ArchiveError(f"{url(stem + '.rsm-manifest')}: its segment object {stem}.log is missing")
            listed.append((stem, kinds["log"]))

        def load(item: tuple[str, int]) -> tiered.Segment:
            stem, size = item
            name = url(stem + ".rsm-manifest")
            m = tiered.parse_manifest(self.store.read(stem + ".rsm-manifest"), name)
            key = tiered.KEY.match(stem + ".log")
            assert key is not None, stem  # it is a KEY: the stem came from one
            tiered.check_manifest(m, key, name)
            tiered.check_stored(size, m, url(stem + ".log"))
            return tiered.Segment(stem + ".log", size, m)

        segments = self._map(load, listed)
        ids: dict[str, set[str]] = {}
        by_partition: dict[tuple[str, int], list[tiered.Segment]] = {}
        for s in segments:
            ids.setdefault(s.manifest.topic, set()).add(s.manifest.topic_id)
            by_partition.setdefault((s.manifest.topic, s.manifest.partition), []).append(s)
        for topic, found in ids.items():
            if len(found) > 1:
                raise ArchiveError(
                    f"{self.store.url}: topic {topic} has tiered segments under topic ids {sorted(found)} (a deleted "
                    "and re-created topic: offsets start again); remove the stale topic id's objects"
                )
        chunks: list[SourceChunk] = []
        self.overlaps = []
        for (topic, part), segs in sorted(by_partition.items()):
            chosen, overlaps = tiered.cover(segs, url)
            for o in overlaps:
                log.warning(
                    "%s: offsets %d..%d are also in %s, read from there%s",
                    url(o.key),
                    o.first,
                    o.last,
                    url(o.kept),
                    " (the whole segment: not read)" if o.dropped else "",
                )
            self.overlaps += overlaps
            chunks += [
                SourceChunk(
                    key=s.key, topic=topic, partition=part, first_offset=first, size=s.size, last_offset=s.manifest.end
                )
                for s, first in chosen
            ]
        with_txn = [(s, txn) for s in segments if (txn := s.manifest.transaction) and txn[1]]
        return chunks, self._map(self._tiered_txn, with_txn)

    def _tiered_txn(self, item: tuple[tiered.Segment, tuple[int, int]]) -> tuple[str, int, list[Aborted]]:
        """A tiered segment's aborted transactions, from the transaction index inside its
        `.indexes` (at the manifest's position and size)."""
        s, (pos, size) = item
        key = s.key.removesuffix(".log") + ".indexes"
        data = self.store.read_range(key, pos, size)
        name = f"{self.store.url_for(key)} (transaction index, bytes {pos}..{pos + size - 1})"
        if len(data) != size:
            raise CorruptFile(f"{name}: the object ends {size - len(data)} bytes short of what its manifest says")
        return s.manifest.topic, s.manifest.partition, parse_txnindex(data, name)

    def aborted_of(self, topic: str, partition: int) -> list[Aborted]:
        if self._aborted is None:
            self.list_chunks()
        return (self._aborted or {}).get((topic, partition), [])

    def read(self, chunk: SourceChunk) -> pa.RecordBatch:
        name = self.store.url_for(chunk.key)
        data: bytes | bytearray
        try:
            data = self.store.read(chunk.key)
        except OSError as exc:
            raise ArchiveError(f"{name}: {exc}") from None
        key = tiered.KEY.match(chunk.key)
        if key:
            manifest_name = self.store.url_for(key["stem"] + ".rsm-manifest")
            m = tiered.parse_manifest(self.store.read(key["stem"] + ".rsm-manifest"), manifest_name)
            data = tiered.segment_bytes(data, m, name)
        batch = decode_segment(
            data,
            chunk.partition,
            name=name,
            aborted=self.aborted_of(chunk.topic, chunk.partition),
            from_offset=chunk.first_offset,
        )
        last = batch.column("offset")[-1].as_py() if batch.num_rows else None
        if key and last is not None and last > chunk.last_offset:  # listed from the manifest's end offset
            raise CorruptFile(f"{name}: holds offset {last}, past the end offset {chunk.last_offset} its manifest says")
        return batch

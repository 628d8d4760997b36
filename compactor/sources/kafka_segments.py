"""Kafka's own log segments as a source (`--format kafka-segments`, docs/kafka-segments-source.md).

Two layouts, told apart by their names:

- a broker's log directory, as `log.dirs` holds it:

      <root>/<topic>-<partition>/<base offset, 20 digits>.log      the segment: record batches
      <root>/<topic>-<partition>/<base offset, 20 digits>.txnindex aborted transactions (optional)

- KIP-405 tiered storage as the Aiven RemoteStorageManager uploads it (compression and
  encryption off, its defaults):

      <root>/<topic>-<topic id>/<partition>/<start offset, 20 digits>-<segment id>.log
      <root>/<topic>-<topic id>/<partition>/<start offset, 20 digits>-<segment id>.indexes
      <root>/<topic>-<topic id>/<partition>/<start offset, 20 digits>-<segment id>.rsm-manifest

A segment is a chunk. Records come out in offset order per partition with control batches
(transaction markers) and the batches of aborted transactions left out, so offsets skip
where Kafka's do (markers, aborted data, compaction): gaps inside and between segments are
expected of this format. Aborted transactions are read from the transaction indexes (every
segment's, at listing time: a transaction's abort marker may sit in a later segment than
its data).
"""

from __future__ import annotations

import re
import struct
from concurrent.futures import ThreadPoolExecutor

import pyarrow as pa

from compactor.sources.base import ArchiveError, SourceArchive, SourceChunk
from compactor.sources.kafka_batches import Aborted, decode_segment
from keygroups.envelope import CorruptFile
from keygroups.storage import Storage

_BROKER = re.compile(r"^(?:.*/)?(?P<topic>[^/]+)-(?P<part>\d+)/(?P<base>\d{20})\.(?P<kind>log|txnindex)$")
_TXN_ENTRY = struct.Struct(">hqqqq")  # version, producer id, first offset, last offset, last stable offset


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
    """Log segments of a broker's log directory (and, later, of tiered storage)."""

    contiguous = False  # offsets skip at markers, aborted transactions and compaction

    def __init__(self, store: Storage, threads: int = 16) -> None:
        self.store = store
        self.threads = threads
        self._aborted: dict[tuple[str, int], list[Aborted]] | None = None

    def __getstate__(self) -> dict:
        return {"store": self.store, "threads": self.threads, "_aborted": self._aborted}

    def list_chunks(self) -> list[SourceChunk]:
        chunks, txn = [], []
        for o in self.store.list():
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
        with ThreadPoolExecutor(max(1, min(self.threads, len(txn) or 1))) as pool:
            found = list(
                pool.map(lambda t: (t[0], t[1], parse_txnindex(self.store.read(t[2]), self.store.url_for(t[2]))), txn)
            )
        aborted: dict[tuple[str, int], list[Aborted]] = {}
        for topic, part, entries in found:
            aborted.setdefault((topic, part), []).extend(entries)
        self._aborted = aborted
        if not chunks:
            return []
        chunks.sort(key=lambda c: (c.topic, c.partition, c.first_offset))
        return chunks

    def aborted(self, topic: str, partition: int) -> list[Aborted]:
        if self._aborted is None:
            self.list_chunks()
        return (self._aborted or {}).get((topic, partition), [])

    def read(self, chunk: SourceChunk) -> pa.RecordBatch:
        name = self.store.url_for(chunk.key)
        try:
            data = self.store.read(chunk.key)
        except OSError as exc:
            raise ArchiveError(f"{name}: {exc}") from None
        return decode_segment(
            data,
            chunk.partition,
            name=name,
            aborted=self.aborted(chunk.topic, chunk.partition),
            from_offset=chunk.first_offset,
        )

"""Appends check the history they continue.

An append reads the source from each partition's hand-off on and trusts that everything
below it is what the archive already holds. A source whose chunks were rewritten (a
re-export, a restore from another cluster, offsets shifted by a replayed connector) would
otherwise be appended with exit 0 and replay some records twice, or skip some. So every
version keeps, per partition, a fingerprint of the last record it archived (its offset,
timestamp and a digest of key, value and headers: `Manifest.last_records`), and an append
first reads that record from the source and refuses when it differs or is missing.

The fingerprint costs the compaction nothing extra to take: the statistics pass digests the
last record of every stretch (records whose running maximum stays in one slice), and a
partition's last published record is always the last of a stretch (slicing.plan_slices).
"""

from __future__ import annotations

import hashlib
import io
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import fastavro
import pyarrow as pa
import pyarrow.compute as pc

from compactor.errors import HistoryChanged
from compactor.execution import Execution, Rows
from compactor.slicing import SlicePlan
from compactor.sources import SourceArchive, SourceChunk
from keygroups import compacted, envelope
from keygroups.manifest import LastRecord

log = logging.getLogger("keyfill.compact")


def _hash_framed(h: hashlib._Hash, data: bytes | None) -> None:
    if data is None:
        h.update(b"\x00")
    else:
        h.update(b"\x01" + len(data).to_bytes(8, "big") + data)


def record_digest(key: bytes | None, value: bytes | None, headers: list[tuple[str, bytes | None]]) -> str:
    """32 hex digits of the SHA-256 of a record's key, value and headers, each length-framed
    (so no two records share a byte string)."""
    h = hashlib.sha256()
    _hash_framed(h, key)
    _hash_framed(h, value)
    h.update(len(headers).to_bytes(8, "big"))
    for k, v in headers:
        _hash_framed(h, k.encode())
        _hash_framed(h, v)
    return h.hexdigest()[:32]


def batch_digests(batch: pa.RecordBatch, rows: list[int]) -> list[str]:
    """The digests of these rows of an envelope batch (ARROW_SCHEMA, or ENCODED_SCHEMA: its
    records' encodings are decoded, few as the rows are)."""
    picked: list[Any]
    if "record" in batch.schema.names:
        picked = [
            fastavro.schemaless_reader(io.BytesIO(b), envelope.PARSED_SCHEMA, None)
            for b in batch.column("record").take(pa.array(rows, pa.int64())).to_pylist()
        ]
    else:
        picked = batch.select(["key", "value", "headers"]).take(pa.array(rows, pa.int64())).to_pylist()
    return [record_digest(r["key"], r["value"], [(h["key"], h["value"]) for h in r["headers"] or []]) for r in picked]


def last_records(plan: SlicePlan, previous: dict[int, LastRecord] | None = None) -> dict[int, LastRecord]:
    """Per partition, the fingerprint of the last record the new version holds: this
    compaction's last published record, or the previous version's."""
    out = dict(previous or {})
    for p, last in plan.last_stretches.items():
        if last.last_digest is not None and last.last_timestamp is not None:
            out[p] = LastRecord(last.last_offset, last.last_timestamp, last.last_digest)
    return dict(sorted(out.items()))


@dataclass(frozen=True)
class Expected:
    partition: int
    offset: int
    timestamp: int
    digest: str
    chunk: int | None  # index into the listed chunks of the one that should hold it


def expected_records(chunks: list[SourceChunk], manifest: compacted.Manifest) -> list[Expected]:
    """Where the source should hold each partition's last archived record: the last chunk of
    the partition starting at or before its offset."""
    by_partition: dict[int, list[int]] = {}
    for i, c in enumerate(chunks):
        by_partition.setdefault(c.partition, []).append(i)
    out = []
    for p, f in sorted(manifest.last_records.items()):
        before = [i for i in by_partition.get(p, []) if chunks[i].first_offset <= f.offset]
        holder = max(before, key=lambda i: chunks[i].first_offset) if before else None
        out.append(Expected(p, f.offset, f.timestamp, f.digest, holder))
    return out


def _found_task(
    source: SourceArchive, chunks: list[SourceChunk]
) -> Callable[[tuple[int, int]], tuple[int, int | None, str | None]]:
    def task(item: tuple[int, int]) -> tuple[int, int | None, str | None]:
        idx, offset = item
        batch = source.read(chunks[idx])
        at = pc.index(batch.column("offset"), offset).as_py()
        if at < 0:
            return idx, None, None
        ts = batch.column("timestamp").cast(pa.int64())[at].as_py()
        return idx, ts, batch_digests(batch, [at])[0]

    return task


def check_history(
    execution: Execution[Rows], source: SourceArchive, chunks: list[SourceChunk], manifest: compacted.Manifest
) -> None:
    """Refuse an append whose source no longer holds, at each partition's last archived
    offset, the record the archive holds there. `chunks`: the topic's chunks as listed (not
    only those the append reads: the record may lie in the chunk before the hand-off)."""
    wanted = expected_records(chunks, manifest)
    if not manifest.last_records:
        log.warning(
            "version %d records no fingerprint of its last records (written by an older keyfill): this append cannot "
            "check that the source below the hand-off is unchanged",
            manifest.version,
        )
        return
    items = [(e.chunk, e.offset) for e in wanted if e.chunk is not None]
    rows = execution.each("history check", _found_task(source, chunks), items)
    found = {idx: (ts, digest) for idx, ts, digest in rows}
    handoff = manifest.handoff
    for e in wanted:
        if e.chunk is None:
            starts = [c.first_offset for c in chunks if c.partition == e.partition]
            if starts and min(starts) == handoff.get(e.partition):
                log.warning(
                    "partition %d: the source starts at the hand-off (%d), the archived records below it are gone "
                    "from the source (retention): its history cannot be checked",
                    e.partition,
                    min(starts),
                )
                continue
            raise HistoryChanged(
                f"partition {e.partition}: the source holds no chunk with offset {e.offset}, the last record version "
                f"{manifest.version} archived; an append continues the same history (compact the source again with "
                "--overwrite if it was replaced)"
            )
        ts, digest = found[e.chunk]
        url = source.store.url_for(chunks[e.chunk].key)
        if digest is None:
            raise HistoryChanged(
                f"{url}: holds no record at offset {e.offset} of partition {e.partition}, the last record version "
                f"{manifest.version} archived; the source below the hand-off changed (compact it again with "
                "--overwrite if it was replaced)"
            )
        if (ts, digest) != (e.timestamp, e.digest):
            raise HistoryChanged(
                f"{url}: the record at offset {e.offset} of partition {e.partition} differs from the one version "
                f"{manifest.version} archived there (timestamp {ts} vs {e.timestamp}, or its key, value or headers); "
                "the source below the hand-off was rewritten, so an append would deliver records twice or lose some "
                "(compact it again with --overwrite if it was replaced)"
            )

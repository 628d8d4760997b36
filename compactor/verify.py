"""`keyfill verify SRC DEST`: an audit that proves compaction lost, duplicated and
reordered nothing.

Checks, each reported by name:
- manifest: present, of this format version, totals consistent with the index;
- checksums: every segment file's size, and every piece's byte range, CRC-32C and record
  count, match the piece index; the pieces of a file tile it after its header;
- exactly once: per partition, the compacted records equal the source records below
  the hand-off offset as a multiset (count and the sum of 64-bit record fingerprints) and their offsets equal the
  source's offsets (no gap, no overlap, no duplicate);
- key order: in every segment file each key's records (null keys: per partition) are in
  offset order, and every key lives in exactly the group the assignment gives it;
- slice bounds: every record of slice s lies inside the slice's offset range for its
  partition, ranges of successive slices follow each other, and running-maximum
  timestamps fall inside [start, end) of their slice;
- hand-off: the manifest's hand-off offset per partition is the source's first record
  whose running-maximum slice is not published (sealing, `compactor.slicing`), or its
  last offset + 1.

A failed check says the archive is wrong (a file it names is missing, damaged or holds the
wrong records). A read that fails for any other reason (a store that refuses or does not
answer) says nothing of the archive: it ends the audit with that error, naming the request,
so `keyfill verify` exits 2 instead of reporting checks it could not make as failed.

The same audit runs on Spark for archives too large for one process: `compactor.verify_spark`.
"""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa

from compactor.sources import SourceArchive, SourceChunk
from compactor.verify_file import FileChecker
from keygroups import compacted, envelope
from keygroups.compacted import Piece, SliceMeta
from keygroups.piece_index import PieceIndex
from keygroups.storage import Storage

CHECKS = ("manifest", "checksums", "exactly_once", "key_order", "slice_bounds", "handoff")
MAX_REPORTED = 20  # violations listed per check; the count is always exact


@dataclass
class VerifyReport:
    source: str
    dest: str
    records: int = 0
    files: int = 0
    violations: dict[str, list[str]] = field(default_factory=lambda: {c: [] for c in CHECKS})
    counts: dict[str, int] = field(default_factory=lambda: {c: 0 for c in CHECKS})
    not_run: list[str] = field(default_factory=list)  # checks that could not run: never "ok"

    @property
    def ok(self) -> bool:
        return not any(self.counts.values()) and not self.not_run

    def fail(self, check: str, message: str) -> None:
        self.counts[check] += 1
        if len(self.violations[check]) < MAX_REPORTED:
            self.violations[check].append(message)

    def to_json(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "source": self.source,
            "dest": self.dest,
            "records": self.records,
            "files": self.files,
            "violations": self.violations,
            "counts": self.counts,
            "not_run": self.not_run,
        }


@dataclass
class _PartitionDigest:
    offsets: list[np.ndarray] = field(default_factory=list)
    tags: list[np.ndarray] = field(default_factory=list)  # source: timestamps; archive: slice start
    fps: list[np.ndarray] = field(default_factory=list)

    def add(self, offsets: np.ndarray, tags: np.ndarray, fps: np.ndarray) -> None:
        self.offsets.append(offsets)
        self.tags.append(tags)
        self.fps.append(fps)

    def by_offset(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Offsets, tags and record fingerprints, in offset order."""
        if not self.offsets:
            return np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0, np.uint64)
        o, t, f = np.concatenate(self.offsets), np.concatenate(self.tags), np.concatenate(self.fps)
        order = np.argsort(o, kind="stable")
        return o[order], t[order], f[order]


def _sum(fps: np.ndarray) -> int:
    return int(fps.sum(dtype=np.uint64))


def expected_handoff(offsets: np.ndarray, ts: np.ndarray, manifest: compacted.Manifest) -> int:
    """A partition's first offset whose running-maximum slice is not published (sealing,
    compactor/slicing.py), or the offset after its last: where its hand-off must be.
    `offsets`, `ts`: the partition's whole source, in offset order."""
    if not len(offsets):
        return 0
    slices = np.maximum.accumulate(ts) // manifest.slice_duration_ms - manifest.base
    later = np.flatnonzero(slices >= manifest.slices)
    return int(offsets[later[0]]) if later.size else int(offsets[-1]) + 1


def _digest(batches: list[pa.RecordBatch], tags: list[np.ndarray] | None = None) -> dict[int, _PartitionDigest]:
    """Per partition: offsets, fingerprints and a tag per record (the record's timestamp,
    or the start of the slice it was found in when `tags` gives them)."""
    out: dict[int, _PartitionDigest] = {}
    for i, b in enumerate(batches):
        parts = b.column("partition").to_numpy()
        offsets = b.column("offset").to_numpy()
        if tags is None:
            tag = b.column("timestamp").cast(pa.int64()).to_numpy()
        else:
            tag = tags[i]
        fps = envelope.record_fingerprints(b)
        for p in np.unique(parts).tolist():
            m = parts == p
            out.setdefault(p, _PartitionDigest()).add(offsets[m], tag[m], fps[m])
    return out


@dataclass
class AuditPlan:
    manifest: compacted.Manifest
    chunks: list[SourceChunk]
    metas: list[SliceMeta]
    files: list[tuple[str, list[Piece]]]  # segment file -> its pieces, in order
    ranges: dict[int, list[compacted.PartitionRange]]


def plan_audit(source: SourceArchive, dest: Storage) -> tuple[VerifyReport, AuditPlan | None]:
    """A fresh report and what to audit: manifest, source chunks, the index, segment files;
    no plan when the manifest or the index is missing or unreadable (reported)."""
    report = VerifyReport(source=source.url, dest=dest.url)
    try:
        manifest = compacted.load_manifest(dest)
        metas = PieceIndex.of(dest, manifest).metas(0, manifest.slices)
    except compacted.FormatError as exc:
        report.fail("manifest", str(exc))
        report.not_run = [c for c in CHECKS if c != "manifest"]  # nothing to check them against
        return report, None
    chunks = [c for c in source.list_chunks() if c.topic == manifest.topic]
    by_file: dict[str, list[Piece]] = {}
    for m in metas:
        for p in m.pieces:
            by_file.setdefault(p.file, []).append(p)
    files = sorted((k, sorted(v, key=lambda p: p.offset)) for k, v in by_file.items())
    report.files = len(files)
    return report, AuditPlan(manifest, chunks, metas, files, {m.slice: m.partitions for m in metas})


@contextmanager
def _pool(threads: int) -> Iterator[ThreadPoolExecutor]:
    """Threads for the audit's reads; a read that fails (a frozen store: after its bound)
    ends the audit without starting the reads still queued, each of which would wait as long."""
    pool = ThreadPoolExecutor(max_workers=threads)
    try:
        yield pool
    finally:
        pool.shutdown(cancel_futures=True)


def verify(source: SourceArchive, dest: Storage, *, threads: int = 8, progress: bool = False) -> VerifyReport:
    from tqdm import tqdm

    report, plan = plan_audit(source, dest)
    if plan is None:
        return report
    manifest, chunks, metas, files = plan.manifest, plan.chunks, plan.metas, plan.files

    # Source side: the reference multiset, partition by partition.
    with _pool(threads) as pool:
        src_batches = list(
            tqdm(
                pool.map(source.read, chunks),
                total=len(chunks),
                desc="verify: source",
                unit="chunk",
                disable=not progress,
            )
        )
    src = _digest(src_batches)
    del src_batches

    # Compacted side.
    checker = FileChecker(dest, manifest)

    def check(file: tuple[str, list[Piece]]) -> tuple[pa.RecordBatch, np.ndarray, list[tuple[str, str]]]:
        return checker(*file, plan.ranges)

    out_batches, out_slices = [], []
    with _pool(threads) as pool:
        checked = tqdm(
            pool.map(check, files),
            total=len(files),
            desc="verify: compacted",
            unit="file",
            disable=not progress,
        )
        for batch, starts, problems in checked:
            out_batches.append(batch)
            out_slices.append(starts)
            for name, message in problems:
                report.fail(name, message)
    dst = _digest(out_batches, out_slices)
    report.records = sum(b.num_rows for b in out_batches)
    del out_batches

    # exactly once, partition by partition: the source below its hand-off
    expected: dict[int, int] = {}
    made_late = 0
    for p in sorted(set(src) | set(dst)):
        ao, ts, afp = src.get(p, _PartitionDigest()).by_offset()
        expected[p] = expected_handoff(ao, ts, manifest)
        below = ao < manifest.handoff.get(str(p), expected[p])
        ao, ts, afp = ao[below], ts[below], afp[below]
        bo, start, bfp = dst.get(p, _PartitionDigest()).by_offset()
        made_late += partition_checks(report, p, manifest, (ao, ts, afp), (bo, start, bfp))

    late_check(report, manifest, made_late)
    metadata_checks(report, manifest, metas)
    handoff_checks(report, manifest, {p: o for p, o in expected.items() if p in src})
    return report


def partition_checks(
    report: VerifyReport,
    p: int,
    manifest: compacted.Manifest,
    source: tuple[np.ndarray, np.ndarray, np.ndarray],
    archive: tuple[np.ndarray, np.ndarray, np.ndarray],
) -> int:
    """One partition: the source's records below the hand-off (offsets, timestamps,
    fingerprints) against the archive's (offsets, slice starts, fingerprints), in offset
    order. Returns how many records sit after their own running maximum's slice (made late)."""
    ao, ts, afp = source
    bo, start, bfp = archive
    if len(ao) != len(bo):
        report.fail("exactly_once", f"partition {p}: source has {len(ao)} records, archive {len(bo)}")
    elif not np.array_equal(ao, bo):
        dup = np.flatnonzero(np.diff(bo) == 0)
        diff = np.flatnonzero(ao != bo)[0]
        extra = f"; offset {bo[dup[0]]} twice" if dup.size else ""
        report.fail("exactly_once", f"partition {p}: offsets differ first at source offset {ao[diff]}{extra}")
    elif _sum(afp) != _sum(bfp):
        report.fail("exactly_once", f"partition {p}: same offsets but record contents differ")
    else:  # each record sits in the slice its partition's running maximum timestamp names, or later: made late
        d = manifest.slice_duration_ms
        own = np.maximum.accumulate(ts) // d * d
        wrong = np.flatnonzero(own > start)
        if wrong.size:
            report.fail(
                "slice_bounds",
                f"partition {p}: offset {ao[wrong[0]]} is in the slice starting at "
                f"{start[wrong[0]]}, before the slice of its running maximum timestamp ({own[wrong[0]]})",
            )
        return int((own < start).sum())
    return 0


def late_check(report: VerifyReport, manifest: compacted.Manifest, made_late: int) -> None:
    """Records placed after their own slice: only an append places them (records of idle or
    new partitions, --idle-after), and it counts every one in the manifest."""
    counted = manifest.totals.get("made_late", 0)
    if made_late != counted:
        report.fail(
            "slice_bounds",
            f"{made_late} records sit in a slice after their running maximum timestamp's; the manifest counts "
            f"{counted} made late by appends (--idle-after)",
        )


def metadata_checks(report: VerifyReport, manifest: compacted.Manifest, metas: list[SliceMeta]) -> None:
    """Slices one duration long, where the manifest puts them, whose partition ranges follow
    each other; per-slice and manifest totals match the pieces."""
    last: dict[int, int] = {}
    for m in metas:
        lo, hi = m.start_ms, m.end_ms
        if (lo, hi) != manifest.bounds(m.slice):
            report.fail(
                "slice_bounds", f"slice {m.slice}: bounds {lo}..{hi}, the manifest says {manifest.bounds(m.slice)}"
            )
        if m.records != sum(p.records for p in m.pieces) or m.records != sum(r.records for r in m.partitions):
            report.fail("manifest", f"slice {m.slice}: {m.records} records in the slice index, not its pieces' sum")
        for r in m.partitions:
            if r.first_offset <= last.get(r.partition, -1):
                report.fail(
                    "slice_bounds",
                    f"slice {m.slice}: partition {r.partition} starts at {r.first_offset}, "
                    f"not after the previous slice's {last[r.partition]}",
                )
            last[r.partition] = r.last_offset
    if report.records != manifest.totals["records"]:
        report.fail("manifest", f"files hold {report.records} records, manifest says {manifest.totals['records']}")


def handoff_checks(report: VerifyReport, manifest: compacted.Manifest, expected: dict[int, int]) -> None:
    """`expected`: per source partition, its first record not in a published slice (or the
    offset after its last record)."""
    for p, want in sorted(expected.items()):
        got = manifest.handoff.get(str(p))
        if got != want:
            report.fail(
                "handoff",
                f"partition {p}: manifest hand-off offset {got}, the source's first unpublished offset is {want}",
            )

"""`keyfill verify SRC DEST`: an audit that proves compaction lost, duplicated and
reordered nothing.

Checks, each reported by name:
- manifest: present, of this format version, totals consistent with the index;
- checksums: every segment file's size, and every piece's byte range, CRC-32C and record
  count, match the piece index; the pieces of a file tile it after its header;
- exactly once: per partition, record by record in offset order, every source record below
  the hand-off offset is in the archive once, with the same 64-bit fingerprint, and the
  archive holds nothing else (no gap, no extra, no duplicate);
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

One audit, run by an execution (`compactor.execution`): `verify` in this process (several reads
at once), `compactor.verify.spark` on Spark for archives too large for one process. Both run the
same tasks: each file checked on its own (`compactor.verify.file`), the records compared with
the source's partition by partition (`compactor.verify.records`), and the manifest and index
checked here; a damaged archive gets the same report from either.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

import compactor.verify.records as verify_records
from compactor.execution import Execution, InProcess, Rows
from compactor.sources import SourceArchive, SourceChunk
from compactor.verify.file import FileChecker
from compactor.verify.records import MAX_REPORTED, RECORD_COLUMNS, Read
from keygroups import compacted
from keygroups.compacted import Piece, SliceMeta
from keygroups.piece_index import PieceIndex
from keygroups.storage import Storage

CHECKS = ("manifest", "checksums", "exactly_once", "key_order", "slice_bounds", "handoff")
__all__ = ["CHECKS", "MAX_REPORTED", "VerifyReport", "audit", "plan_audit", "verify"]


log = logging.getLogger("keyfill.verify")


@dataclass
class VerifyReport:
    source: str
    dest: str
    records: int = 0
    files: int = 0
    violations: dict[str, list[str]] = field(default_factory=lambda: {c: [] for c in CHECKS})
    counts: dict[str, int] = field(default_factory=lambda: {c: 0 for c in CHECKS})
    skipped: list[str] = field(default_factory=list)  # checks that could not run: never "ok"

    @property
    def ok(self) -> bool:
        return not any(self.counts.values()) and not self.skipped

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
            "skipped": self.skipped,
        }


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
        report.skipped = [c for c in CHECKS if c != "manifest"]  # nothing to check them against
        return report, None
    chunks = [c for c in source.list_chunks() if c.topic == manifest.topic]
    by_file: dict[str, list[Piece]] = {}
    for m in metas:
        for p in m.pieces:
            by_file.setdefault(p.file, []).append(p)
    files = sorted((k, sorted(v, key=lambda p: p.offset)) for k, v in by_file.items())
    report.files = len(files)
    return report, AuditPlan(manifest, chunks, metas, files, {m.slice: m.partitions for m in metas})


def verify(source: SourceArchive, dest: Storage, *, threads: int = 8, progress: bool = False) -> VerifyReport:
    """The audit in this process: `threads` reads at once, every record's audit row in memory."""
    return audit(source, dest, InProcess(threads, "verify" if progress else None))


def audit(source: SourceArchive, dest: Storage, execution: Execution[Rows]) -> VerifyReport:
    """The audit, its tasks run by `execution`: the source's chunks read and the archive's
    files checked (a task each), then source and archive records compared partition by
    partition (`compactor.verify.records`), then the manifest and the index checked."""
    report, plan = plan_audit(source, dest)
    if plan is None:
        return report
    manifest = plan.manifest
    checker = FileChecker(dest, manifest)
    read = verify_records.read_task(source, plan.chunks, checker, plan.files, plan.ranges)
    rows = execution.map(verify_records.inputs(len(plan.chunks), len(plan.files)), read, verify_records.READ_ROWS)
    with execution.persist(rows, serialized=True) as rows:
        problems = execution.where(rows, "kind", [Read.PROBLEM], ["input", "check", "message"])
        for r in execution.collect("file checks", problems).sort_by("input").to_pylist():
            report.fail(r["check"], r["message"])
        log.info(
            "%d source chunks read and %d archive files checked (%d problems): comparing their records",
            len(plan.chunks),
            len(plan.files),
            sum(report.counts.values()),
        )
        compared = execution.scan(
            "records",
            execution.where(rows, "kind", [Read.SOURCE, Read.ARCHIVED], RECORD_COLUMNS),
            verify_records.SCAN_KEY,
            verify_records.SCAN_ORDER,
            verify_records.compare_task(manifest),
            verify_records.FOUND_ROWS,
        )
    found = verify_records.found(compared)
    for check, messages in found.violations.items():
        for message in messages:
            report.fail(check, message)
        report.counts[check] += found.counts[check] - len(messages)
    report.records = found.records
    late_check(report, manifest, found.made_late)
    metadata_checks(report, manifest, plan.metas)
    handoff_checks(report, manifest, found.handoffs)
    return report


def late_check(report: VerifyReport, manifest: compacted.Manifest, made_late: int) -> None:
    """Records placed after their own slice: only an append places them (records of idle or
    new partitions, --idle-after), and it counts every one in the manifest."""
    counted = manifest.totals.made_late
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
    if report.records != manifest.totals.records:
        report.fail("manifest", f"files hold {report.records} records, manifest says {manifest.totals.records}")


def handoff_checks(report: VerifyReport, manifest: compacted.Manifest, expected: dict[int, int]) -> None:
    """`expected`: per source partition, its first record not in a published slice (or the
    offset after its last record)."""
    for p, want in sorted(expected.items()):
        got = manifest.handoff.get(p)
        if got != want:
            report.fail(
                "handoff",
                f"partition {p}: manifest hand-off offset {got}, the source's first unpublished offset is {want}",
            )
